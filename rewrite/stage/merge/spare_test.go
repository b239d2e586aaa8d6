package merge_test

import (
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rewrite/stage/merge"
)

// TestMergeRecycle: a merge asked to recycle (before a read) keeps the
// retired collection it merged from what the proxy kept as a spare; once
// cleaned to its marker, the proxy's next first insert renames the spare
// to its new staging collection, whose merge still takes what was kept;
// a spare name taken, or a merge cut before its rename, drops the
// collection instead (the cut one at the next merge), and nothing is
// stored twice.
func TestMergeRecycle(t *testing.T) {
	rule := rwtest.InsertRule()
	a := stage.Stager{Tag: stage.StagerTag("host/a"), Gen: 100}
	spare := stage.SpareName(rule, a.Tag, 7)
	type outcome struct {
		asked, made bool
		marker      string
	}
	recycling := func(k *keeper, o *outcome) merge.MergeOptions {
		return merge.MergeOptions{All: true, Self: a.Tag, Since: 100, Now: time.UnixMilli(1_000_000),
			Host: &hooks{kept: k.take, reserve: func(stage.Collection) (string, bool) {
				o.asked = true
				return spare, true
			}, renamed: func(_ string, ok bool, marker string) { o.made, o.marker = ok, marker }}}
	}
	stagingLeft := func(m *mem) []string {
		var out []string
		for name := range m.colls {
			if _, ok := stage.Parse(rule, name); ok {
				out = append(out, name)
			}
		}
		return out
	}

	t.Run("kept as a spare, cleaned, then renamed by the next first insert", func(t *testing.T) {
		m := newMem(t)
		k := newKeeper(m)
		k.stage(t, events("a", 0, 2), a)
		var o outcome
		st := mergeRule(t, m, rule, recycling(k, &o))
		if st.Spares != 1 || st.Collections != 1 || st.Events != 2 || !o.made || o.marker == "" {
			t.Fatalf("stats %+v, outcome %+v: want the merged collection kept as a spare", st, o)
		}
		if left := stagingLeft(m); len(left) != 0 {
			t.Fatalf("staging collections left: %v", left)
		}
		// What the proxy does next: clean it to its marker.
		m.run(rewrite.Passthrough(stage.SpareCleanCommand(rule.DB, spare, o.marker), nil))
		if docs := m.colls[spare]; len(docs) != 1 || bson.Raw(docs[0]).Lookup("_id").StringValue() != o.marker {
			t.Fatalf("the cleaned spare holds %d documents, want its marker only", len(docs))
		}
		// The next generation's first insert takes the spare.
		next := stage.Stager{Tag: a.Tag, Gen: 101}
		k.spare, k.spareMarker = spare, o.marker
		k.stage(t, events("a", 2, 3), next)
		if _, ok := m.colls[spare]; ok {
			t.Fatal("the spare is still there after the first insert")
		}
		open := stage.OpenCollection(rule, 36_000_000, next)
		if got := len(m.colls[open]); got != 2 { // the marker and the staged document
			t.Fatalf("%s holds %d documents, want the marker and one staged", open, got)
		}
		// Its merge takes what was kept (the marker is there), and a
		// merge without Recycle drops it.
		st = mergeRule(t, m, rule, merge.MergeOptions{All: true, Self: a.Tag, Since: 100, Host: &hooks{kept: k.take}, Now: time.UnixMilli(1_000_100)})
		if st.Kept != 1 || st.Events != 3 || st.Spares != 0 {
			t.Fatalf("stats %+v: want the 3 events merged from what was kept", st)
		}
		if got := eventsStored(m); got != 5 {
			t.Fatalf("%d events stored, want 5", got)
		}
		if left := stagingLeft(m); len(left) != 0 {
			t.Fatalf("staging collections left: %v", left)
		}
	})

	t.Run("a spare name taken: dropped", func(t *testing.T) {
		m := newMem(t)
		m.colls[spare] = nil
		k := newKeeper(m)
		k.stage(t, events("a", 0, 2), a)
		var o outcome
		st := mergeRule(t, m, rule, recycling(k, &o))
		if st.Spares != 0 || st.Collections != 1 || !o.asked || o.made {
			t.Fatalf("stats %+v, outcome %+v: want the collection dropped", st, o)
		}
		if left := stagingLeft(m); len(left) != 0 {
			t.Fatalf("staging collections left: %v", left)
		}
	})

	t.Run("read back (nothing kept): dropped, no spare asked for", func(t *testing.T) {
		m := newMem(t)
		k := newKeeper(m)
		k.stage(t, events("a", 0, 2), a)
		var o outcome
		opts := recycling(k, &o)
		opts.Host.(*hooks).kept = nil
		if st := mergeRule(t, m, rule, opts); st.Spares != 0 || o.asked || st.Events != 2 {
			t.Fatalf("stats %+v, outcome %+v", st, o)
		}
	})

	t.Run("cut before the rename: finished once by the next merge", func(t *testing.T) {
		m := newMem(t)
		k := newKeeper(m)
		k.stage(t, events("a", 0, 2), a)
		k.stage(t, events("b", 0, 1), a)
		m.hook = func(name, coll string) bool {
			// The rename to the spare fails, and so does the drop after
			// it: the merge stops with the retired collection merged.
			r, ok := stage.Parse(rule, strings.TrimPrefix(coll, "iot."))
			return ok && r.Retired() && (name == "renameCollection" || name == "drop")
		}
		var o outcome
		res := k.run(merge.NewMerge(rule, recycling(k, &o)))
		if msg, _ := bson.Raw(res.Reply).Lookup("errmsg").StringValueOK(); msg == "" || o.made {
			t.Fatalf("the cut merge: %s (%+v)", bson.Raw(res.Reply), o)
		}
		if left := stagingLeft(m); len(left) != 1 {
			t.Fatalf("left %v, want the retired collection", left)
		}
		m.hook = nil
		st := mergeRule(t, m, rule, merge.MergeOptions{All: true, Self: a.Tag, Since: 100, Now: time.UnixMilli(1_000_100)})
		if st.Collections != 1 {
			t.Fatalf("the next merge %+v: want the cut merge finished", st)
		}
		if got := eventsStored(m); got != 3 {
			t.Fatalf("%d events stored, want 3", got)
		}
		if left := stagingLeft(m); len(left) != 0 {
			t.Fatalf("staging collections left: %v", left)
		}
	})
}

func TestSpareNames(t *testing.T) {
	rule := rwtest.InsertRule()
	tag := stage.StagerTag("host/a")
	name := stage.SpareName(rule, tag, 1_700_000_000_000)
	if got, token, ok := stage.ParseSpare(rule, name); !ok || got != tag || token != 1_700_000_000_000 {
		t.Fatalf("ParseSpare(%s) = %s %d %v", name, got, token, ok)
	}
	if _, ok := stage.Parse(rule, name); ok {
		t.Fatalf("%s reads as a staging collection: reads would take it for staged work", name)
	}
	for _, bad := range []string{rule.StagePrefix() + "spare_", rule.StagePrefix() + "spare_xyz_1", rule.StagePrefix() + "spare_" + tag + "_01", rule.IDIndexCollection()} {
		if _, _, ok := stage.ParseSpare(rule, bad); ok {
			t.Fatalf("ParseSpare(%s) ok", bad)
		}
	}
	open := stage.OpenCollection(rule, 36_000_000, stage.Stager{Tag: tag, Gen: 3})
	key, ok := stage.SpareKey(rule.DB, open)
	if !ok || key != stage.RuleSpareKey(rule) {
		t.Fatalf("SpareKey(%s) = %s %v, want %s", open, key, ok, stage.RuleSpareKey(rule))
	}
	if _, ok := stage.SpareKey(rule.DB, "readings"); ok {
		t.Fatal("SpareKey of a collection outside the staging tier")
	}
}
