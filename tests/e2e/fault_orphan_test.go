package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/tsproxy/tsproxy/proxy"
	"github.com/tsproxy/tsproxy/tests/backend"
)

// TestStageOrphanedStagingTable: FerretDB v1.24 creates a collection's
// table and its catalog entry in two statements, on PostgreSQL and on
// SQLite alike; killed between them, it leaves a table that it no longer
// knows of and cannot create again, and every insert of the rule failed
// from then on (TestFaultUpstreamRestart met it in CI on PostgreSQL:
// "relation ... already exists (SQLSTATE 42P07)" on every insert after
// the restart). The test makes that state by hand: it deletes the catalog
// entry of the proxy's open staging collection and its table's indexes,
// and restarts FerretDB. The proxy must then move its staging to
// collections of a new name: the next insert is acknowledged at its first
// attempt, and every event sent after it is found once. (The embedded
// upstream is FerretDB in the proxy's process: a crash of the proxy
// leaves the same.)
func TestStageOrphanedStagingTable(t *testing.T) {
	f := newCatalogFixture(t)
	up, db, p, ctx, coll, base := f.up, f.db, f.p, f.ctx, f.coll, f.base

	// An event staged and merged, then one staged: the proxy has created
	// its next staging collection, which holds that event.
	merged := seriesEvents(1, "merged", base)
	f.insertAndFlush(merged)
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
	orphanTable(t, up, db, open[0])
	if err := up.Restart(); err != nil {
		t.Fatalf("restart the upstream: %v", err)
	}

	// Every insert after it is acknowledged, each at its first attempt
	// (retryWrites=false: the driver does not retry for it).
	after := seriesEvents(20, "after", base.Add(time.Minute))
	f.insertEachAtFirstAttempt(after, "after the orphaned staging table")
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

// TestStageGhostRetiredCollection: FerretDB v1.24 on PostgreSQL drops a
// collection with DROP TABLE, then deletes its catalog entry, in two
// statements; killed between them, it leaves an entry whose table is
// gone, which every later command on that name fails on (SQLSTATE 42P01),
// its drop included. A merge drops its retired collection last, once
// its events are in buckets, so a crash of the upstream there leaves a
// retired collection that cannot be read or dropped. The test makes that
// state by hand (a catalog entry of a retired name with no table) and
// restarts FerretDB: inserts, reads and flushes through the proxy must
// go on, every event found once.
func TestStageGhostRetiredCollection(t *testing.T) {
	if env.kind != backend.KindPostgreSQL {
		t.Skip("FerretDB on PostgreSQL only: its collection drop is two statements")
	}
	f := newCatalogFixture(t)
	up, db, p, ctx, coll, base := f.up, f.db, f.p, f.ctx, f.coll, f.base

	merged := seriesEvents(3, "merged", base)
	f.insertAndFlush(merged)
	staged := seriesEvents(3, "staged", base.Add(time.Minute))
	if _, err := coll.InsertMany(ctx, docsOf(staged)); err != nil {
		t.Fatal(err)
	}
	open := stagingNamesAt(t, ctx, up.URI(), db)
	if len(open) != 1 {
		t.Fatalf("staging collections: %v, want the one open", open)
	}

	// The entry of a retired collection whose table is gone, as a merge's
	// drop cut between its two statements leaves it.
	// And a flush request's (a proxy that is not the writer lease's
	// holder asks with one; the holder drops it once stale).
	up.Stop()
	ghost := open[0] + "_m1"
	prefix := open[0][:len("tsproxy_stage_")+13]
	ghostRequest := prefix + "flush_" + bson.NewObjectIDFromTimestamp(time.Now().Add(-time.Hour)).Hex()
	for i, name := range []string{ghost, ghostRequest} {
		ghostEntry(t, up, db, open[0], name, fmt.Sprintf("tsproxy_gone_table_%d", i))
	}
	if err := up.Restart(); err != nil {
		t.Fatalf("restart the upstream: %v", err)
	}
	names := stagingNamesAt(t, ctx, up.URI(), db)
	if !slices.Contains(names, ghost) || !slices.Contains(names, ghostRequest) {
		t.Fatalf("staging collections after the restart: %v, want the ghosts %s and %s among them", names, ghost, ghostRequest)
	}

	noRetry := f.noRetry()
	after := seriesEvents(5, "after", base.Add(2*time.Minute))
	f.insertEachAtFirstAttempt(after, "after the ghost")
	all := slices.Concat(merged, staged, after)
	// Read before any flush: the ghost is still listed, the events of
	// staged and after are staged.
	readAll := func(when string) {
		t.Helper()
		cur, err := noRetry.Find(ctx, bson.D{})
		if err != nil {
			t.Fatalf("find %s: %v", when, err)
		}
		var docs []bson.M
		if err := cur.All(ctx, &docs); err != nil {
			t.Fatalf("find %s: %v", when, err)
		}
		seen := map[bson.ObjectID]int{}
		for _, d := range docs {
			id, _ := d["_id"].(bson.ObjectID)
			seen[id]++
		}
		for _, e := range all {
			if seen[e.id] != 1 {
				t.Errorf("find %s: event %s of %s returned %d times, want once", when, e.id.Hex(), e.sensor, seen[e.id])
			}
		}
		if len(docs) != len(all) {
			t.Errorf("find %s: %d events, want %d", when, len(docs), len(all))
		}
		n, err := noRetry.CountDocuments(ctx, bson.D{})
		if err != nil || n != int64(len(all)) {
			t.Errorf("countDocuments %s: %d, %v; want %d", when, n, err, len(all))
		}
	}
	readAll("with the ghost")
	if err := flushAt(p.addr); err != nil {
		t.Fatalf("flush with the ghost: %v", err)
	}
	readAll("after the flush")
	stored := storedIDsIn(t, ctx, connect(t, up.URI()), db)
	for _, e := range all {
		if stored[e.id] != 1 {
			t.Errorf("event %s of %s stored %d times, want once", e.id.Hex(), e.sensor, stored[e.id])
		}
	}
	if names := stagingNamesAt(t, ctx, up.URI(), db); slices.Contains(names, ghost) {
		t.Errorf("staging collections after the flush: %v, the ghost still among them", names)
	}
	// The background merger sets the request aside too (it looks once a
	// second).
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		names := stagingNamesAt(t, ctx, up.URI(), db)
		if !slices.Contains(names, ghostRequest) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("staging collections 20 s after the flush: %v, the ghost flush request still among them", names)
		}
	}
	// The app drops its collection: FerretDB cannot drop the entry set
	// aside, which holds nothing, and the drop must not fail on it.
	if err := noRetry.Drop(ctx); err != nil {
		t.Fatalf("drop with the ghost set aside: %v", err)
	}
	again := seriesEvents(2, "again", base)
	if _, err := noRetry.InsertMany(ctx, docsOf(again)); err != nil {
		t.Fatalf("insert after the drop: %v", err)
	}
	if n, err := noRetry.CountDocuments(ctx, bson.D{}); err != nil || n != int64(len(again)) {
		t.Errorf("countDocuments after the drop: %d, %v; want %d", n, err, len(again))
	}
}

// TestStageUnrecordedIndex: killed between creating a collection's _id
// index and recording it in its catalog, FerretDB v1.24 on PostgreSQL
// keeps a collection whose index it does not know of. The collection
// works; but FerretDB names the index of the next collection whose table
// name begins alike (every staging collection of a rule) as that one,
// and its create fails on the name (SQLSTATE 42P07) for as long as the
// first collection lives. The test makes that state by hand and then
// inserts into another day, which needs a new staging collection: the
// insert must be acknowledged at its first attempt, and every event found
// once.
func TestStageUnrecordedIndex(t *testing.T) {
	if env.kind != backend.KindPostgreSQL {
		t.Skip("FerretDB on PostgreSQL only: its collection create is several statements")
	}
	f := newCatalogFixture(t)
	up, db, p, ctx, coll, base := f.up, f.db, f.p, f.ctx, f.coll, f.base
	first := seriesEvents(3, "first", base)
	if _, err := coll.InsertMany(ctx, docsOf(first)); err != nil {
		t.Fatal(err)
	}
	open := stagingNamesAt(t, ctx, up.URI(), db)
	if len(open) != 1 {
		t.Fatalf("staging collections: %v, want the one open", open)
	}
	// FerretDB forgets the index, as one killed before the statement
	// that records it would: the index stays, its name free in the
	// catalog.
	up.Stop()
	if _, err := up.SQL(fmt.Sprintf(`UPDATE "%s"._ferretdb_database_metadata SET _jsonb = jsonb_set(jsonb_set(_jsonb, '{indexes}', '[]'), '{$s,p,indexes,i}', '[]') `+
		`WHERE _jsonb->>'_id' = '%s'`, db, open[0])); err != nil {
		t.Fatal(err)
	}
	if err := up.Restart(); err != nil {
		t.Fatalf("restart the upstream: %v", err)
	}
	// The same day: into the collection that lost its index record.
	sameDay := seriesEvents(2, "same day", base.Add(time.Minute))
	// The next day: a new staging collection, whose index FerretDB names
	// as the unrecorded one.
	nextDay := seriesEvents(3, "next day", base.Add(24*time.Hour))
	f.insertEachAtFirstAttempt(slices.Concat(sameDay, nextDay), "after the unrecorded index")
	if err := flushAt(p.addr); err != nil {
		t.Fatalf("flush: %v", err)
	}
	all := slices.Concat(first, sameDay, nextDay)
	stored := storedIDsIn(t, ctx, connect(t, up.URI()), db)
	for _, e := range all {
		if stored[e.id] != 1 {
			t.Errorf("event %s of %s stored %d times, want once", e.id.Hex(), e.sensor, stored[e.id])
		}
	}
	if len(stored) != len(all) {
		t.Errorf("%d events stored, want %d", len(stored), len(all))
	}
}

// catalogFixture is a proxy with one staged rule on an upstream of its
// own, FerretDB on PostgreSQL, whose catalog a test edits by hand.
type catalogFixture struct {
	t    *testing.T
	up   *backend.Upstream
	db   string
	p    *testProxy
	ctx  context.Context
	coll *mongo.Collection
	base time.Time
}

func newCatalogFixture(t *testing.T) *catalogFixture {
	t.Parallel()
	f := &catalogFixture{t: t, up: ownUpstream(t), db: uniqueDB(t), ctx: ctxFor(t), base: time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)}
	f.p = startProxy(t, proxyOptions{yaml: fmt.Sprintf(`rules:
  - namespace: %s.readings
    timeField: ts
    metaField: sensorId
    bucket: {span: 1h, maxEvents: 100}
    aggregates: [value]
`, f.db), upstreamURI: f.up.ProxyURI(), edit: func(o *proxy.Options) {
		// As a proxy running the embedded upstream has it.
		o.IndexIDs, o.DropOrphanedTable = f.up.IndexIDs(), f.up.DropOrphanedTable()
	}})
	f.coll = connect(t, f.p.URI()).Database(f.db).Collection("readings")
	return f
}

// noRetry is the rule's collection on a client that retries nothing: an
// error is the proxy's answer to the first attempt.
func (f *catalogFixture) noRetry() *mongo.Collection {
	return connect(f.t, f.p.URI()+"?retryWrites=false&retryReads=false").Database(f.db).Collection("readings")
}

// insertEachAtFirstAttempt inserts evs one at a time, each acknowledged
// at its first attempt; only the first may wait for the proxy to reach
// the restarted upstream.
func (f *catalogFixture) insertEachAtFirstAttempt(evs []sentEvent, when string) {
	f.t.Helper()
	coll := f.noRetry()
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; i < len(evs); i++ {
		_, err := coll.InsertOne(f.ctx, evs[i].doc())
		if err == nil {
			continue
		}
		if i == 0 && upstreamNotBack(err) && time.Now().Before(deadline) {
			// The proxy's connection to the restarted upstream, not an
			// answer of it.
			time.Sleep(100 * time.Millisecond)
			i--
			continue
		}
		f.t.Fatalf("insert %d (%s) %s: %v", i, evs[i].sensor, when, err)
	}
}

// TestRetentionLostPartition: a partition whose drop by retention was cut
// between FerretDB's two statements (its table gone, its catalog entry
// left) can never be dropped; retention went no further than it, every
// round, so no later partition expired either. The test makes such an
// entry by hand, older than every real partition, and starts a proxy with
// retention: the real expired partitions must go, and reads of the
// recent ones work.
func TestRetentionLostPartition(t *testing.T) {
	if env.kind != backend.KindPostgreSQL {
		t.Skip("FerretDB on PostgreSQL only: its collection drop is two statements")
	}
	t.Parallel()
	up := ownUpstream(t)
	db := uniqueDB(t)
	ctx := ctxFor(t)
	partitions := func() []string {
		t.Helper()
		return partitionNamesIn(t, ctx, connect(t, up.URI()), db)
	}

	now := time.Now().UTC()
	cutoff := now.Add(-60 * 24 * time.Hour)
	p1 := startProxy(t, proxyOptions{yaml: partRule(db, ""), upstreamURI: up.ProxyURI()})
	var docs []any
	recent := 0
	for i := range 300 {
		ts := now.Add(-130*24*time.Hour + time.Duration(i)*10*time.Hour)
		if ts.After(cutoff.Add(24 * time.Hour)) {
			recent++
		}
		docs = append(docs, bson.D{{Key: "ts", Value: ts}, {Key: "sensor", Value: fmt.Sprintf("s-%d", i%3)}, {Key: "value", Value: 1.0}})
	}
	if _, err := connect(t, p1.URI()).Database(db).Collection("readings").InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}
	if err := flushAt(p1.addr); err != nil {
		t.Fatalf("flush: %v", err)
	}
	stopProxy(t, p1)
	before := partitions()
	oldest := now.Add(-130 * 24 * time.Hour)
	var mustGo []string // the real partitions whose month ended before the cutoff
	for m := time.Date(oldest.Year(), oldest.Month(), 1, 0, 0, 0, 0, time.UTC); !m.AddDate(0, 1, 0).After(cutoff); m = m.AddDate(0, 1, 0) {
		mustGo = append(mustGo, "readings.buckets_"+m.Format("2006_01"))
	}
	if len(before) < 4 || len(mustGo) < 2 || before[0] != mustGo[0] {
		t.Fatalf("partitions %v, expired %v: want at least 2 expired and 2 recent", before, mustGo)
	}

	up.Stop()
	lost := "readings.buckets_" + oldest.AddDate(0, -3, 0).Format("2006_01")
	ghostEntry(t, up, db, before[0], lost, "tsproxy_gone_partition")
	if err := up.Restart(); err != nil {
		t.Fatalf("restart the upstream: %v", err)
	}
	if got := partitions(); got[0] != lost {
		t.Fatalf("partitions after the restart: %v, want %s first", got, lost)
	}

	p2 := startProxy(t, proxyOptions{yaml: partRule(db, "    expireAfter: 60d\n    sweepInterval: 200ms\n"), upstreamURI: up.ProxyURI()})
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		left := partitions()
		if !slices.ContainsFunc(mustGo, func(n string) bool { return slices.Contains(left, n) }) {
			t.Logf("partitions left %v (dropped %v)", left, mustGo)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("partitions %v 30 s after retention began, want none of %v", left, mustGo)
		}
	}
	readings := connect(t, p2.URI()).Database(db).Collection("readings")
	n, err := readings.CountDocuments(ctx, bson.D{{Key: "ts", Value: bson.D{{Key: "$gt", Value: cutoff.Add(24 * time.Hour)}}}})
	if err != nil || n != int64(recent) {
		t.Fatalf("recent events through the proxy: %d, %v; want %d", n, err, recent)
	}
	// Reads of every partition reach the lost one too, which holds
	// nothing: they give what the real partitions hold (the range from
	// the first real partition's start reaches none but those). A
	// bucket may expire between two reads: each pair is read until it
	// agrees, 3 times at most.
	real := bson.D{{Key: "ts", Value: bson.D{{Key: "$gte", Value: time.Date(oldest.Year(), oldest.Month(), 1, 0, 0, 0, 0, time.UTC)}}}}
	agree := func(what string, read func(filter bson.D) (int64, error)) {
		t.Helper()
		for try := 0; ; try++ {
			all, err := read(bson.D{})
			if err != nil {
				t.Fatalf("%s of every partition: %v", what, err)
			}
			want, err := read(real)
			if err != nil {
				t.Fatalf("%s of the real partitions: %v", what, err)
			}
			if all == want && all > 0 {
				return
			}
			if try == 2 {
				t.Fatalf("%s of every partition %d, of the real ones %d", what, all, want)
			}
		}
	}
	agree("countDocuments", func(f bson.D) (int64, error) { return readings.CountDocuments(ctx, f) })
	agree("find", func(f bson.D) (int64, error) {
		var docs []bson.M
		cur, err := readings.Find(ctx, f)
		if err == nil {
			err = cur.All(ctx, &docs)
		}
		return int64(len(docs)), err
	})
	agree("distinct", func(f bson.D) (int64, error) {
		var vals []string
		err := readings.Distinct(ctx, "sensor", f).Decode(&vals)
		return int64(len(vals)), err
	})
	if _, err := readings.EstimatedDocumentCount(ctx); err != nil {
		t.Fatalf("estimatedDocumentCount: %v", err)
	}
}

// orphanTable deletes the catalog entry of collection coll of db and its
// table's indexes, in a stopped upstream's storage.
func orphanTable(t *testing.T, up *backend.Upstream, db, coll string) {
	t.Helper()
	if up.Kind == backend.KindPostgreSQL {
		table, err := up.SQL(fmt.Sprintf(`SELECT _jsonb->>'table' FROM "%s"._ferretdb_database_metadata WHERE _jsonb->>'_id' = '%s'`, db, coll))
		if table = strings.TrimSpace(table); err != nil || table == "" {
			t.Fatalf("the table of %s: %q, %v", coll, table, err)
		}
		if _, err := up.SQL(fmt.Sprintf(`DELETE FROM "%s"._ferretdb_database_metadata WHERE _jsonb->>'_id' = '%s'; `+
			`DO $$ DECLARE i text; BEGIN FOR i IN SELECT indexname FROM pg_indexes WHERE schemaname = '%s' AND tablename = '%s' LOOP `+
			`EXECUTE format('DROP INDEX %%I.%%I', '%s', i); END LOOP; END $$`, db, coll, db, table, db)); err != nil {
			t.Fatal(err)
		}
		return
	}
	tables, err := up.SQLite(db, fmt.Sprintf(`SELECT table_name FROM _ferretdb_collections WHERE name = '%s'`, coll))
	if err != nil || len(tables) != 1 {
		t.Fatalf("the table of %s: %v, %v", coll, tables, err)
	}
	indexes, err := up.SQLite(db, fmt.Sprintf(`SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = '%s' AND sql IS NOT NULL`, tables[0]))
	if err != nil {
		t.Fatal(err)
	}
	stmts := []string{fmt.Sprintf(`DELETE FROM _ferretdb_collections WHERE name = '%s'`, coll)}
	for _, i := range indexes {
		stmts = append(stmts, fmt.Sprintf(`DROP INDEX "%s"`, i))
	}
	if _, err := up.SQLite(db, "", stmts...); err != nil {
		t.Fatal(err)
	}
}

// TestMergeOrphanedBucketTable: a rule's bucket collection whose create a
// crash cut after its table (FerretDB on SQLite inside the proxy's
// process, killed with it) cannot be created again, and every later merge
// of the rule failed, reads with it. The embedded upstream's proxy drops
// such a table, which FerretDB's catalog does not name, and sends the
// write again. The test makes that state by hand; the next merge must
// succeed and every event sent after it be found once. (Other upstreams
// offer the proxy no way to drop a table: there it is a gap.)
func TestMergeOrphanedBucketTable(t *testing.T) {
	if env.kind != backend.KindEmbedded {
		t.Skip("the embedded upstream only: the proxy reaches no other's storage")
	}
	f := newCatalogFixture(t)
	up, db, p, ctx, base := f.up, f.db, f.p, f.ctx, f.base
	f.insertAndFlush(seriesEvents(3, "lost", base))
	// The bucket collection's entry goes: its table stays, as a create cut
	// after CREATE TABLE leaves it (with the test's 3 events in it, which
	// a real cut create would not hold).
	up.Stop()
	orphanTable(t, up, db, "readings.buckets")
	if err := up.Restart(); err != nil {
		t.Fatalf("restart the upstream: %v", err)
	}
	after := seriesEvents(5, "after", base.Add(time.Hour))
	f.insertEachAtFirstAttempt(after, "after the orphaned bucket table")
	if err := flushAt(p.addr); err != nil {
		t.Fatalf("flush after the orphaned bucket table: %v", err)
	}
	stored := storedIDsIn(t, ctx, connect(t, up.URI()), db)
	for _, e := range after {
		if stored[e.id] != 1 {
			t.Errorf("event %s of %s stored %d times, want once", e.id.Hex(), e.sensor, stored[e.id])
		}
	}
	if len(stored) != len(after) {
		t.Errorf("%d events stored, want %d", len(stored), len(after))
	}
	n, err := f.noRetry().CountDocuments(ctx, bson.D{})
	if err != nil || n != int64(len(after)) {
		t.Errorf("countDocuments through the proxy: %d, %v; want %d", n, err, len(after))
	}
}

// insertAndFlush inserts evs and merges everything staged.
func (f *catalogFixture) insertAndFlush(evs []sentEvent) {
	f.t.Helper()
	if _, err := f.coll.InsertMany(f.ctx, docsOf(evs)); err != nil {
		f.t.Fatal(err)
	}
	if err := flushAt(f.p.addr); err != nil {
		f.t.Fatalf("flush: %v", err)
	}
}

// ghostEntry adds to a stopped PostgreSQL upstream's catalog an entry for
// collection name of db whose table (named table) does not exist, as a
// drop cut between its two statements leaves it: a copy of collection
// from's entry with another name and table.
func ghostEntry(t *testing.T, up *backend.Upstream, db, from, name, table string) {
	t.Helper()
	if _, err := up.SQL(fmt.Sprintf(`INSERT INTO "%[1]s"._ferretdb_database_metadata (_jsonb) `+
		`SELECT jsonb_set(jsonb_set(_jsonb, '{_id}', to_jsonb('%[3]s'::text)), '{table}', to_jsonb('%[4]s'::text)) `+
		`FROM "%[1]s"._ferretdb_database_metadata WHERE _jsonb->>'_id' = '%[2]s'`, db, from, name, table)); err != nil {
		t.Fatal(err)
	}
}
