package read

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
	"github.com/tsproxy/tsproxy/rewrite/read/point"
	"github.com/tsproxy/tsproxy/rules"
)

// indexedBuckets serves an index read: the event-id index (with or
// without its marker), lookups by bucket _id, and the event scan's finds
// (the fallback), counting each.
type indexedBuckets struct {
	sb                                      *sortedBuckets
	byID                                    map[bson.ObjectID]bsoncore.Document
	entries                                 []bsoncore.Document
	marker                                  bool
	version                                 int64
	indexReads, markerReads, lookups, scans int
}

func newIndexedBuckets(t *testing.T, sb *sortedBuckets, marker bool) *indexedBuckets {
	ib := &indexedBuckets{sb: sb, byID: map[bson.ObjectID]bsoncore.Document{}, marker: marker}
	for _, b := range sb.all {
		id := b.Lookup("_id").ObjectID()
		ib.byID[id] = b
		vals, _ := b.Lookup("events").Array().Values()
		evs := make([]bucket.Event, len(vals))
		for i, v := range vals {
			evs[i] = bucket.Event{Stored: v.Document()}
		}
		ib.entries = append(ib.entries, bucket.IDIndexEntry(id, b.Lookup("start").DateTime(), evs))
	}
	return ib
}

func (ib *indexedBuckets) reply(t *testing.T, cmd []byte) []byte {
	t.Helper()
	d := bsoncore.Document(cmd)
	coll, _ := d.Lookup("find").StringValueOK()
	if coll == rwtest.Rule().IDIndexCollection() {
		batch := A{}
		if ib.marker {
			batch = append(batch, bson.Raw(bucket.IDIndexMarkerDoc(ib.version)))
		}
		if _, err := d.LookupErr("filter", "_id"); err == nil {
			ib.markerReads++
		} else {
			ib.indexReads++
			for _, e := range ib.entries {
				batch = append(batch, bson.Raw(e))
			}
		}
		return rwtest.Doc(t, D{{Key: "cursor", Value: D{{Key: "firstBatch", Value: batch}, {Key: "id", Value: int64(0)}, {Key: "ns", Value: "iot." + coll}}}, {Key: "ok", Value: 1.0}})
	}
	if id, ok := d.Lookup("filter", "_id").ObjectIDOK(); ok {
		ib.lookups++
		batch := A{}
		if b, ok := ib.byID[id]; ok {
			batch = append(batch, bson.Raw(b))
		}
		return rwtest.Doc(t, D{{Key: "cursor", Value: D{{Key: "firstBatch", Value: batch}, {Key: "id", Value: int64(0)}, {Key: "ns", Value: "iot.readings.buckets"}}}, {Key: "ok", Value: 1.0}})
	}
	ib.scans++
	return ib.sb.reply(t, cmd)
}

// TestIDIndexRead: finds by event _id read the index, then only the
// buckets that may hold the ids; without the index's marker they scan.
// Results equal a brute-force filter of the same events either way.
func TestIDIndexRead(t *testing.T) {
	sb, all := eventScanData(t)
	cases := []struct {
		name       string
		filter     D
		sort       D
		limit      int64
		match      func(esEvent) bool
		maxLookups int
	}{
		{name: "findOne", filter: D{{Key: "_id", Value: int32(17)}}, limit: 1, match: func(e esEvent) bool { return e.id == 17 }, maxLookups: 2},
		{name: "$eq, as int64", filter: D{{Key: "_id", Value: D{{Key: "$eq", Value: int64(250)}}}}, match: func(e esEvent) bool { return e.id == 250 }, maxLookups: 2},
		{name: "$in sorted by time desc", filter: D{{Key: "_id", Value: D{{Key: "$in", Value: A{int32(3), 250.0, int32(399), "x"}}}}}, sort: D{{Key: "ts", Value: -1}},
			match: func(e esEvent) bool { return e.id == 3 || e.id == 250 || e.id == 399 }, maxLookups: 5},
		{name: "with another condition", filter: D{{Key: "_id", Value: D{{Key: "$in", Value: A{int32(5), int32(6), int32(7)}}}}, {Key: "v", Value: D{{Key: "$gte", Value: int32(5)}}}},
			match: func(e esEvent) bool { return (e.id == 5 || e.id == 6 || e.id == 7) && e.v >= 5 }, maxLookups: 3},
		{name: "no such id", filter: D{{Key: "_id", Value: int32(100000)}}, match: func(esEvent) bool { return false }, maxLookups: 1},
	}
	for _, c := range cases {
		for _, marker := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/marker=%v", c.name, marker), func(t *testing.T) {
				cmd := D{{Key: "find", Value: "readings"}, {Key: "filter", Value: c.filter}}
				if c.sort != nil {
					cmd = append(cmd, E{Key: "sort", Value: c.sort})
				}
				if c.limit > 0 {
					cmd = append(cmd, E{Key: "limit", Value: c.limit}, E{Key: "singleBatch", Value: true})
				}
				plan, err := rdPlan(t, rwtest.FerretCaps, cmd)
				if err != nil {
					t.Fatal(err)
				}
				if plan.Point == nil || plan.Point.Ids == nil {
					t.Fatal("not an index read")
				}
				ib := newIndexedBuckets(t, sb, marker)
				got := drainPoint(t, plan.Point, ib, 0)
				var want []int32
				sel := slices.Clone(all)
				sel = slices.DeleteFunc(sel, func(e esEvent) bool { return !c.match(e) })
				if c.sort != nil {
					slices.SortStableFunc(sel, func(a, b esEvent) int { return int(b.ms - a.ms) })
				} else {
					slices.SortFunc(sel, func(a, b esEvent) int { return int(a.id - b.id) })
					slices.Sort(got)
				}
				for _, e := range sel {
					want = append(want, e.id)
				}
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Fatalf("got  %v\nwant %v", got, want)
				}
				if ib.indexReads != 1 {
					t.Fatalf("index read %d times", ib.indexReads)
				}
				if marker && (ib.scans != 0 || ib.lookups > c.maxLookups) {
					t.Fatalf("with the marker: %d scans, %d lookups (at most %d)", ib.scans, ib.lookups, c.maxLookups)
				}
				if !marker && (ib.scans == 0 || ib.lookups != 0) {
					t.Fatalf("without the marker: %d scans, %d lookups; want the event scan", ib.scans, ib.lookups)
				}
			})
		}
	}
}

// TestIDIndexReadFallsBackOnManyCandidates: an $in naming more buckets
// than maxIDCandidates scans instead.
func TestIDIndexReadFallsBackOnManyCandidates(t *testing.T) {
	sb, all := eventScanData(t)
	in := A{}
	for _, e := range all {
		in = append(in, e.id)
	}
	plan, err := rdPlan(t, rwtest.FerretCaps, D{{Key: "find", Value: "readings"}, {Key: "filter", Value: D{{Key: "_id", Value: D{{Key: "$in", Value: in}}}}}})
	if err != nil {
		t.Fatal(err)
	}
	ib := newIndexedBuckets(t, sb, true)
	got := drainPoint(t, plan.Point, ib, 0)
	if len(got) != len(all) || ib.lookups != 0 || ib.scans == 0 {
		t.Fatalf("%d events, %d lookups, %d scans; want %d events by a scan", len(got), ib.lookups, ib.scans, len(all))
	}
}

func TestEventIDs(t *testing.T) {
	rc := rwtest.Ctx(t, rwtest.FerretCaps)
	for _, c := range []struct {
		filter D
		n      int // -1: none
	}{
		{D{{Key: "_id", Value: int32(1)}}, 1},
		{D{{Key: "_id", Value: D{{Key: "$eq", Value: "a"}}}}, 1},
		{D{{Key: "_id", Value: D{{Key: "$in", Value: A{1, 2, 3}}}}}, 3},
		{D{{Key: "$and", Value: A{D{{Key: "ts", Value: rwtest.DT(0)}}, D{{Key: "_id", Value: int32(1)}}}}}, 1},
		{D{{Key: "_id", Value: D{{Key: "$gt", Value: 1}}}}, -1},
		{D{{Key: "_id", Value: D{{Key: "$in", Value: A{bson.Regex{Pattern: "a"}}}}}}, -1},
		{D{{Key: "_id", Value: bson.Regex{Pattern: "a"}}}, -1},
		{D{{Key: "$or", Value: A{D{{Key: "_id", Value: 1}}, D{{Key: "v", Value: 1}}}}}, -1},
		{D{{Key: "v", Value: 1}}, -1},
	} {
		ids := point.EventIDs(rc, rwtest.Doc(t, c.filter))
		if (c.n < 0) != (ids == nil) || (c.n >= 0 && len(ids) != c.n) {
			t.Errorf("%v: %d ids, want %d", c.filter, len(ids), c.n)
		}
	}
}

// TestIDIndexCountAndDistinct: count, countDocuments and distinct by
// event _id read the index and the buckets it names, and no scan.
func TestIDIndexCountAndDistinct(t *testing.T) {
	sb, _ := eventScanData(t)
	in := D{{Key: "_id", Value: D{{Key: "$in", Value: A{int32(3), int32(4), int32(250), int32(100000)}}}}}
	for _, c := range []struct {
		cmd  D
		want string
	}{
		{D{{Key: "count", Value: "readings"}, {Key: "query", Value: in}}, `"n": {"$numberInt":"3"}`},
		{D{{Key: "aggregate", Value: "readings"}, {Key: "pipeline", Value: A{D{{Key: "$match", Value: in}}, D{{Key: "$group", Value: D{{Key: "_id", Value: 1}, {Key: "n", Value: D{{Key: "$sum", Value: 1}}}}}}}}, {Key: "cursor", Value: D{}}},
			`"firstBatch": [{"_id": {"$numberInt":"1"},"n": {"$numberInt":"3"}}]`},
		{D{{Key: "distinct", Value: "readings"}, {Key: "key", Value: "_id"}, {Key: "query", Value: in}}, `{"values": [{"$numberInt":"3"},{"$numberInt":"4"},{"$numberInt":"250"}]`},
	} {
		ib := newIndexedBuckets(t, sb, true)
		p := Plan(rwtest.Doc(t, append(c.cmd, E{Key: "$db", Value: "iot"})), rwtest.Rule(), Options{Caps: rwtest.FerretCaps}, func() int64 { return 1 })
		got := rwtest.JSON(runPlan(t, p, ib))
		if !strings.Contains(got, c.want) {
			t.Errorf("%v:\n got %s\nwant %s", c.cmd, got, c.want)
		}
		if ib.indexReads != 1 || ib.scans != 0 || ib.lookups > 4 {
			t.Errorf("%v: %d index reads, %d scans, %d lookups", c.cmd[0].Key, ib.indexReads, ib.scans, ib.lookups)
		}
	}
}

// memCache is an IDIndexCache in a map.
type memCache map[string]*bucket.IDIndexSnapshot

func (m memCache) Get(ns string) *bucket.IDIndexSnapshot    { return m[ns] }
func (m memCache) Put(ns string, s *bucket.IDIndexSnapshot) { m[ns] = s }

// TestIDIndexCache: a read keeps the index it read; the next reads find
// the marker alone while its version is the same, read the index again
// once a merge changed it, and scan once the marker is gone.
func TestIDIndexCache(t *testing.T) {
	sb, _ := eventScanData(t)
	ib := newIndexedBuckets(t, sb, true)
	ib.version = 7
	cache := memCache{}
	find := func(id int32) []int32 {
		cmd := rwtest.Doc(t, D{{Key: "find", Value: "readings"}, {Key: "filter", Value: D{{Key: "_id", Value: id}}}, {Key: "$db", Value: "iot"}})
		plan, err := PlanRead(cmd, rwtest.Rule(), Options{Caps: rwtest.FerretCaps, IDIndex: cache})
		if err != nil {
			t.Fatal(err)
		}
		return drainPoint(t, plan.Point, ib, 0)
	}
	check := func(what string, got []int32, want int32, index, markers, scans int) {
		t.Helper()
		if len(got) != 1 || got[0] != want || ib.indexReads != index || ib.markerReads != markers || ib.scans != scans {
			t.Fatalf("%s: got %v; %d index reads, %d marker reads, %d scans; want [%d], %d, %d, %d", what, got, ib.indexReads, ib.markerReads, ib.scans, want, index, markers, scans)
		}
	}
	check("first read", find(11), 11, 1, 0, 0)
	check("same version", find(12), 12, 1, 1, 0)
	ib.version = 8
	check("new version", find(13), 13, 2, 2, 0)
	check("kept again", find(14), 14, 2, 3, 0)
	ib.marker = false
	got := find(15)
	if len(got) != 1 || ib.scans == 0 || ib.indexReads != 2 {
		t.Fatalf("no marker: %v, %d scans, %d index reads; want the event scan", got, ib.scans, ib.indexReads)
	}
	if cache[rwtest.Rule().DB+"."+rwtest.Rule().IDIndexCollection()] != nil {
		t.Fatalf("cache after the marker went: %v", cache)
	}
}

// TestIDIndexReadWhereUnwindKeepsFields: on an upstream whose $unwind
// keeps the meta (MongoDB, FerretDB 2.x) a staged rule's find by event
// _id reads the buckets its index names; a direct rule's stays the
// upstream's unwound read (no index there).
func TestIDIndexReadWhereUnwindKeepsFields(t *testing.T) {
	cmd := rwtest.Doc(t, D{{Key: "find", Value: "readings"}, {Key: "filter", Value: D{{Key: "_id", Value: int32(17)}}}, {Key: "$db", Value: "iot"}})
	staged := rwtest.Rule()
	staged.Layout, staged.Ingest = rules.LayoutEvents, rules.IngestStaged
	p, err := PlanRead(cmd, staged, Options{Caps: rwtest.MongoCaps})
	if err != nil || p.Point == nil {
		t.Fatalf("staged rule: %v, point read %v; want the event-id index's point read", err, p != nil && p.Point != nil)
	}
	p, err = PlanRead(cmd, rwtest.Rule(), Options{Caps: rwtest.MongoCaps})
	if err != nil || p.Point != nil {
		t.Fatalf("direct rule: %v, point read %v; want the upstream's read", err, p != nil && p.Point != nil)
	}
}
