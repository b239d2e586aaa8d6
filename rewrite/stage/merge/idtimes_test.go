package merge_test

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
	"github.com/tsproxy/tsproxy/rewrite/stage/merge"
)

// upsertIDTime applies an id-time document's statement as an upstream
// does: {_id} with $set, $inc, $max and upsert, or a split's {$set: {x:
// true}}.
func (m *mem) upsertIDTime(coll string, st bsoncore.Document) {
	if q := st.Lookup("q").Document(); len(mustElems(m.t, q)) != 1 {
		// FerretDB v1.24 pushes down a filter that is {_id} alone, and
		// scans the whole index collection for any other.
		m.t.Fatalf("id-time statement filter %s is not {_id} alone", bson.Raw(q))
	}
	id := st.Lookup("q", "_id")
	i := slices.IndexFunc(m.colls[coll], func(d bsoncore.Document) bool { return d.Lookup("_id").Equal(id) })
	var cur bson.M
	if i >= 0 {
		if err := bson.Unmarshal(m.colls[coll][i], &cur); err != nil {
			m.t.Fatal(err)
		}
	}
	if cur == nil {
		if up, _ := st.Lookup("upsert").BooleanOK(); !up {
			return
		}
		s, _ := id.StringValueOK()
		cur = bson.M{"_id": s}
	}
	elems, _ := st.Lookup("u").Document().Elements()
	for _, op := range elems {
		fields, _ := op.Value().Document().Elements()
		for _, f := range fields {
			key := f.Key()
			switch op.Key() {
			case "$set":
				if sub, ok := strings.CutPrefix(key, "f."); ok {
					filters, _ := cur["f"].(bson.M)
					if filters == nil {
						filters = bson.M{}
					}
					_, data := f.Value().Binary()
					filters[sub] = bson.Binary{Data: data}
					cur["f"] = filters
					continue
				}
				cur[key] = f.Value().Boolean()
			case "$inc":
				n, _ := cur[key].(int64)
				cur[key] = n + f.Value().Int64()
			case "$max":
				w, _ := cur[key].(bson.DateTime)
				cur[key] = max(w, bson.DateTime(f.Value().DateTime()))
			}
		}
	}
	d, err := bson.Marshal(cur)
	if err != nil {
		m.t.Fatal(err)
	}
	if i >= 0 {
		m.colls[coll][i] = d
	} else {
		m.colls[coll] = append(m.colls[coll], d)
	}
}

// idTimeDocs are the id-time documents of the rule's event-id index, by
// _id.
func idTimeDocs(m *mem) map[string]bsoncore.Document {
	out := map[string]bsoncore.Document{}
	for _, d := range m.colls[rwtest.InsertRule().IDIndexCollection()] {
		if bucket.IsIDTimeDoc(d) {
			out[d.Lookup("_id").StringValue()] = d
		}
	}
	return out
}

// TestMergeWritesIDTimes: a merge files each bucket's events under the
// minute of their ObjectID _ids before it writes the bucket, and a read
// by those ids finds exactly the buckets that hold them; a top-up
// replaces the bucket's filter with one of all its events.
func TestMergeWritesIDTimes(t *testing.T) {
	m := newMem(t)
	at := oidAt
	const t0 = 1_800_000_000 - 1_800_000_000%60 // a minute's first second
	ev := func(id bson.ObjectID, s string, ms int64) bson.D {
		return rwtest.Event(id, rwtest.DT(ms), s, 1.0)
	}
	stagedInsert(t, m, []bson.D{ev(at(t0+1, 1), "a", 36_000_000), ev(at(t0+2, 2), "b", 36_000_000), ev(at(t0+61, 3), "a", 36_001_000)})
	runMerge(t, m, merge.MergeOptions{All: true, TopUp: true, Now: time.UnixMilli(36_100_000)})
	docs := idTimeDocs(m)
	if len(docs) != 2 {
		t.Fatalf("id-time documents %v, want the two minutes of the ids", keys(docs))
	}
	find := func(ids ...bson.ObjectID) []bson.ObjectID {
		t.Helper()
		got, ok, _ := lookupIDTimes(t, m, ids...)
		if !ok {
			t.Fatal("the id-time documents do not answer under a marker that vouches for them")
		}
		return got
	}
	bucketOf := func(s string, start int64) bson.ObjectID { return rwtest.BucketID(t, s, start, 0) }
	if got := find(at(t0+1, 1)); !slices.Equal(got, []bson.ObjectID{bucketOf("a", 36_000_000)}) {
		t.Fatalf("candidates of a's first id %v, want a's bucket %v", got, bucketOf("a", 36_000_000))
	}
	if got := find(at(t0+2, 2), at(t0+61, 3)); len(got) != 2 {
		t.Fatalf("candidates of b's id and a's second %v, want both series' buckets", got)
	}
	if got := find(at(t0+3, 9)); len(got) != 0 {
		t.Fatalf("candidates of an id no event has %v, want none", got)
	}
	// A top-up of a's bucket with an event of the first minute: the
	// minute's filter of a's bucket holds both of its events of it.
	stagedInsert(t, m, []bson.D{ev(at(t0+30, 4), "a", 36_002_000)})
	runMerge(t, m, merge.MergeOptions{All: true, TopUp: true, Now: time.UnixMilli(36_100_000)})
	for _, id := range []bson.ObjectID{at(t0+1, 1), at(t0+30, 4)} {
		if got := find(id); !slices.Equal(got, []bson.ObjectID{bucketOf("a", 36_000_000)}) {
			t.Fatalf("after the top-up, candidates of %v: %v, want a's bucket", id, got)
		}
	}
}

// lookupIDTimes runs an id-time lookup of ids against m's event-id index:
// the candidate buckets, whether the documents answered, in how many
// rounds of finds.
func lookupIDTimes(t *testing.T, m *mem, ids ...bson.ObjectID) ([]bson.ObjectID, bool, int) {
	t.Helper()
	coll := rwtest.InsertRule().IDIndexCollection()
	vals := make([]bsoncore.Value, len(ids))
	for i, id := range ids {
		vals[i] = bsoncore.Value{Type: bsoncore.TypeObjectID, Data: id[:]}
	}
	l := bucket.NewIDTimeLookup(bucket.NewIDSet(vals))
	if l == nil {
		t.Fatal("no id-time lookup for ObjectIDs")
	}
	rounds := 0
	for cmds := l.Finds(coll, "iot"); len(cmds) > 0; cmds = l.Finds(coll, "iot") {
		rounds++
		found := make([]bsoncore.Document, len(cmds))
		for i, c := range cmds {
			want := c.Lookup("filter", "_id")
			for _, d := range m.colls[coll] {
				if d.Lookup("_id").Equal(want) {
					found[i] = d
				}
			}
		}
		l.Take(found)
	}
	got, ok := l.Candidates()
	return got, ok, rounds
}

// oidAt is an ObjectID of unix second sec, n its last byte.
func oidAt(sec uint32, n byte) bson.ObjectID {
	return bson.ObjectID{byte(sec >> 24), byte(sec >> 16), byte(sec >> 8), byte(sec), 1, 2, 3, 4, 5, 0, 0, n}
}

func keys(m map[string]bsoncore.Document) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestMergeSplitsFullIDTimes: a minute whose document the merge would
// fill (bulk ingest), as found, is marked split and its new events filed
// by second, which a lookup reads after the minute's mark; a second it
// would fill is marked too, and a lookup of its ids says the documents
// cannot answer.
func TestMergeSplitsFullIDTimes(t *testing.T) {
	m := newMem(t)
	rule := rwtest.InsertRule()
	coll := rule.IDIndexCollection()
	const t0 = 1_800_000_000 - 1_800_000_000%60
	at := oidAt
	// The index as an earlier merge left it: the minute already full,
	// and one second of the next minute too.
	stagedInsert(t, m, []bson.D{rwtest.Event(at(t0-60, 9), rwtest.DT(35_000_000), "z", 1.0)})
	runMerge(t, m, merge.MergeOptions{All: true, Now: time.UnixMilli(36_100_000)})
	m.colls[coll] = append(m.colls[coll],
		doc(bson.D{{Key: "_id", Value: "m:" + itoa(t0/60)}, {Key: "n", Value: int64(20_000)}}),
		doc(bson.D{{Key: "_id", Value: "m:" + itoa(t0/60+1)}, {Key: "n", Value: int64(20_000)}, {Key: "x", Value: true}}),
		doc(bson.D{{Key: "_id", Value: "s:" + itoa(t0+65)}, {Key: "n", Value: int64(500_000)}}))
	stagedInsert(t, m, []bson.D{
		rwtest.Event(at(t0+5, 1), rwtest.DT(36_000_000), "a", 1.0),
		rwtest.Event(at(t0+65, 2), rwtest.DT(36_000_000), "b", 1.0),
	})
	runMerge(t, m, merge.MergeOptions{All: true, Now: time.UnixMilli(36_100_000)})
	docs := idTimeDocs(m)
	if x, _ := docs["m:"+itoa(t0/60)].Lookup("x").BooleanOK(); !x {
		t.Fatalf("the full minute is not marked split: %s", bson.Raw(docs["m:"+itoa(t0/60)]))
	}
	if _, ok := docs["s:"+itoa(t0+5)]; !ok {
		t.Fatalf("the event of the full minute is not filed by second: %v", keys(docs))
	}
	if x, _ := docs["s:"+itoa(t0+65)].Lookup("x").BooleanOK(); !x {
		t.Fatalf("the full second is not marked: %s", bson.Raw(docs["s:"+itoa(t0+65)]))
	}
	got, ok, rounds := lookupIDTimes(t, m, at(t0+5, 1))
	if !ok || rounds != 2 || !slices.Equal(got, []bson.ObjectID{rwtest.BucketID(t, "a", 36_000_000, 0)}) {
		t.Fatalf("lookup of the split minute's id: %v ok=%v in %d rounds, want a's bucket in 2", got, ok, rounds)
	}
	if _, ok, _ := lookupIDTimes(t, m, at(t0+65, 2)); ok {
		t.Fatal("a lookup of a full second's id answered; it must read the whole index")
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
