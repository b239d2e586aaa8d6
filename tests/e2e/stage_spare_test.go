package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// spareNames lists db's spare staging collections on the upstream
// (rewrite/stage's spare.go), with how many documents each holds.
func spareNames(t *testing.T, ctx context.Context, db string) map[string]int64 {
	t.Helper()
	raw := connect(t, env.upstreamURI).Database(db)
	names, err := raw.ListCollectionNames(ctx, bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, n := range names {
		if strings.HasPrefix(n, "tsproxy_stage_") && strings.Contains(n, "_spare_") {
			c, err := raw.Collection(n).CountDocuments(ctx, bson.D{})
			if err != nil {
				t.Fatal(err)
			}
			out[n] = c
		}
	}
	return out
}

// TestStageSpareCollections: per-event inserts with a read every few.
// The merge before each read keeps the staging collection it merged as a
// spare, which the proxy cleans to its marker, and the next insert takes
// the spare for its staging collection instead of creating one; every read returns
// each event once, a read with nothing staged makes no spare, and
// tsproxyFlush leaves neither staging nor spares behind.
func TestStageSpareCollections(t *testing.T) {
	t.Parallel()
	if env.external {
		t.Skip("spares are made where staging collections are the proxy's own (FerretDB)")
	}
	ctx := ctxFor(t)
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: stagedRule(db, 100, "1h")})
	c := connect(t, p.URI())
	coll := c.Database(db).Collection("readings")
	base := time.Date(2026, 3, 4, 10, 0, 0, 0, time.UTC)
	evs := append(seriesEvents(60, "a", base), seriesEvents(60, "b", base)...)
	inserted := 0
	for round := 0; inserted < len(evs); round++ {
		for k := 0; k < 1+round%4 && inserted < len(evs); k++ {
			if _, err := coll.InsertOne(ctx, evs[inserted].doc()); err != nil {
				t.Fatal(err)
			}
			inserted++
		}
		if round > 0 {
			// The insert took the spare the last read made.
			if sp := spareNames(t, ctx, db); len(sp) != 0 {
				t.Fatalf("round %d: spares %v after an insert, want the insert to have taken it", round, sp)
			}
		}
		if n, err := coll.CountDocuments(ctx, bson.D{}); err != nil || n != int64(inserted) {
			t.Fatalf("round %d: count %d (%v), want %d", round, n, err, inserted)
		}
		// The proxy cleans the spare to its marker after the read, and
		// then holds it ready (it learns so from the delete's reply,
		// after the upstream shows it).
		sp := spareNames(t, ctx, db)
		for end := time.Now().Add(5 * time.Second); ; {
			if len(sp) != 1 {
				t.Fatalf("round %d: spares %v after a read that merged, want one", round, sp)
			}
			clean := true
			for _, n := range sp {
				clean = n == 1
			}
			if clean && p.srv.ReadySpares() == 1 {
				break
			}
			if time.Now().After(end) {
				t.Fatalf("round %d: spare %v not cleaned to its marker and ready in 5 s (%d ready)", round, sp, p.srv.ReadySpares())
			}
			time.Sleep(20 * time.Millisecond)
			sp = spareNames(t, ctx, db)
		}
		if left := stagingNames(t, ctx, db); len(left) != 0 {
			t.Fatalf("round %d: staging left after a read: %v", round, left)
		}
	}
	// A read with nothing staged merges nothing and keeps the spare.
	before := spareNames(t, ctx, db)
	if n, err := coll.CountDocuments(ctx, bson.D{}); err != nil || n != int64(len(evs)) {
		t.Fatalf("count %d (%v), want %d", n, err, len(evs))
	}
	if after := spareNames(t, ctx, db); len(after) != 1 || len(before) != 1 {
		t.Fatalf("spares %v then %v around a read with nothing staged, want the same one", before, after)
	}
	r := flush(t, ctx, c, 1)
	if asInt(r["events"]) != 0 {
		t.Fatalf("flush after reads merged %v events, want 0", r["events"])
	}
	if sp := spareNames(t, ctx, db); len(sp) != 0 {
		t.Fatalf("spares %v after tsproxyFlush, want none", sp)
	}
	if left := stagingNames(t, ctx, db); len(left) != 0 {
		t.Fatalf("staging left after tsproxyFlush: %v", left)
	}
	checkStored(t, readBuckets(t, ctx, db), evs, 100)
	// An insert after the flush creates its staging collection as before.
	more := seriesEvents(3, "c", base.Add(time.Hour))
	for _, e := range more {
		if _, err := coll.InsertOne(ctx, e.doc()); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := coll.CountDocuments(ctx, bson.D{}); err != nil || n != int64(len(evs)+len(more)) {
		t.Fatalf("count %d (%v), want %d", n, err, len(evs)+len(more))
	}
}
