package e2e

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/tsproxy/tsproxy/wire"
)

// TestLayoutBackgroundMerge: the staged events of counter and slots
// rules are merged by the proxy's background merger, with no read or
// flush to prompt it: while inserts go on, once this proxy holds half the
// rule's maxStaged events (inserts beyond maxStaged would wait for room),
// and once the rule is quiet for mergeAfter. Before, only the events
// layout had a background merger: a counter or slots rule's events stayed
// staged until a read or a flush, and once maxStaged events were staged
// every insert waited for a merge that never came (found with tsbench
// layouts -prefill 300000: an insert through the proxy timed out after
// 10 minutes). On MongoDB these layouts do not stage: the same inserts
// and counts hold there.
func TestLayoutBackgroundMerge(t *testing.T) {
	t.Parallel()
	db := uniqueDB(t)
	// counterRule's and slotsRule's rules, in one config.
	bounds := "    mergeAfter: 300ms\n    maxStaged: 1000\n"
	p := startProxy(t, proxyOptions{yaml: counterRule(db) + bounds + strings.TrimPrefix(slotsRule(db, bounds), "rules:\n")})
	c := connect(t, p.URI())

	// 3,000 events of each rule, 100 an insert: three times maxStaged, so
	// the inserts go on only if the merger makes room as they come.
	const n, batch = 3000, 100
	hits, wantHits := genHits(n, 11)
	var samples []any
	wantSamples := map[sampleKey]float64{}
	for i := 0; i < n; i++ {
		host := []string{"web-1", "web-2", "db-1"}[i%3]
		ts := slotsBase.Add(time.Duration(i/3) * time.Second)
		v := float64(i%97) + 0.5
		samples = append(samples, bson.D{{Key: "host", Value: host}, {Key: "ts", Value: bson.NewDateTimeFromTime(ts)}, {Key: "cpu", Value: v}})
		wantSamples[sampleKey{host, ts.Unix()}] = v
	}
	ctx, cancel := context.WithTimeout(ctxFor(t), time.Minute)
	defer cancel()
	for lo := 0; lo < n; lo += batch {
		for name, docs := range map[string][]any{"hits": hits, "cpu": samples} {
			if _, err := c.Database(db).Collection(name).InsertMany(ctx, docs[lo:lo+batch]); err != nil {
				t.Fatalf("insert %d..%d of %s: %v (staged events not merged in the background?)", lo, lo+batch, name, err)
			}
		}
	}

	// Quiet now: everything merges after mergeAfter, and no staging
	// collection is left. Nothing here reads or flushes through the proxy.
	deadline := time.Now().Add(30 * time.Second)
	for left := stagingNames(t, ctx, db); len(left) > 0; left = stagingNames(t, ctx, db) {
		if time.Now().After(deadline) {
			t.Fatalf("staging not merged in the background 30 s after the last insert: %v", left)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// What the buckets hold, read directly: every hit counted once, every
	// sample in its slot.
	counted, total := counterBuckets(t, ctx, db)
	if total != n {
		t.Fatalf("the counter buckets count %d hits, want %d", total, n)
	}
	for k, want := range wantHits {
		if counted[k] != want {
			t.Fatalf("page %s second %d: counted %d, want %d", k.page, k.sec, counted[k], want)
		}
	}
	if stored := checkSlotsSamples(t, readSlotsBuckets(t, db), wantSamples, "after the background merges"); stored != int64(len(wantSamples)) {
		t.Fatalf("the slots buckets hold %d samples, want %d", stored, len(wantSamples))
	}
}

// isRename picks the renameCollection commands a merge's freeze sends.
func isRename(frame []byte) bool {
	var m wire.Msg
	return m.Decode(frame) == nil && m.CommandName() == "renameCollection"
}

// TestLayoutBackpressureMergeFails: a counter or slots rule whose merge
// fails (the relay refuses every rename a freeze sends, so nothing is
// frozen or merged) fills this proxy's staging to maxStaged. The next
// insert waits for room and, at its maxTimeMS, fails with an error naming
// the rule and the bound, and stores nothing; the proxy serves other
// clients meanwhile. Once the merge works again, an insert that waits
// goes through, and every acknowledged event is counted once.
func TestLayoutBackpressureMergeFails(t *testing.T) {
	if env.external {
		t.Skip("on MongoDB these layouts do not stage")
	}
	t.Parallel()
	const maxStaged, batch = 1000, 100
	bounds := "    mergeAfter: 1h\n    maxStaged: 1000\n"
	for _, layout := range []string{"counter", "slots"} {
		t.Run(layout, func(t *testing.T) {
			t.Parallel()
			db := uniqueDB(t)
			coll, yaml := "hits", counterRule(db)+bounds
			// docs are events lo..hi-1 of the layout: hits, or samples
			// each in a slot of its own.
			docs := func(lo, hi int) []any {
				hits, _ := genHits(hi-lo, int64(lo)+1)
				return hits
			}
			if layout == "slots" {
				coll, yaml = "cpu", slotsRule(db, bounds)
				docs = func(lo, hi int) []any {
					var out []any
					for i := lo; i < hi; i++ {
						host, ts := []string{"web-1", "web-2"}[i%2], slotsBase.Add(time.Duration(i/2)*time.Second)
						out = append(out, bson.D{{Key: "host", Value: host}, {Key: "ts", Value: bson.NewDateTimeFromTime(ts)}, {Key: "cpu", Value: float64(i % 89)}})
					}
					return out
				}
			}
			r := newRelay(t, upstreamAddr(t))
			p := startProxy(t, proxyOptions{yaml: yaml, upstreamURI: r.URI()})
			ctx := ctxFor(t)
			c := connect(t, p.URI())
			target := c.Database(db).Collection(coll)

			r.Refuse(isRename)
			for lo := 0; lo < maxStaged; lo += batch {
				if _, err := target.InsertMany(ctx, docs(lo, lo+batch)); err != nil {
					t.Fatalf("insert %d..%d, within maxStaged: %v", lo, lo+batch, err)
				}
			}
			insert := func(lo int, maxTimeMS int32) error {
				return c.Database(db).RunCommand(ctx, bson.D{{Key: "insert", Value: coll}, {Key: "documents", Value: docs(lo, lo+batch)},
					{Key: "maxTimeMS", Value: maxTimeMS}}).Err()
			}
			began := time.Now()
			err := insert(maxStaged, 1500)
			var se mongo.ServerError
			if !errors.As(err, &se) || !se.HasErrorCode(50) || !strings.Contains(err.Error(), db+"."+coll) || !strings.Contains(err.Error(), "maxStaged 1000") {
				t.Fatalf("insert past maxStaged while the merge fails: %v; want MaxTimeMSExpired naming the rule and maxStaged", err)
			}
			if waited := time.Since(began); waited < time.Second {
				t.Fatalf("the insert past maxStaged failed after %s, before its maxTimeMS of 1.5 s: it did not wait for room", waited)
			}
			if r.refused.Load() == 0 {
				t.Fatal("no merge tried to freeze the staging (no rename refused)")
			}
			// The proxy serves other clients and collections meanwhile.
			other := connect(t, p.URI()).Database(db).Collection("plain")
			if _, err := other.InsertOne(ctx, bson.D{{Key: "x", Value: 1}}); err != nil {
				t.Fatalf("a plain insert while the rule's staging is full: %v", err)
			}
			if n, err := other.CountDocuments(ctx, bson.D{}); err != nil || n != 1 {
				t.Fatalf("a plain count while the rule's staging is full: %d, %v", n, err)
			}

			// An insert that waits long enough goes through once the
			// merge works again.
			waiter := make(chan error, 1)
			go func() { waiter <- insert(maxStaged+batch, 60_000) }()
			select {
			case err := <-waiter:
				t.Fatalf("an insert past maxStaged returned while the merge still failed: %v", err)
			case <-time.After(500 * time.Millisecond):
			}
			r.Refuse(nil)
			select {
			case err := <-waiter:
				if err != nil {
					t.Fatalf("the waiting insert, once the merge works: %v", err)
				}
			case <-time.After(45 * time.Second):
				t.Fatal("the waiting insert did not go through within 45 s of the merge working again")
			}

			flush(t, ctx, c, db+"."+coll)
			want := int64(maxStaged + batch) // the refused insert stored nothing
			if n, err := target.CountDocuments(ctx, bson.D{}); err != nil || n != want {
				t.Fatalf("count through the proxy: %d, %v; want %d (every acknowledged event once)", n, err, want)
			}
			var stored int64
			if layout == "counter" {
				_, stored = counterBuckets(t, ctx, db)
			} else {
				want := map[sampleKey]float64{}
				for _, d := range append(docs(0, maxStaged), docs(maxStaged+batch, maxStaged+2*batch)...) {
					m := d.(bson.D)
					want[sampleKey{m[0].Value.(string), m[1].Value.(bson.DateTime).Time().Unix()}] = m[2].Value.(float64)
				}
				stored = checkSlotsSamples(t, readSlotsBuckets(t, db), want, "after the merge recovered")
			}
			if stored != want {
				t.Fatalf("the buckets hold %d events, want %d", stored, want)
			}
		})
	}
}
