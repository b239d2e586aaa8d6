package e2e

import (
	"fmt"
	"maps"
	"math/rand"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
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
	dir := keepsDirectory()
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

// TestLayoutDirectorySlots: the same for a slots rule, whose merges keep
// the whole buckets they write: rounds of samples over the same two
// hours, each overwriting some seconds of the rounds before and adding
// others, every sample's latest value read back through the proxy after
// each round.
func TestLayoutDirectorySlots(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: slotsRule(db, "")})
	c := connect(t, p.URI())
	coll := c.Database(db).Collection("cpu")
	dir := keepsDirectory()
	want := map[sampleKey]float64{}
	rng := rand.New(rand.NewSource(11))
	for round := range 4 {
		var docs []any
		seen := map[sampleKey]bool{}
		for len(docs) < 300 {
			k := sampleKey{host: []string{"h0", "h1", "h2"}[rng.Intn(3)], sec: slotsBase.Unix() + rng.Int63n(7200)}
			if seen[k] {
				continue // one write of a slot a round: its order within a round is the staging's
			}
			seen[k] = true
			v := float64(round*1000 + len(docs))
			want[k] = v
			docs = append(docs, bson.D{{Key: "host", Value: k.host}, {Key: "ts", Value: time.Unix(k.sec, 0).UTC()}, {Key: "cpu", Value: v}})
		}
		for lo := 0; lo < len(docs); lo += 20 {
			if _, err := coll.InsertMany(ctx, docs[lo:lo+20]); err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
		r := flush(t, ctx, c, db+".cpu")
		// 3 hosts over 2 hours: 6 buckets, all known on FerretDB.
		if dir && asInt(r["knownBuckets"]) != 6 {
			t.Fatalf("round %d: flush %v, want all 6 buckets taken from the directory", round, r)
		}
		if n := checkSlotsSamples(t, readSlotsBuckets(t, db), want, fmt.Sprintf("after round %d", round+1)); n != int64(len(want)) {
			t.Fatalf("round %d: buckets hold %d samples, want %d", round, n, len(want))
		}
		cur, err := coll.Find(ctx, bson.D{})
		if err != nil {
			t.Fatal(err)
		}
		var got []struct {
			Host string    `bson:"host"`
			TS   time.Time `bson:"ts"`
			CPU  float64   `bson:"cpu"`
		}
		if err := cur.All(ctx, &got); err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Fatalf("round %d: find returns %d samples, want %d", round, len(got), len(want))
		}
		for _, g := range got {
			if w, ok := want[sampleKey{g.Host, g.TS.Unix()}]; !ok || w != g.CPU {
				t.Fatalf("round %d: %s at %v is %v, want %v (sent: %v)", round, g.Host, g.TS, g.CPU, w, ok)
			}
		}
	}
}
