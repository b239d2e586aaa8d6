package merge_test

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/insert"
	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
	"github.com/tsproxy/tsproxy/rewrite/layout"
	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rewrite/stage/merge"
	"github.com/tsproxy/tsproxy/rules"
)

func TestKeptDocs(t *testing.T) {
	a, b, c := doc(bson.D{{Key: "_id", Value: 1}}), doc(bson.D{{Key: "_id", Value: 2}}), doc(bson.D{{Key: "_id", Value: 3}})
	u := rewrite.Upstream{Body: doc(bson.D{{Key: "insert", Value: "s"}, {Key: "$db", Value: "iot"}}),
		Seq: &rewrite.Sequence{Identifier: "documents", Documents: []bsoncore.Document{a, b, c}}}
	werr := func(i, code int) bson.D {
		return bson.D{{Key: "index", Value: i}, {Key: "code", Value: code}, {Key: "errmsg", Value: "x"}}
	}
	for _, tc := range []struct {
		name  string
		reply bson.D
		want  int // documents kept; -1: nothing known
	}{
		{"all stored", bson.D{{Key: "n", Value: 3}, {Key: "ok", Value: 1.0}}, 3},
		{"a retry's duplicate is there already", bson.D{{Key: "n", Value: 2}, {Key: "writeErrors", Value: bson.A{werr(1, 11000)}}, {Key: "ok", Value: 1.0}}, 2},
		{"another write error", bson.D{{Key: "n", Value: 2}, {Key: "writeErrors", Value: bson.A{werr(1, 2)}}, {Key: "ok", Value: 1.0}}, -1},
		{"counts that do not add up", bson.D{{Key: "n", Value: 1}, {Key: "ok", Value: 1.0}}, -1},
		{"a write error without an index", bson.D{{Key: "n", Value: 2}, {Key: "writeErrors", Value: bson.A{bson.D{{Key: "code", Value: 11000}}}}, {Key: "ok", Value: 1.0}}, -1},
		{"a write concern error", bson.D{{Key: "n", Value: 3}, {Key: "writeConcernError", Value: bson.D{{Key: "code", Value: 64}}}, {Key: "ok", Value: 1.0}}, -1},
		{"a failed command", bson.D{{Key: "ok", Value: 0.0}, {Key: "code", Value: 1}}, -1},
		{"no n", bson.D{{Key: "ok", Value: 1.0}}, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			docs, ok := stage.KeptDocs(u, doc(tc.reply))
			if tc.want < 0 {
				if ok {
					t.Fatalf("kept %d documents, want none known", len(docs))
				}
				return
			}
			if !ok || len(docs) != tc.want {
				t.Fatalf("kept %d (%v), want %d", len(docs), ok, tc.want)
			}
		})
	}
	if db, coll := stage.KeptTarget(u); db != "iot" || coll != "s" {
		t.Fatalf("KeptTarget = %s.%s", db, coll)
	}
}

// keeper keeps what staged inserts marked Keep stored, as the proxy does
// (proxy/kept.go): the collection created and its marker inserted before
// the first insert into it.
type keeper struct {
	m       *mem
	docs    map[string][][]byte
	marker  map[string]string
	spoiled map[string]bool
	next    int
	// spare, when set, is a spare collection and its marker, which the
	// next first insert into a collection renames to it (proxy's
	// useSpare) instead of creating one.
	spare, spareMarker string
}

func newKeeper(m *mem) *keeper {
	return &keeper{m: m, docs: map[string][][]byte{}, marker: map[string]string{}, spoiled: map[string]bool{}}
}

func (k *keeper) answer(u rewrite.Upstream) []byte {
	if !u.Keep {
		return k.m.answer(u)
	}
	db, coll := stage.KeptTarget(u)
	if _, seen := k.marker[coll]; !seen && !k.spoiled[coll] && k.spare != "" {
		ok := bsoncore.Document(k.m.answer(rewrite.Upstream{Body: stage.SpareRenameCommand(db, k.spare, coll)})).Lookup("ok").Double() == 1
		if ok {
			k.marker[coll] = k.spareMarker
		}
		k.spare, k.spareMarker = "", ""
	}
	if _, seen := k.marker[coll]; !seen && !k.spoiled[coll] {
		k.next++
		id := stage.MarkerID(string(rune('a' + k.next)))
		create, marker := stage.MarkerCommands(db, coll, id)
		if !bsoncore.Document(k.m.answer(rewrite.Upstream{Body: create})).Lookup("ok").Equal(bsoncore.Value{Type: bsoncore.TypeDouble, Data: bsoncore.AppendDouble(nil, 1)}) {
			k.spoiled[coll] = true
		} else if docs, ok := stage.KeptDocs(marker, k.m.answer(marker)); ok && len(docs) == 1 {
			k.marker[coll] = id
		} else {
			k.spoiled[coll] = true
		}
	}
	reply := k.m.answer(u)
	if docs, ok := stage.KeptDocs(u, reply); ok && !k.spoiled[coll] {
		k.docs[coll] = append(k.docs[coll], docs...)
	} else {
		k.spoiled[coll] = true
	}
	return reply
}

func (k *keeper) run(p rewrite.Plan) rewrite.Result {
	k.m.t.Helper()
	return k.m.runWith(p, k.answer)
}

// take is a Host's TakeKept.
func (k *keeper) take(r stage.Collection) ([][]byte, string, bool) {
	name := r.OpenName()
	docs, marker, spoiled := k.docs[name], k.marker[name], k.spoiled[name]
	delete(k.docs, name)
	delete(k.marker, name)
	return docs, marker, marker != "" && !spoiled
}

func (k *keeper) stage(t *testing.T, evs []bson.D, stager stage.Stager) {
	t.Helper()
	cmd := rwtest.SeqCmd(t, evs)
	pi, err := insert.Prepare(cmd, rwtest.InsertRule(), bson.NewObjectID)
	if err != nil {
		t.Fatal(err)
	}
	if r := k.run(stage.Insert(cmd, pi, stage.InsertEnv{Identity: "u", NewObjectID: bson.NewObjectID, Stager: stager})); bson.Raw(r.Reply).Lookup("ok").Double() != 1 {
		t.Fatalf("staged insert: %s", bson.Raw(r.Reply))
	}
}

// eventsStored adds up the bucket collection's counts.
func eventsStored(m *mem) int64 {
	var n int64
	for _, b := range m.colls["readings.buckets"] {
		c, _ := b.Lookup("count").AsInt64OK()
		n += c
	}
	return n
}

// TestMergeKept: a proxy's merge of its own staging collection takes
// what the proxy kept of its inserts instead of reading the collection
// back, when the collection holds the marker; a collection taken over
// meanwhile (its name made again without a marker) or one whose insert
// outcome is not known is read back; either way every event is stored
// once.
func TestMergeKept(t *testing.T) {
	rule := rwtest.InsertRule()
	a := stage.Stager{Tag: stage.StagerTag("host/a"), Gen: 100}
	b := stage.Stager{Tag: stage.StagerTag("host/b"), Gen: 100}
	open := stage.OpenCollection(rule, 36_000_000, a)
	// reads counts the finds of a retired collection of a's that read
	// what it holds (not its marker).
	reads := func(m *mem) *int {
		n := 0
		m.hook = func(name, coll string) bool {
			if c, ok := stage.Parse(rule, coll); ok && c.Retired() && name == "find" {
				n++
			}
			return false
		}
		return &n
	}
	holder := func(k *keeper) merge.MergeOptions {
		return merge.MergeOptions{All: true, Self: a.Tag, Since: 100, Host: &hooks{kept: k.take}}
	}

	t.Run("kept: not read back", func(t *testing.T) {
		m := newMem(t)
		k := newKeeper(m)
		for i := range 7 {
			k.stage(t, events("a", i, 1), a)
		}
		k.stage(t, events("b", 0, 4), a)
		n := reads(m)
		st := mergeRule(t, m, rule, holder(k))
		if st.Kept != 1 || st.Events != 11 || *n != 1 {
			t.Fatalf("stats %+v, %d finds of the retired collection: want 11 events kept, 1 find (the marker's)", st, *n)
		}
		// The same buckets as a merge that reads back.
		m2 := newMem(t)
		k2 := newKeeper(m2)
		for i := range 7 {
			k2.stage(t, events("a", i, 1), a)
		}
		k2.stage(t, events("b", 0, 4), a)
		mergeRule(t, m2, rule, merge.MergeOptions{All: true, Self: a.Tag, Since: 100})
		if len(m.colls["readings.buckets"]) != len(m2.colls["readings.buckets"]) {
			t.Fatalf("%d buckets kept, %d read back", len(m.colls["readings.buckets"]), len(m2.colls["readings.buckets"]))
		}
		for i, d := range m2.colls["readings.buckets"] {
			if !bson.Raw(d).Lookup("events").Equal(bson.Raw(m.colls["readings.buckets"][i]).Lookup("events")) {
				t.Fatalf("bucket %d differs:\nkept %s\nread %s", i, bson.Raw(m.colls["readings.buckets"][i]), bson.Raw(d))
			}
		}
		if st := mergeRule(t, m, rule, holder(k)); st.Events != 0 {
			t.Fatalf("a second merge %+v", st)
		}
	})

	t.Run("taken over meanwhile: read back, nothing twice", func(t *testing.T) {
		m := newMem(t)
		k := newKeeper(m)
		k.stage(t, events("a", 0, 3), a)
		// b holds the lease and takes a's collection over (a's presence
		// lapsed), and merges it.
		announce(m, rule, a.Tag, false)
		if st := mergeRule(t, m, rule, merge.MergeOptions{All: true, Self: b.Tag, Since: 100, TakeOver: true}); st.Events != 3 {
			t.Fatalf("takeover %+v", st)
		}
		// a did not notice: its next insert makes its collection again,
		// without a marker.
		k.stage(t, events("a", 3, 2), a)
		if _, ok := m.colls[open]; !ok {
			t.Fatalf("%s not made again", open)
		}
		n := reads(m)
		st := mergeRule(t, m, rule, holder(k))
		if st.Kept != 0 || st.Events != 2 || *n != 2 {
			t.Fatalf("stats %+v, %d finds: want 2 events read back", st, *n)
		}
		if got := eventsStored(m); got != 5 {
			t.Fatalf("%d events stored, want 5", got)
		}
	})

	t.Run("an insert's outcome not known: read back", func(t *testing.T) {
		m := newMem(t)
		k := newKeeper(m)
		k.stage(t, events("a", 0, 2), a)
		calls := 0
		m.hook = func(name, coll string) bool {
			if name == "insert" && coll == open {
				calls++
				return calls == 1 // the next insert fails: what reached the collection is not known
			}
			return false
		}
		cmd := rwtest.SeqCmd(t, events("a", 2, 1))
		pi, _ := insert.Prepare(cmd, rule, bson.NewObjectID)
		k.run(stage.Insert(cmd, pi, stage.InsertEnv{Identity: "u", NewObjectID: bson.NewObjectID, Stager: a}))
		k.stage(t, events("a", 3, 1), a)
		m.hook = nil
		st := mergeRule(t, m, rule, holder(k))
		if st.Kept != 0 || st.Events != 3 {
			t.Fatalf("stats %+v: want the 3 stored events read back", st)
		}
	})

	t.Run("a collection made before the proxy's first insert: read back", func(t *testing.T) {
		m := newMem(t)
		m.colls[open] = []bsoncore.Document{} // made by a run of a with the same generation
		k := newKeeper(m)
		k.stage(t, events("a", 0, 2), a)
		if st := mergeRule(t, m, rule, holder(k)); st.Kept != 0 || st.Events != 2 {
			t.Fatalf("stats %+v", st)
		}
	})

	t.Run("layouts: a counter merge takes what was kept", func(t *testing.T) {
		m := newMem(t)
		k := newKeeper(m)
		counter := hitsRule(rules.LayoutCounter)
		for i := range 5 {
			cmd := hitsCmd(t, hits("/a", 1, i, 61+i))
			pi, err := layout.PrepareStaged(cmd, counter, bson.NewObjectID)
			if err != nil {
				t.Fatal(err)
			}
			k.run(stage.Insert(cmd, pi, stage.InsertEnv{Identity: "u", NewObjectID: bson.NewObjectID, Stager: a}))
		}
		n := 0
		m.hook = func(name, coll string) bool {
			if c, ok := stage.Parse(counter, coll); ok && c.Retired() && name == "find" {
				n++
			}
			return false
		}
		st := mergeRule(t, m, counter, merge.MergeOptions{All: true, Self: a.Tag, Since: 100, Host: &hooks{kept: k.take}, RollupStatements: 1})
		if st.Kept != 1 || n != 1 {
			t.Fatalf("stats %+v, %d finds", st, n)
		}
		var total int64
		for _, b := range layoutBuckets(t, m) {
			c, _ := counterOf(t, b)
			total += c
		}
		if total != 10 {
			t.Fatalf("%d hits counted, want 10", total)
		}
	})
}
