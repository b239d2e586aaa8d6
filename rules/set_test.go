package rules

import (
	"sync"
	"testing"
	"time"
)

func TestSet(t *testing.T) {
	in := []Rule{
		{Namespace: "iot.readings", TimeField: "ts", Aggregates: []string{"v"}},
		{DB: "logs", Collection: "app.events", TimeField: "at", BucketCollection: "ev_b", Span: time.Minute, MaxEvents: 50},
		{Namespace: "iot.readings", TimeField: "other"}, // duplicate: first wins
	}
	s := NewSet(in)
	in[0].Aggregates[0] = "changed" // the Set holds copies
	in[0].TimeField = "changed"

	r := s.Lookup("iot", "readings")
	if r == nil || r.TimeField != "ts" || r.Aggregates[0] != "v" {
		t.Fatalf("Lookup(iot, readings) = %+v", r)
	}
	want := Rule{
		Namespace: "iot.readings", DB: "iot", Collection: "readings", TimeField: "ts",
		Span: DefaultSpan, MaxEvents: DefaultMaxEvents, MaxBytes: DefaultMaxBytes, InsertThreshold: 100,
		Aggregates: []string{"v"}, BucketCollection: "readings.buckets", Layout: LayoutEvents,
	}
	if r.Namespace != want.Namespace || r.DB != want.DB || r.Collection != want.Collection ||
		r.Span != want.Span || r.MaxEvents != want.MaxEvents || r.MaxBytes != want.MaxBytes ||
		r.InsertThreshold != want.InsertThreshold || r.BucketCollection != want.BucketCollection || r.Layout != want.Layout {
		t.Errorf("defaults:\n got %+v\nwant %+v", *r, want)
	}
	r2 := s.Lookup("logs", "app.events")
	if r2 == nil || r2.Namespace != "logs.app.events" || r2.InsertThreshold != 5 || r2.Span != time.Minute {
		t.Errorf("Lookup(logs, app.events) = %+v", r2)
	}
	for _, miss := range [][2]string{{"iot", "readings.buckets"}, {"iot", "Readings"}, {"io", "t.readings"}, {"", ""}, {"logs", "ev_b"}} {
		if got := s.Lookup(miss[0], miss[1]); got != nil {
			t.Errorf("Lookup(%q, %q) = %+v, want nil", miss[0], miss[1], got)
		}
	}
	if got := s.ByBucketCollection("iot", "readings.buckets"); got != r {
		t.Errorf("ByBucketCollection(iot, readings.buckets) = %+v", got)
	}
	if got := s.ByBucketCollection("logs", "ev_b"); got != r2 {
		t.Errorf("ByBucketCollection(logs, ev_b) = %+v", got)
	}
	if got := s.ByBucketCollection("iot", "readings"); got != nil {
		t.Errorf("ByBucketCollection(iot, readings) = %+v, want nil", got)
	}
	if s.Len() != 3 || len(s.All()) != 3 {
		t.Errorf("Len %d", s.Len())
	}
	if !s.InDB("logs") || s.InDB("admin") {
		t.Error("InDB")
	}

	var nilSet *Set
	if nilSet.Lookup("iot", "readings") != nil || nilSet.ByBucketCollection("a", "b") != nil || nilSet.Len() != 0 || nilSet.InDB("a") {
		t.Error("nil Set")
	}
}

func TestSetLookupAllocs(t *testing.T) {
	s := NewSet([]Rule{{Namespace: "iot.readings", TimeField: "ts"}})
	db, coll := string([]byte("iot")), string([]byte("readings")) // not the Set's own strings
	allocs := testing.AllocsPerRun(1000, func() {
		if s.Lookup(db, coll) == nil || s.Lookup(db, "x") != nil || s.ByBucketCollection(db, "readings.buckets") == nil {
			panic("lookup")
		}
	})
	if allocs != 0 {
		t.Errorf("lookups allocate %.1f times", allocs)
	}
}

func TestSetConcurrent(t *testing.T) {
	s := NewSet([]Rule{{Namespace: "iot.readings", TimeField: "ts"}, {Namespace: "iot.b", TimeField: "ts"}})
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1000 {
				if s.Lookup("iot", "readings") == nil || s.ByBucketCollection("iot", "b.buckets") == nil {
					panic("lookup")
				}
			}
		}()
	}
	wg.Wait()
}

func BenchmarkLookup(b *testing.B) {
	rs := make([]Rule, 100)
	for i := range rs {
		rs[i] = Rule{DB: "db", Collection: string(rune('a'+i%26)) + string(rune('a'+i/26)), TimeField: "t"}
	}
	s := NewSet(rs)
	b.ReportAllocs()
	for b.Loop() {
		s.Lookup("db", "ab")
		s.Lookup("db", "zz")
	}
}

func TestSetByRollupCollection(t *testing.T) {
	s := NewSet([]Rule{{Namespace: "iot.readings", TimeField: "ts", Rollups: []time.Duration{time.Minute, 24 * time.Hour}},
		{Namespace: "iot.a.rollup_1m", TimeField: "ts"}})
	for _, c := range []struct {
		db, coll string
		want     string
	}{
		{"iot", "readings.rollup_1m", "iot.readings"},
		{"iot", "readings.rollup_1d", "iot.readings"},
		{"iot", "readings.rollup_1h", ""}, // not one of its resolutions
		{"iot", "readings", ""},
		{"other", "readings.rollup_1m", ""},
		{"iot", "a.rollup_1m", ""}, // a rule's own namespace, which has no rollups
		{"iot", "a.rollup_1m.rollup_1m", ""},
	} {
		got := ""
		if r := s.ByRollupCollection(c.db, c.coll); r != nil {
			got = r.Namespace
		}
		if got != c.want {
			t.Errorf("ByRollupCollection(%s, %s) = %q, want %q", c.db, c.coll, got, c.want)
		}
	}
}

// A rule's stage prefix is computed once, in NewSet, for its bucket
// collection; a copy given another bucket collection (a partition's read,
// rewrite/fanout) gets that collection's prefix, not the cached one.
func TestStagePrefixCached(t *testing.T) {
	s := NewSet([]Rule{{Namespace: "iot.readings", TimeField: "ts"}})
	r := s.Lookup("iot", "readings")
	if got, want := r.StagePrefix(), stagePrefixOf("readings.buckets"); got != want || r.stagePrefix != want {
		t.Fatalf("StagePrefix = %q (cached %q), want %q", got, r.stagePrefix, want)
	}
	part := *r
	part.BucketCollection = "readings.buckets.2026_03"
	if got, want := part.StagePrefix(), stagePrefixOf("readings.buckets.2026_03"); got != want || got == r.StagePrefix() {
		t.Errorf("a copy with another bucket collection: StagePrefix = %q, want %q", got, want)
	}
	byHand := Rule{BucketCollection: "readings.buckets"}
	if got := byHand.StagePrefix(); got != r.StagePrefix() {
		t.Errorf("a rule built by hand: StagePrefix = %q, want %q", got, r.StagePrefix())
	}
}
