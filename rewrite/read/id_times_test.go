package read

import (
	"slices"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
)

// timedBuckets serves reads of buckets whose events have ObjectID _ids
// of many minutes: the event-id index's documents found by _id (the
// marker, the id-time documents), the whole index, and bucket lookups.
type timedBuckets struct {
	byID                              map[bson.ObjectID]bsoncore.Document
	docs                              map[string]bsoncore.Document // the index's documents with string _ids
	entries                           []bsoncore.Document
	indexReads, docReads, lookups, sc int
}

// newTimedBuckets is 20 buckets of 30 events each, whose ids came one
// every 10 seconds, bucket after bucket; times says whether the marker
// vouches for the id-time documents.
func newTimedBuckets(t *testing.T, times bool) (*timedBuckets, []bson.ObjectID) {
	tb := &timedBuckets{byID: map[bson.ObjectID]bsoncore.Document{}, docs: map[string]bsoncore.Document{}}
	marker := bucket.IDIndexMarkerDoc(7)
	if !times {
		marker = rwtest.Doc(t, D{{Key: "_id", Value: bucket.IDIndexMarker}, {Key: "v", Value: int64(7)}, {Key: "series", Value: true}})
	}
	tb.docs[bucket.IDIndexMarker] = marker
	it := &bucket.IDTimes{}
	var ids []bson.ObjectID
	sec := uint32(1_800_000_000)
	for b := range 20 {
		var evs A
		var stored []bucket.Event
		for i := range 30 {
			id := bson.ObjectID{byte(sec >> 24), byte(sec >> 16), byte(sec >> 8), byte(sec), 9, 9, 9, 9, 9, 0, byte(b), byte(i)}
			sec += 10
			ids = append(ids, id)
			ev := rwtest.Doc(t, D{{Key: "_id", Value: id}, {Key: "ts", Value: rwtest.DT(int64(b) * rwtest.Hour)}, {Key: "sensorId", Value: nil}, {Key: "v", Value: int32(i)}})
			evs = append(evs, bson.Raw(ev))
			stored = append(stored, bucket.Event{Stored: ev})
		}
		bid := bson.NewObjectID()
		tb.byID[bid] = rwtest.Doc(t, D{{Key: "_id", Value: bid}, {Key: "meta", Value: "a"}, {Key: "start", Value: rwtest.DT(int64(b) * rwtest.Hour)}, {Key: "count", Value: 30}, {Key: "events", Value: evs}})
		tb.entries = append(tb.entries, bucket.IDIndexEntry(bid, int64(b)*rwtest.Hour, stored))
		it.Add(bid, int64(b+1)*rwtest.Hour, stored, stored, nil)
	}
	stmts := it.Updates()
	for _, st := range stmts {
		// What an upstream makes of each upsert on an empty index.
		id := st.Lookup("q", "_id").StringValue()
		d := D{{Key: "_id", Value: id}}
		elems, _ := st.Lookup("u", "$set").Document().Elements()
		f := D{}
		for _, e := range elems {
			_, data := e.Value().Binary()
			f = append(f, E{Key: e.Key()[2:], Value: bson.Binary{Data: data}})
		}
		tb.docs[id] = rwtest.Doc(t, append(d, E{Key: "f", Value: f}, E{Key: "n", Value: st.Lookup("u", "$inc", "n").Int64()}))
	}
	return tb, ids
}

func (tb *timedBuckets) reply(t *testing.T, cmd []byte) []byte {
	t.Helper()
	d := bsoncore.Document(cmd)
	coll, _ := d.Lookup("find").StringValueOK()
	batch := A{}
	switch id := d.Lookup("filter", "_id"); {
	case coll == rwtest.Rule().IDIndexCollection() && id.Type == bsoncore.TypeString:
		tb.docReads++
		if doc, ok := tb.docs[id.StringValue()]; ok {
			batch = append(batch, bson.Raw(doc))
		}
	case coll == rwtest.Rule().IDIndexCollection():
		tb.indexReads++
		for _, doc := range tb.docs {
			batch = append(batch, bson.Raw(doc))
		}
		for _, e := range tb.entries {
			batch = append(batch, bson.Raw(e))
		}
	case id.Type == bsoncore.TypeObjectID:
		tb.lookups++
		if b, ok := tb.byID[id.ObjectID()]; ok {
			batch = append(batch, bson.Raw(b))
		}
	default:
		tb.sc++
		for _, b := range tb.byID {
			batch = append(batch, bson.Raw(b))
		}
	}
	return rwtest.Doc(t, D{{Key: "cursor", Value: D{{Key: "firstBatch", Value: batch}, {Key: "id", Value: int64(0)}, {Key: "ns", Value: "iot." + coll}}}, {Key: "ok", Value: 1.0}})
}

// TestIDTimesRead: a find by ObjectID _ids reads the marker and the
// id-time documents of the ids' minutes, then only the buckets they
// name, never the whole index; under a marker from before the id-time
// documents it reads the whole index, with the same answer.
func TestIDTimesRead(t *testing.T) {
	for _, v := range []struct{ times, kept bool }{{true, false}, {false, false}, {true, true}} {
		times := v.times
		tb, ids := newTimedBuckets(t, times)
		var cache memCache
		if v.kept {
			// A find by a string _id read the whole index and kept it.
			cache = memCache{}
			cmd := rwtest.Doc(t, D{{Key: "find", Value: "readings"}, {Key: "filter", Value: D{{Key: "_id", Value: "x"}}}, {Key: "$db", Value: "iot"}})
			plan, err := PlanRead(cmd, rwtest.Rule(), Options{Caps: rwtest.FerretCaps, IDIndex: cache})
			if err != nil {
				t.Fatal(err)
			}
			for cmds := plan.Point.Lookups(); cmds != nil; cmds = plan.Point.Lookups() {
				var replies [][]byte
				for _, cmd := range cmds {
					replies = append(replies, tb.reply(t, cmd))
				}
				if err := plan.Point.Feed(replies); err != nil {
					t.Fatal(err)
				}
			}
			if len(cache) == 0 {
				t.Fatal("the whole index was not kept")
			}
		}
		cases := []struct {
			name string
			want []bson.ObjectID
			ask  A
		}{
			{"one id", ids[95:96], A{ids[95]}},
			{"ids of three buckets", []bson.ObjectID{ids[3], ids[300], ids[599]}, A{ids[3], ids[300], ids[599]}},
			{"an id no event has", nil, A{bson.ObjectID{0x6b, 0x49, 0xd2, 0x00, 1}}},
		}
		for _, c := range cases {
			tb.indexReads, tb.docReads, tb.lookups, tb.sc = 0, 0, 0, 0
			cmd := rwtest.Doc(t, D{{Key: "find", Value: "readings"}, {Key: "filter", Value: D{{Key: "_id", Value: D{{Key: "$in", Value: c.ask}}}}}, {Key: "$db", Value: "iot"}})
			opts := Options{Caps: rwtest.FerretCaps}
			if cache != nil {
				opts.IDIndex = cache
			}
			plan, err := PlanRead(cmd, rwtest.Rule(), opts)
			if err != nil || plan.Point == nil || plan.Point.Ids == nil {
				t.Fatalf("%s: not an index read: %v", c.name, err)
			}
			pr := plan.Point
			for cmds := pr.Lookups(); cmds != nil; cmds = pr.Lookups() {
				var replies [][]byte
				for _, cmd := range cmds {
					replies = append(replies, tb.reply(t, cmd))
				}
				if err := pr.Feed(replies); err != nil {
					t.Fatal(err)
				}
			}
			reply, _ := pr.Batch(42)
			vals, _ := bsoncore.Document(reply).Lookup("cursor", "firstBatch").Array().Values()
			var got []bson.ObjectID
			for _, v := range vals {
				got = append(got, v.Document().Lookup("_id").ObjectID())
			}
			slices.SortFunc(got, func(a, b bson.ObjectID) int { return slices.Compare(a[:], b[:]) })
			if !slices.Equal(got, c.want) {
				t.Fatalf("times=%v kept=%v %s: got %v, want %v", times, v.kept, c.name, got, c.want)
			}
			if tb.sc != 0 || tb.lookups > len(c.want) {
				t.Fatalf("times=%v %s: %d scans, %d bucket lookups for %d events", times, c.name, tb.sc, tb.lookups, len(c.want))
			}
			if times && tb.indexReads != 0 {
				t.Fatalf("%s: the whole index read %d times though the id-time documents answer", c.name, tb.indexReads)
			}
			if !times && tb.indexReads != 1 {
				t.Fatalf("%s under an older marker: the whole index read %d times, want once", c.name, tb.indexReads)
			}
		}
	}
}
