package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
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
