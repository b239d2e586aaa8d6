package e2e

import (
	"maps"
	"testing"

	"github.com/tsproxy/tsproxy/tests/backend"
)

// TestLayoutDirectory: the proxy that merges a counter rule takes what
// it knows of the rule's buckets from its own merges (proxy/directory.go)
// instead of reading them, and what it knows never makes it count a hit
// twice or lose one: rounds of hits over the same windows, each flushed,
// a drop through another proxy between them, every (page, second) exact
// after each.
func TestLayoutDirectory(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	yaml := counterRule(db)
	p := startProxy(t, proxyOptions{yaml: yaml})
	c := connect(t, p.URI())
	coll := c.Database(db).Collection("hits")
	// Where lookups by _id scan (FerretDB's stock command and
	// PostgreSQL), the merging proxy keeps a directory.
	dir := !env.external && env.kind != backend.KindEmbedded
	want := map[slotKey]int{}
	round := func(name string, seed int64) {
		t.Helper()
		docs, hits := genHits(600, seed) // the same ten minutes each round
		for lo := 0; lo < len(docs); lo += 50 {
			if _, err := coll.InsertMany(ctx, docs[lo:lo+50]); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		}
		for k, n := range hits {
			want[k] += n
		}
		r := flush(t, ctx, c, db+".hits")
		// 5 pages over 10 minutes: every one of the 50 (page, minute)
		// buckets is known, absent on the first round, kept whole after.
		if dir && asInt(r["knownBuckets"]) != 50 {
			t.Fatalf("%s: flush %v, want all 50 buckets taken from the directory", name, r)
		}
		got, total := counterBuckets(t, ctx, db)
		if !maps.Equal(got, want) {
			t.Fatalf("%s: stored counts differ from the hits sent (%d slots stored, %d sent)", name, len(got), len(want))
		}
		n := 0
		for _, v := range want {
			n += v
		}
		if total != int64(n) {
			t.Fatalf("%s: buckets' totals sum to %d, want %d", name, total, n)
		}
	}
	round("first round", 1)
	round("second round", 2)
	round("third round", 3)
	// A drop through another proxy: this one learns of it from the
	// bucket collection's uuid, and counts from zero again.
	p2 := startProxy(t, proxyOptions{yaml: yaml})
	if err := connect(t, p2.URI()).Database(db).Collection("hits").Drop(ctx); err != nil {
		t.Fatal(err)
	}
	want = map[slotKey]int{}
	round("after a drop elsewhere", 4)
	round("and after that", 5)
}
