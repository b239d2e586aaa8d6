package merge_test

import (
	"maps"
	"slices"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rewrite/stage/merge"
)

// dir is a directory as the proxy keeps one (proxy/directory.go), less
// its lease and epoch checks: valid while the count it was told holds.
type dir struct {
	coll     string
	complete bool
	read     bool
	keys     map[string]stage.KnownKey
	loads    int
}

func (d *dir) known() *stage.Known { return &stage.Known{Dir: d} }

func (d *dir) Of(coll string, keys []bucket.Key) (map[string]stage.KnownKey, bool, bool) {
	if coll != d.coll {
		d.keys, d.complete, d.read = nil, false, false
	}
	return stage.KnownOf(d.keys, d.complete, keys), d.complete, d.read
}

func (d *dir) Load(coll string, keys map[string]stage.KnownKey, complete bool) {
	d.loads++
	d.coll, d.keys, d.complete, d.read = coll, keys, complete, true
}

func (d *dir) Learn(coll string, keys map[string]stage.KnownKey) {
	if d.keys == nil || d.coll != coll && d.coll != "" {
		d.keys, d.complete = map[string]stage.KnownKey{}, false
	}
	maps.Copy(d.keys, keys)
	d.coll = coll
}

func TestMergeDirectory(t *testing.T) {
	opts := func(now int64, d *dir) merge.MergeOptions {
		o := merge.MergeOptions{All: true, TopUp: true, Now: time.UnixMilli(now), Host: &hooks{oneScanBeats: func(n int) bool { return n > 1 }}}
		if d != nil {
			o.Known = d.known()
		}
		return o
	}
	// bucketReads counts the finds of the bucket collection.
	bucketReads := func(m *mem) *int {
		n := 0
		m.hook = func(name, coll string) bool {
			if name == "find" && coll == "readings.buckets" {
				n++
			}
			return false
		}
		return &n
	}
	// run stages the same events into two upstreams, merging each round,
	// one with the directory and one without: both must end with the
	// same buckets.
	rounds := [][]bson.D{events("a", 0, 4), append(events("a", 4, 1), events("b", 0, 2)...), events("a", 5, 3), events("b", 2, 5)}

	t.Run("with a directory the merge reads no bucket, and writes the same ones", func(t *testing.T) {
		with, without := newMem(t), newMem(t)
		d := &dir{}
		reads := bucketReads(with)
		for i, evs := range rounds {
			now := int64(1_000_000 + 100*i)
			stagedInsert(t, with, evs)
			stagedInsert(t, without, evs)
			st := runMerge(t, with, opts(now, d))
			runMerge(t, without, opts(now, nil))
			// The first merge finds no bucket collection (nothing to
			// read); the others, only buckets the first ones wrote.
			if st.DirectoryReads != 0 {
				t.Fatalf("merge %d: stats %+v, want no read of the keys (the directory is complete)", i, st)
			}
		}
		if *reads != 0 {
			t.Fatalf("%d finds of the bucket collection, want none", *reads)
		}
		if a, b := bucketIDsAndCounts(with), bucketIDsAndCounts(without); !maps.Equal(a, b) {
			t.Fatalf("buckets with the directory %v, without %v", a, b)
		}
		if got := bucketCounts(t, with, "a"); !slices.Equal(got, []int64{3, 3, 2}) {
			t.Fatalf("bucket counts of a %v, want [3 3 2]", got)
		}
		if d.keys[keyOf(t, with, "a")].Next != 3 {
			t.Fatalf("directory %v: want a's next seq 3", d.keys)
		}
		total := int64(0)
		for _, c := range bucketIDsAndCounts(with) {
			total += c
		}
		if total != 15 { // a's and b's events share _ids: counted, not by id
			t.Fatalf("%d events stored, want 15", total)
		}
		checkIDIndex(t, with, true)
	})
	t.Run("a directory never read learns from the merges and probes what it lacks", func(t *testing.T) {
		with, without := newMem(t), newMem(t)
		// Buckets from before the directory (another term).
		stagedInsert(t, with, rounds[0])
		stagedInsert(t, without, rounds[0])
		runMerge(t, with, opts(1_000_000, nil))
		runMerge(t, without, opts(1_000_000, nil))
		d := &dir{}
		reads := bucketReads(with)
		for i, evs := range rounds[1:] {
			now := int64(1_000_100 + 100*i)
			stagedInsert(t, with, evs)
			stagedInsert(t, without, evs)
			o := opts(now, nil)
			o.Known = d.known()
			o.Known.NoRead = true
			*reads = 0
			st := runMerge(t, with, o)
			runMerge(t, without, opts(now, nil))
			if st.DirectoryReads != 0 || d.loads != 0 {
				t.Fatalf("merge %d: stats %+v, %d loads: want the keys never read", i, st, d.loads)
			}
			// a's buckets, there before, are probed at the first merge;
			// b is new then, and each key is known after the merge that
			// wrote it.
			if want := map[bool]int{true: 1, false: 0}[i == 0]; (*reads > 0) != (want > 0) {
				t.Fatalf("merge %d: %d finds of the bucket collection, want them only while a key was not known", i, *reads)
			}
		}
		if a, b := bucketIDsAndCounts(with), bucketIDsAndCounts(without); !maps.Equal(a, b) {
			t.Fatalf("buckets with the directory %v, without %v", a, b)
		}
		checkIDIndex(t, with, true)
	})
	t.Run("another bucket collection makes the merge read the keys again", func(t *testing.T) {
		m := newMem(t)
		d := &dir{}
		stagedInsert(t, m, events("a", 0, 4))
		runMerge(t, m, opts(1_000_000, d))
		// Another proxy dropped the collection, and it was made again
		// with one bucket: the directory is stale.
		one := m.colls["readings.buckets"][:1]
		delete(m.colls, "readings.buckets")
		delete(m.uuids, "readings.buckets")
		m.colls["readings.buckets"] = one
		stagedInsert(t, m, events("a", 4, 1))
		st := runMerge(t, m, opts(1_000_100, d))
		if st.DirectoryReads != 1 || d.loads != 2 {
			t.Fatalf("stats %+v, loads %d: want the keys read again", st, d.loads)
		}
		if got := bucketCounts(t, m, "a"); !slices.Equal(got, []int64{3, 1}) {
			t.Fatalf("bucket counts %v, want [3 1] (seq 1 written again after the drop)", got)
		}
	})
	t.Run("a key the retention sweep may reach is probed", func(t *testing.T) {
		m := newMem(t)
		d := &dir{}
		rule := rwtest.InsertRule()
		rule.ExpireAfter = 24 * time.Hour
		o := func(now time.Time) merge.MergeOptions {
			return merge.MergeOptions{All: true, TopUp: true, Now: now, Host: &hooks{oneScanBeats: func(n int) bool { return n > 1 }}, Known: d.known()}
		}
		window := time.UnixMilli(36_000_000) // the events' window, of an hour
		stagedInsert(t, m, events("a", 0, 4))
		mergeRule(t, m, rule, o(window.Add(time.Hour)))
		if len(d.keys) == 0 {
			t.Fatal("nothing learned of a recent key")
		}
		// Later, within two hours (sweepGrace) of the cutoff
		// (expireAfter and the span): another proxy's sweep may take
		// the key.
		reads := bucketReads(m)
		stagedInsert(t, m, events("a", 4, 1))
		mergeRule(t, m, rule, o(window.Add(rule.ExpireAfter+rule.Span-2*time.Hour+time.Minute)))
		if *reads == 0 {
			t.Fatal("a key near the retention cutoff taken from the directory: want it probed")
		}
		if got := bucketCounts(t, m, "a"); !slices.Equal(got, []int64{3, 2}) {
			t.Fatalf("bucket counts %v, want [3 2]", got)
		}
	})
	t.Run("a key whose seqs have a gap is probed, not taken from the keys read", func(t *testing.T) {
		m := newMem(t)
		d := &dir{}
		stagedInsert(t, m, append(events("a", 0, 7), events("b", 0, 1)...))
		runMerge(t, m, opts(1_000_000, nil)) // a: seqs 0, 1, 2
		a1 := rwtest.BucketID(t, "a", 36_000_000, 1)
		m.colls["readings.buckets"] = slices.DeleteFunc(m.colls["readings.buckets"], func(d bsoncore.Document) bool { return d.Lookup("_id").ObjectID() == a1 })
		stagedInsert(t, m, append(events("a", 7, 1), events("b", 1, 1)...))
		st := runMerge(t, m, opts(1_000_100, d))
		if st.DirectoryReads != 1 || d.complete || len(d.keys) == 0 {
			t.Fatalf("stats %+v, directory %+v: want the keys read, a left out, not complete", st, d)
		}
		// a was probed (the gap's seq is the first free one), and is not
		// learned: its seqs past the gap are not known.
		if _, ok := d.keys[keyOf(t, m, "a")]; ok {
			t.Fatalf("directory %v: a learned, though only probed", d.keys)
		}
		if got := bucketCounts(t, m, "a"); !slices.Equal(got, []int64{3, 1, 1}) {
			t.Fatalf("bucket counts of a %v, want [3 1 1]: the new event in the gap's seq", got)
		}
		// The keys are not read again this term: the rest is probed.
		stagedInsert(t, m, events("a", 8, 1))
		if st := runMerge(t, m, opts(1_000_200, d)); st.DirectoryReads != 0 {
			t.Fatalf("stats %+v: the keys read again", st)
		}
	})
	t.Run("a first run rewrites a top-up by _id, a repeated one on its count", func(t *testing.T) {
		m := newMem(t)
		d := &dir{}
		stagedInsert(t, m, events("a", 0, 4))
		runMerge(t, m, opts(1_000_000, d))
		stagedInsert(t, m, events("a", 4, 1))
		runMerge(t, m, opts(1_000_100, d))
		if len(m.topUpFilters) != 1 || len(mustElems(t, m.topUpFilters[0])) != 1 {
			t.Fatalf("top-up filters %v, want one on _id alone", m.topUpFilters)
		}
		stagedInsert(t, m, events("a", 5, 1))
		cutMerge(m, "update", opts(1_000_200, d))
		m.topUpFilters = nil
		runMerge(t, m, merge.MergeOptions{All: true, TopUp: true, Now: time.UnixMilli(1_000_300)})
		if len(m.topUpFilters) != 1 || len(mustElems(t, m.topUpFilters[0])) != 2 {
			t.Fatalf("top-up filters of the repeated merge %v, want {_id, count}", m.topUpFilters)
		}
		onceEachStored(t, m, 6)
	})
}

// bucketIDsAndCounts maps each bucket's _id to its count.
func bucketIDsAndCounts(m *mem) map[string]int64 {
	out := map[string]int64{}
	for _, b := range m.colls["readings.buckets"] {
		c, _ := b.Lookup("count").AsInt64OK()
		out[b.Lookup("_id").String()] = c
	}
	return out
}

// keyOf is the bucket key of series s in the one window the tests use.
func keyOf(t *testing.T, m *mem, s string) string {
	t.Helper()
	for _, b := range m.colls["readings.buckets"] {
		meta, start, err := bucket.KeyFields(b)
		if err != nil {
			t.Fatal(err)
		}
		if str, _ := meta.StringValueOK(); str == s {
			return bucket.KeyOf(meta, start).String()
		}
	}
	t.Fatalf("no bucket of %s", s)
	return ""
}

// onceEachStored checks that m's buckets hold n events, each once, and
// an event-id index of a new version.
func onceEachStored(t *testing.T, m *mem, n int) {
	t.Helper()
	checkStoredOnce(t, m, n)
	checkIDIndex(t, m, true)
}

// checkStoredOnce checks that m's buckets hold n events, each once.
func checkStoredOnce(t *testing.T, m *mem, n int) {
	t.Helper()
	got := storedEvents(t, m)
	if len(got) != n {
		t.Fatalf("%d events stored, want %d", len(got), n)
	}
	for id, c := range got {
		if c != 1 {
			t.Fatalf("event %s stored %d times", id, c)
		}
	}
}

func mustElems(t *testing.T, d bsoncore.Document) []bsoncore.Element {
	t.Helper()
	els, err := d.Elements()
	if err != nil {
		t.Fatal(err)
	}
	return els
}

// TestMergeClosingTopUp: the merge that takes a window's last events with
// events of the series' next window tops the window's last bucket up
// whatever the top-up ratio, once a key in a directory's life; late
// events after it, and merges without a directory, keep the ratio.
func TestMergeClosingTopUp(t *testing.T) {
	rule := rwtest.InsertRule()
	rule.MaxEvents = 20
	const w0, w1 = 36_000_000, 36_000_000 + 3_600_000 // two windows of an hour
	// at are n events of series a from second i of the window starting
	// at w; ids unique across the windows.
	at := func(w int64, i, n int) []bson.D {
		var out []bson.D
		for j := i; j < i+n; j++ {
			id := rwtest.OID(byte(j))
			id[5] = byte(w / 3_600_000)
			out = append(out, rwtest.Event(id, rwtest.DT(w+int64(j)*1000), "a", float64(j)))
		}
		return out
	}
	opts := func(now int64, d *dir) merge.MergeOptions {
		o := merge.MergeOptions{All: true, TopUp: true, TopUpFloor: 2, Now: time.UnixMilli(now), Host: &hooks{oneScanBeats: func(n int) bool { return n > 1 }}}
		if d != nil {
			o.Known = d.known()
		}
		return o
	}
	rounds := [][]bson.D{
		at(w0, 0, 10),                          // w0: a bucket of 10
		append(at(w0, 10, 2), at(w1, 0, 3)...), // w0's last 2, more than 4 times over: closing
		append(at(w0, 12, 1), at(w1, 3, 1)...), // a late one: the ratio again
	}
	run := func(t *testing.T, d *dir) *mem {
		m := newMem(t)
		for i, evs := range rounds {
			stagedInsert(t, m, evs)
			mergeRule(t, m, rule, opts(1_000_000+100*int64(i), d))
		}
		onceEachStored(t, m, 17)
		return m
	}
	t.Run("with a directory", func(t *testing.T) {
		d := &dir{}
		m := run(t, d)
		if got := bucketCounts(t, m, "a"); !slices.Equal(got, []int64{12, 1}) {
			t.Fatalf("bucket counts of the first window %v, want [12 1]: closed once, then a late event in a bucket of its own", got)
		}
		w0Key := bucket.KeyOf(bsoncore.Value{Type: bsoncore.TypeString, Data: bsoncore.AppendString(nil, "a")}, w0).String()
		if kk, ok := d.keys[w0Key]; !ok || !kk.Closed {
			t.Fatalf("directory %v: want the first window's key known as closed", d.keys)
		}
	})
	t.Run("a closing merge cut after its top-up is finished without doubling", func(t *testing.T) {
		m, d := newMem(t), &dir{}
		stagedInsert(t, m, rounds[0])
		mergeRule(t, m, rule, opts(1_000_000, d))
		stagedInsert(t, m, rounds[1])
		m.fail["drop"] = true
		o := opts(1_000_100, d)
		o.RetryHorizon = time.Hour
		m.run(merge.NewMerge(rule, o))
		m.fail["drop"] = false
		if st := mergeRule(t, m, rule, opts(1_000_200, d)); st.Collections != 1 {
			t.Fatalf("resume %+v, want the cut merge finished", st)
		}
		if got := bucketCounts(t, m, "a"); !slices.Equal(got, []int64{12}) {
			t.Fatalf("bucket counts of the first window %v, want [12]", got)
		}
		onceEachStored(t, m, 15)
	})
	t.Run("without one", func(t *testing.T) {
		m := run(t, nil)
		// 10, more than 4 times 2: a bucket of 2, which the late one tops up.
		if got := bucketCounts(t, m, "a"); !slices.Equal(got, []int64{10, 3}) {
			t.Fatalf("bucket counts of the first window %v, want [10 3]", got)
		}
	})
}
