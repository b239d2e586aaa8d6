package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/tsproxy/tsproxy/wire"
)

// bucketWrite matches the proxy's rewritten writes (insert or update of a
// bucket collection, insert into a staging collection) among
// client→upstream frames.
func bucketWrite(frame []byte) bool {
	var m wire.Msg
	if err := m.Decode(frame); err != nil {
		return false
	}
	name := m.CommandName()
	if name != "insert" && name != "update" {
		return false
	}
	coll, _ := bson.Raw(m.Body).Lookup(name).StringValueOK()
	return strings.HasSuffix(coll, ".buckets") || (name == "insert" && strings.HasPrefix(coll, "tsproxy_stage_") && !strings.HasSuffix(coll, "_txns") && !strings.HasSuffix(coll, "_ids"))
}

// storedIDs counts, per event _id, how often the buckets of db hold it.
func storedIDs(t *testing.T, ctx context.Context, db string) map[bson.ObjectID]int {
	t.Helper()
	return storedIDsIn(t, ctx, direct(t), db)
}

// storedIDsIn is storedIDs on the upstream c (a test's own).
func storedIDsIn(t *testing.T, ctx context.Context, c *mongo.Client, db string) map[bson.ObjectID]int {
	t.Helper()
	got := map[bson.ObjectID]int{}
	for _, b := range readBucketsIn(t, ctx, c, db) {
		if int(b.Count) != len(b.Events) {
			t.Fatalf("bucket %v: count %d but %d events (a half-applied write)", b.ID, b.Count, len(b.Events))
		}
		for _, ev := range b.Events {
			id, _ := dmap(ev)["_id"].(bson.ObjectID)
			got[id]++
		}
	}
	return got
}

// seriesEvents makes n events of one series, one per second from base.
func seriesEvents(n int, sensor string, base time.Time) []sentEvent {
	out := make([]sentEvent, n)
	for i := range out {
		out[i] = sentEvent{id: bson.NewObjectID(), sensor: sensor, ts: base.Add(time.Duration(i) * time.Second), value: float64(i)}
	}
	return out
}

func docsOf(evs []sentEvent) []any {
	docs := make([]any, len(evs))
	for i, e := range evs {
		docs[i] = e.doc()
	}
	return docs
}

// TestFaultReplyLostRetry: the upstream connection is
// cut after a rewritten bucket write reached the upstream and before its
// reply came back. FerretDB ignores lsid/txnNumber, so it cannot recognise
// the driver's retry; whatever the driver is told, no event may be stored
// twice, and an acknowledged insert must be stored whole.
func TestFaultReplyLostRetry(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		n     int    // events of the insert whose reply is lost
		retry string // the driver's retryWrites
	}{
		{"mixed", -1, "true"},              // a complete bucket of s1 and an upsert of s2: only the first command lands
		{"pushUpsert", 20, "true"},         // below the insert threshold: $push upsert into the open bucket
		{"completeBucket", 150, "true"},    // at or over it: insert of a complete bucket
		{"pushUpsertNoRetry", 20, "false"}, // the app sees the failure itself
		{"completeNoRetry", 150, "false"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := uniqueDB(t)
			r := newRelay(t, upstreamAddr(t))
			p := startProxy(t, proxyOptions{yaml: readingsRule(db, 1000), upstreamURI: r.URI()})
			ctx := ctxFor(t)
			coll := connect(t, p.URI(), "retryWrites="+tc.retry).Database(db).Collection("readings")
			base := time.Date(2026, 8, 1, 5, 0, 0, 0, time.UTC)
			warm := seriesEvents(10, "s1", base)
			if _, err := coll.InsertMany(ctx, docsOf(warm)); err != nil {
				t.Fatal(err)
			}
			var batch []sentEvent
			if tc.n > 0 {
				batch = seriesEvents(tc.n, "s1", base.Add(time.Minute))
			} else {
				batch = append(seriesEvents(150, "s1", base.Add(time.Minute)), seriesEvents(20, "s2", base)...)
				tc.n = len(batch)
			}
			r.CutReplyOf(1, bucketWrite)
			start := time.Now()
			_, err := coll.InsertMany(ctx, docsOf(batch))
			took := time.Since(start)
			if r.cuts.Load() != 1 {
				t.Fatalf("the relay cut %d replies, want 1 (err %v)", r.cuts.Load(), err)
			}
			got := storedIDs(t, ctx, db)
			for _, e := range warm {
				if got[e.id] != 1 {
					t.Fatalf("acknowledged warm-up event %v stored %d times", e.id, got[e.id])
				}
			}
			present, dups := 0, 0
			for _, e := range batch {
				switch got[e.id] {
				case 0:
				case 1:
					present++
				default:
					present++
					dups += got[e.id] - 1
				}
			}
			t.Logf("retryWrites=%s, %d events: insert returned after %v: err=%v; stored %d of %d, duplicates %d",
				tc.retry, tc.n, took.Round(time.Millisecond), err, present, tc.n, dups)
			if dups > 0 {
				t.Fatalf("%d duplicate events after a lost reply (err %v)", dups, err)
			}
			if err == nil && present != tc.n {
				t.Fatalf("insert acknowledged but %d of %d events stored", present, tc.n)
			}
			if present != 0 && present != tc.n {
				t.Fatalf("one bucket write stored %d of %d events: half a group", present, tc.n)
			}
			// The proxy serves the same client afterwards.
			more := seriesEvents(5, "s1", base.Add(2*time.Minute))
			if _, err := coll.InsertMany(ctx, docsOf(more)); err != nil {
				t.Fatalf("insert after the fault: %v", err)
			}
			if got := storedIDs(t, ctx, db); got[more[4].id] != 1 {
				t.Fatalf("event written after the fault stored %d times", got[more[4].id])
			}
		})
	}
}

// TestFaultRetryAcrossRestartDirect is issue 11's deterministic case on a rule
// that writes buckets directly (ingest: direct): a retryable insert (lsid
// L, txnNumber 1) is stored, its reply is lost (the proxy restarts, so its
// reply cache is gone), another client writes to the same series and
// window (so the bucket the first attempt wrote has changed), and the
// driver's retry of (L, 1) arrives. The retry is recognised by the stored
// events' identities, not by the bucket's state: every event is stored
// once. TestStageRetryAcrossRestartAndMerge is the staged case.
func TestFaultRetryAcrossRestartDirect(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		n    int // events of the retried insert: a $push upsert below the threshold, a complete bucket at it
	}{{"pushUpsert", 10}, {"completeBucket", 100}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := ctxFor(t)
			db := uniqueDB(t)
			yaml := readingsRule(db, 100) + "    ingest: direct\n"
			base := time.Date(2026, 3, 4, 0, 0, 0, 0, time.UTC)
			first := seriesEvents(tc.n, "a", base)
			other := seriesEvents(1, "a", base.Add(30*time.Minute))
			insert := retryableInsert(db, "readings", newLsid(t), 1)

			p1 := startProxy(t, proxyOptions{yaml: yaml})
			// n read with AsInt64OK: an error reply (no n) fails the test, not the run.
			r, err := dialRawClient(t, p1.addr).run(insert, docsOf(first))
			if n, _ := r.Lookup("n").AsInt64OK(); err != nil || n != int64(tc.n) {
				t.Fatalf("first attempt: %v %v", r, err)
			}
			stopProxy(t, p1)
			p2 := startProxy(t, proxyOptions{yaml: yaml})
			if _, err := connect(t, p2.URI()).Database(db).Collection("readings").InsertMany(ctx, docsOf(other)); err != nil {
				t.Fatal(err)
			}
			for attempt := 1; attempt <= 2; attempt++ { // the second retry is answered from p2's reply cache
				r, err := dialRawClient(t, p2.addr).run(insert, docsOf(first))
				ok, _ := r.Lookup("ok").AsFloat64OK()
				if n, _ := r.Lookup("n").AsInt64OK(); err != nil || ok != 1 || n != int64(tc.n) {
					t.Fatalf("retry %d: %v %v, want n: %d", attempt, r, err, tc.n)
				}
			}
			got := storedIDs(t, ctx, db)
			for _, e := range append(first, other...) {
				if got[e.id] != 1 {
					t.Fatalf("event %v stored %d times, want once", e.id, got[e.id])
				}
			}
			if len(got) != tc.n+1 {
				t.Fatalf("%d distinct events stored, want %d", len(got), tc.n+1)
			}
		})
	}
}
