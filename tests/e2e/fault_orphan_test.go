package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/tsproxy/tsproxy/tests/backend"
)

// TestStageOrphanedStagingTable: FerretDB v1.24 on PostgreSQL creates a
// collection's table and its catalog entry in two statements; killed
// between them, it leaves a table that it no longer knows of and cannot
// create again, and every insert of the rule failed from then on
// (TestFaultUpstreamRestart met it in CI: "relation ... already exists
// (SQLSTATE 42P07)" on every insert after the restart). The test makes
// that state by hand: it deletes the catalog entry of the proxy's open
// staging collection and its table's index, and restarts FerretDB. The proxy must then move its
// staging to collections of a new name: the next insert is acknowledged
// at its first attempt, and every event sent after it is found once.
func TestStageOrphanedStagingTable(t *testing.T) {
	if env.kind != backend.KindPostgreSQL {
		t.Skip("FerretDB on PostgreSQL only: its collection create is two statements")
	}
	t.Parallel()
	up := ownUpstream(t)
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: fmt.Sprintf(`rules:
  - namespace: %s.readings
    timeField: ts
    metaField: sensorId
    bucket: {span: 1h, maxEvents: 100}
    aggregates: [value]
`, db), upstreamURI: up.URI()})
	ctx := ctxFor(t)
	coll := connect(t, p.URI()).Database(db).Collection("readings")
	base := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)

	// An event staged and merged, then one staged: the proxy has created
	// its next staging collection, which holds that event.
	merged := seriesEvents(1, "merged", base)
	if _, err := coll.InsertMany(ctx, docsOf(merged)); err != nil {
		t.Fatal(err)
	}
	if err := flushAt(p.addr); err != nil {
		t.Fatalf("flush: %v", err)
	}
	orphaned := seriesEvents(1, "orphaned", base.Add(time.Second))
	if _, err := coll.InsertMany(ctx, docsOf(orphaned)); err != nil {
		t.Fatal(err)
	}
	open := stagingNamesAt(t, ctx, up.URI(), db)
	if len(open) != 1 {
		t.Fatalf("staging collections: %v, want the one open", open)
	}

	// FerretDB forgets it, as one killed between the first two statements
	// of its create would: its table stays, without the `_id` index the
	// third makes.
	up.Stop()
	table, err := up.SQL(fmt.Sprintf(`SELECT _jsonb->>'table' FROM "%s"._ferretdb_database_metadata WHERE _jsonb->>'_id' = '%s'`, db, open[0]))
	if table = strings.TrimSpace(table); err != nil || table == "" {
		t.Fatalf("the staging collection's table: %q, %v", table, err)
	}
	if _, err := up.SQL(fmt.Sprintf(`DELETE FROM "%s"._ferretdb_database_metadata WHERE _jsonb->>'_id' = '%s'; `+
		`DO $$ DECLARE i text; BEGIN FOR i IN SELECT indexname FROM pg_indexes WHERE schemaname = '%s' AND tablename = '%s' LOOP `+
		`EXECUTE format('DROP INDEX %%I.%%I', '%s', i); END LOOP; END $$`, db, open[0], db, table, db)); err != nil {
		t.Fatal(err)
	}
	if err := up.Restart(); err != nil {
		t.Fatalf("restart the upstream: %v", err)
	}

	// Every insert after it is acknowledged, each at its first attempt
	// (retryWrites=false: the driver does not retry for it).
	noRetry := connect(t, p.URI()+"?retryWrites=false").Database(db).Collection("readings")
	after := seriesEvents(20, "after", base.Add(time.Minute))
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; i < len(after); i++ {
		_, err := noRetry.InsertOne(ctx, after[i].doc())
		if err == nil {
			continue
		}
		if i == 0 && upstreamNotBack(err) && time.Now().Before(deadline) {
			// The proxy's connection to the restarted upstream: not the
			// orphan, which answers.
			time.Sleep(100 * time.Millisecond)
			i--
			continue
		}
		t.Fatalf("insert %d after the orphaned staging table: %v", i, err)
	}
	if err := flushAt(p.addr); err != nil {
		t.Fatalf("flush: %v", err)
	}
	stored := storedIDsIn(t, ctx, connect(t, up.URI()), db)
	for _, e := range append(merged, after...) {
		if stored[e.id] != 1 {
			t.Errorf("event %s of %s stored %d times, want once", e.id.Hex(), e.sensor, stored[e.id])
		}
	}
	// The event in the orphaned table is FerretDB's loss, made by the
	// test's hand: the proxy cannot read what FerretDB no longer knows.
	if n := stored[orphaned[0].id]; n != 0 {
		t.Errorf("the orphaned table's event stored %d times", n)
	}
	if len(stored) != len(merged)+len(after) {
		t.Errorf("%d events stored, want %d", len(stored), len(merged)+len(after))
	}
}

// upstreamNotBack says whether err is a failure to reach the upstream (a
// connection cut by its restart, or HostUnreachable from the proxy), not
// an answer of the upstream.
func upstreamNotBack(err error) bool {
	return mongo.IsNetworkError(err) || strings.Contains(err.Error(), "HostUnreachable")
}
