package layout

import (
	"fmt"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
	"github.com/tsproxy/tsproxy/rules"
)

// stagedEvents are staged events as a merge reads them back.
func stagedEvents(t testing.TB, rule *rules.Rule, evs ...bson.D) []bucket.Event {
	t.Helper()
	docs := make([]bsoncore.Document, len(evs))
	for i, e := range evs {
		docs[i] = rwtest.Doc(t, e)
	}
	lim, err := bucket.LimitsOf(rule)
	if err != nil {
		t.Fatal(err)
	}
	out, rejected := bucket.PrepareEvents(docs, true, rule, lim, bson.NewObjectID)
	if len(rejected) > 0 {
		t.Fatalf("rejected %+v", rejected)
	}
	return out
}

// storedAs is a StoredBucket: the buckets of keys by window start.
func storedAs(byStart map[int64]bsoncore.Document) StoredBucket {
	return func(k bucket.Key) (bsoncore.Document, bool) {
		d, ok := byStart[k.Start]
		return d, ok
	}
}

func TestCounterMergeWrites(t *testing.T) {
	rule := layoutRule(rules.LayoutCounter, time.Minute, time.Second)
	evs := stagedEvents(t, rule, hit("/b", rwtest.DT(61_000)), hit("/a", rwtest.DT(1_000)), hit("/a", rwtest.DT(1_500)), hit("/a", rwtest.DT(2_000)))
	withMark := func(stmt bson.D) bson.D {
		u := stmt[1].Value.(bson.D)
		stmt[1].Value = append(u, bson.E{Key: "$set", Value: bson.D{{Key: CounterMerged, Value: "m1"}}})
		return stmt
	}
	newA := bson.D{{Key: "_id", Value: bucket.IDOf(rule.BucketNamespace(), rawOf("/a"), 0, 0)}, {Key: "meta", Value: "/a"}, {Key: "start", Value: rwtest.DT(0)},
		{Key: "total", Value: int64(3)}, {Key: "slots", Value: bson.D{{Key: "1", Value: int64(2)}, {Key: "2", Value: int64(1)}}}, {Key: CounterMerged, Value: "m1"}}
	newB := bson.D{{Key: "_id", Value: bucket.IDOf(rule.BucketNamespace(), rawOf("/b"), 60_000, 0)}, {Key: "meta", Value: "/b"}, {Key: "start", Value: rwtest.DT(60_000)},
		{Key: "total", Value: int64(1)}, {Key: "slots", Value: bson.D{{Key: "1", Value: int64(1)}}}, {Key: CounterMerged, Value: "m1"}}
	storedB := rwtest.Doc(t, bson.D{{Key: "_id", Value: 1}})
	markedB := rwtest.Doc(t, bson.D{{Key: "_id", Value: 1}, {Key: CounterMerged, Value: "m1"}})
	cases := []struct {
		name             string
		stored           map[int64]bsoncore.Document
		inserts, updates []bson.D
	}{
		{"no buckets yet: inserted whole, in key order, marked", nil, []bson.D{newA, newB}, nil},
		{"a stored bucket: a marked $inc upsert", map[int64]bsoncore.Document{60_000: storedB}, []bson.D{newA},
			[]bson.D{withMark(counterStmt(rule, "/b", 60_000, bson.D{{Key: "slots.1", Value: int64(1)}}, 1))}},
		{"a bucket that carries the mark: counted by an earlier run, left out", map[int64]bsoncore.Document{60_000: markedB}, []bson.D{newA}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w, err := CounterMergeWrites(rule, GroupStaged(rule, evs), "m1", storedAs(tc.stored), false)
			if err != nil {
				t.Fatal(err)
			}
			if len(w.Inserts) != len(tc.inserts) || len(w.Updates) != len(tc.updates) {
				t.Fatalf("%d inserts and %d updates, want %d and %d", len(w.Inserts), len(w.Updates), len(tc.inserts), len(tc.updates))
			}
			for i := range w.Inserts {
				rwtest.AssertDoc(t, "insert", w.Inserts[i].Doc, tc.inserts[i])
			}
			for i := range w.Updates {
				rwtest.AssertDoc(t, "update", w.Updates[i].Doc, tc.updates[i])
			}
		})
	}
}

func TestSlotsMergeStatements(t *testing.T) {
	// Slot 1 written twice: the later arrival wins; slot 2 was stored
	// with 5 and is overwritten; slot 3 is new.
	samples := func(t *testing.T, rule *rules.Rule) []bucket.Event {
		return stagedEvents(t, rule, sample("/a", rwtest.DT(1_000), int64(4)), sample("/a", rwtest.DT(2_000), int64(6)),
			sample("/a", rwtest.DT(1_200), int64(8)), sample("/a", rwtest.DT(3_000), int64(1)))
	}
	minute := slotsTestRule(time.Minute, true, false)
	hour := slotsTestRule(time.Hour, true, false)
	prealloc := slotsTestRule(2*time.Second*60, false, true)
	whole := func(rule *rules.Rule, rest ...bson.E) bson.D {
		id := bucket.IDOf(rule.BucketNamespace(), rawOf("/a"), 0, 0)
		u := append(bson.D{{Key: "_id", Value: id}, {Key: "meta", Value: "/a"}, {Key: "start", Value: rwtest.DT(0)}}, rest...)
		return bson.D{{Key: "q", Value: bson.D{{Key: "_id", Value: id}}}, {Key: "u", Value: u}, {Key: "upsert", Value: true}}
	}
	grid := func(f func(s int) any) bson.D {
		var g0, g1 bson.D
		for s := range 60 {
			g0 = append(g0, bson.E{Key: fmt.Sprint(s), Value: f(s)})
			g1 = append(g1, bson.E{Key: fmt.Sprint(s), Value: f(60 + s)})
		}
		return bson.D{{Key: "0", Value: g0}, {Key: "1", Value: g1}}
	}
	cases := []struct {
		name   string
		rule   *rules.Rule
		before bson.D
		want   bson.D
	}{
		{"flat, over a stored bucket", minute,
			bson.D{{Key: "_id", Value: 1}, {Key: "num_samples", Value: int64(1)}, {Key: "total_samples", Value: int64(5)}, {Key: "values", Value: bson.D{{Key: "2", Value: int64(5)}}}},
			whole(minute, bson.E{Key: "num_samples", Value: int64(3)}, bson.E{Key: "total_samples", Value: int64(15)},
				bson.E{Key: "values", Value: bson.D{{Key: "1", Value: int64(8)}, {Key: "2", Value: int64(6)}, {Key: "3", Value: int64(1)}}})},
		{"nested by the minute, no bucket yet", hour, nil,
			whole(hour, bson.E{Key: "num_samples", Value: int64(3)}, bson.E{Key: "total_samples", Value: int64(15)},
				bson.E{Key: "values", Value: bson.D{{Key: "0", Value: bson.D{{Key: "1", Value: int64(8)}, {Key: "2", Value: int64(6)}, {Key: "3", Value: int64(1)}}}}})},
		{"preallocated: the whole grid and what was written", prealloc, nil,
			whole(prealloc, bson.E{Key: "num_samples", Value: int64(3)},
				bson.E{Key: "values", Value: grid(func(s int) any {
					return map[int]any{1: int64(8), 2: int64(6), 3: int64(1)}[s]
				})},
				bson.E{Key: "set", Value: grid(func(s int) any { return s >= 1 && s <= 3 })})},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var before bsoncore.Document
			if tc.before != nil {
				before = rwtest.Doc(t, tc.before)
			}
			w, err := SlotsMergeWrites(tc.rule, GroupStaged(tc.rule, samples(t, tc.rule)), func(bucket.Key) (bsoncore.Document, bool) { return before, before != nil }, false)
			if err != nil {
				t.Fatal(err)
			}
			got := w.Updates
			if before == nil {
				// No bucket yet: inserted whole.
				if len(w.Updates) != 0 || len(w.Inserts) != 1 {
					t.Fatalf("%d inserts and %d updates, want one insert", len(w.Inserts), len(w.Updates))
				}
				got = []MergeStatement{{Doc: rwtest.Doc(t, bson.D{{Key: "q", Value: bson.D{{Key: "_id", Value: bson.ObjectID(w.Inserts[0].ID)}}}, {Key: "u", Value: bson.Raw(w.Inserts[0].Doc)}, {Key: "upsert", Value: true}}), Events: w.Inserts[0].Events}}
			}
			if len(got) != 1 || got[0].Events != 4 || w.Events() != 4 {
				t.Fatalf("statements %+v, want one of 4 events", got)
			}
			want := tc.want
			if tc.rule == prealloc {
				// Unwritten slots hold the int32 zero a shell holds.
				u := want[1].Value.(bson.D)
				vals := u[4].Value.(bson.D)
				for _, grp := range vals {
					for j, e := range grp.Value.(bson.D) {
						if e.Value == nil {
							grp.Value.(bson.D)[j].Value = int32(0)
						}
					}
				}
			}
			rwtest.AssertDoc(t, "statement", got[0].Doc, want)
		})
	}
}

func TestMergeCommands(t *testing.T) {
	rule := layoutRule(rules.LayoutCounter, time.Minute, time.Second)
	var evs []bucket.Event
	for s := range 5 {
		evs = append(evs, stagedEvents(t, rule, hit("/p", rwtest.DT(int64(s)*60_000)))...)
	}
	w, err := CounterMergeWrites(rule, GroupStaged(rule, evs), "m", func(bucket.Key) (bsoncore.Document, bool) { return bsoncore.Document{5, 0, 0, 0, 0}, true }, false)
	if err != nil {
		t.Fatal(err)
	}
	stmts := w.Updates
	for _, tc := range []struct{ per, want int }{{0, 1}, {2, 3}, {5, 1}, {16, 1}} {
		cmds := MergeCommands(rule, stmts, tc.per)
		if len(cmds) != tc.want {
			t.Fatalf("per %d: %d commands, want %d", tc.per, len(cmds), tc.want)
		}
		n := 0
		for _, c := range cmds {
			vals, _ := c.Lookup("updates").Array().Values()
			n += len(vals)
			if ordered, _ := c.Lookup("ordered").BooleanOK(); !ordered {
				t.Fatalf("per %d: not ordered", tc.per)
			}
		}
		if n != len(stmts) {
			t.Fatalf("per %d: %d statements sent, want %d", tc.per, n, len(stmts))
		}
	}
}
