package merge_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rewrite/stage/merge"
)

// retire renames m's one open staging collection to its retired name of
// token, as a merge's freeze does, and returns that name.
func retire(t *testing.T, m *mem, token int64) string {
	t.Helper()
	rule := rwtest.InsertRule()
	for _, n := range names(m) {
		if c, ok := stage.Parse(rule, n); ok && !c.Retired() {
			name := stage.RetiredName(n, token)
			m.colls[name] = m.colls[n]
			delete(m.colls, n)
			return name
		}
	}
	t.Fatal("no open staging collection")
	return ""
}

// TestMergeLostTable: a retired collection whose table FerretDB on
// PostgreSQL lost (killed between the two statements of its drop) is set
// aside under its LostName, and the merge goes on with the others; a lost
// table anywhere else stops the merge and sets nothing aside.
func TestMergeLostTable(t *testing.T) {
	rule := rwtest.InsertRule()
	cases := []struct {
		name string
		// ghosts are retired collections with lost tables; retiredToo
		// also retires the open collection (a merge that orders two or
		// more retired collections reads each first).
		ghosts     int
		retiredToo bool
		// lostBuckets: the bucket collection's table is the lost one.
		lostBuckets bool
		// droppedMeanwhile: the ghost is gone by the time it is renamed
		// (a concurrent drop, not a lost table).
		droppedMeanwhile bool
		wantLost         int
		wantErr          bool
	}{
		{name: "one retired collection, lost", ghosts: 1, wantLost: 1},
		{name: "a lost one among retired ones", ghosts: 1, retiredToo: true, wantLost: 1},
		{name: "two lost, one retired", ghosts: 2, retiredToo: true, wantLost: 2},
		{name: "dropped meanwhile: nothing to set aside", ghosts: 1, droppedMeanwhile: true},
		{name: "the bucket collection's table lost: the merge fails", retiredToo: true, lostBuckets: true, wantErr: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := newMem(t)
			stagedInsert(t, m, events("a", 0, 3))
			runMerge(t, m, merge.MergeOptions{All: true})
			var ghosts []string
			for i := range c.ghosts {
				g := stage.RetiredName(rule.StageCollection(36_000_000), int64(i+1))
				m.colls[g] = nil
				m.lost[g] = true
				ghosts = append(ghosts, g)
			}
			stagedInsert(t, m, events("a", 3, 4))
			if c.retiredToo {
				retire(t, m, 100)
			}
			if c.lostBuckets {
				m.lost["readings.buckets"] = true
			}
			if c.droppedMeanwhile {
				m.hook = func(name, coll string) bool {
					if name == "renameCollection" && m.lost[strings.TrimPrefix(coll, "iot.")] {
						delete(m.colls, strings.TrimPrefix(coll, "iot."))
					}
					return false
				}
			}
			mp := merge.NewMerge(rule, merge.MergeOptions{All: true, Now: time.UnixMilli(1_000_000), RetryHorizon: time.Hour})
			res := m.run(mp)
			ok, _ := bson.Raw(res.Reply).Lookup("ok").AsFloat64OK()
			if c.wantErr {
				if ok == 1 {
					t.Fatalf("merge succeeded with the bucket collection's table lost")
				}
				if len(mp.Stats.Lost) != 0 {
					t.Fatalf("set aside %v for a table not theirs", mp.Stats.Lost)
				}
				return
			}
			if ok != 1 {
				t.Fatalf("merge: %s", bson.Raw(res.Reply))
			}
			if len(mp.Stats.Lost) != c.wantLost {
				t.Fatalf("Stats.Lost %v, want %d", mp.Stats.Lost, c.wantLost)
			}
			for _, g := range ghosts {
				if _, still := m.colls[g]; still {
					t.Errorf("%s left under its retired name", g)
				}
				if _, aside := m.colls[stage.LostName(rule, g)]; aside != !c.droppedMeanwhile {
					t.Errorf("%s set aside: %v, want %v", g, aside, !c.droppedMeanwhile)
				}
			}
			checkStoredOnce(t, m, 7)
			// Set aside, it is no collection a merge reads again.
			st := runMerge(t, m, merge.MergeOptions{All: true})
			if st.Collections != 0 || len(st.Lost) != 0 {
				t.Errorf("the next merge: %+v, want nothing merged or set aside", st)
			}
		})
	}
}

func TestLostName(t *testing.T) {
	rule := rwtest.InsertRule()
	open := rule.StageCollection(36_000_000)
	for _, name := range []string{open, stage.RetiredName(open, 7), stage.RetiredName(stage.OpenCollection(rule, 0, stage.Stager{Tag: "0a1b2c3d", Gen: 4}), 9)} {
		lost := stage.LostName(rule, name)
		if !strings.HasPrefix(lost, rule.StagePrefix()) {
			t.Errorf("LostName(%s) = %s: not in the staging tier's names (hidden, dropped with them)", name, lost)
		}
		if _, ok := stage.Parse(rule, lost); ok {
			t.Errorf("LostName(%s) = %s parses as a staging collection", name, lost)
		}
		if stage.IsFlushMarker(rule, lost) || slices.Contains([]string{stage.TxnsCollection(rule), rule.IDIndexCollection()}, lost) {
			t.Errorf("LostName(%s) = %s is another collection of the tier", name, lost)
		}
	}
}

// TestMergeTwoAttemptsOfAWrite: a staging collection FerretDB on
// PostgreSQL created without its unique _id index (killed between the
// two) takes a retried write's second attempt as a second document of
// the same _id. Its events are merged once. (The layouts' merges take
// their staged documents from the same reading, splitRetired.)
func TestMergeTwoAttemptsOfAWrite(t *testing.T) {
	m := newMem(t)
	stagedInsert(t, m, events("a", 0, 3), retryArgs(7)...)
	stagedInsert(t, m, events("a", 3, 2))
	open := rwtest.InsertRule().StageCollection(36_000_000)
	docs := m.colls[open]
	if len(docs) != 2 {
		t.Fatalf("%d staged documents, want 2", len(docs))
	}
	m.colls[open] = append(docs, docs[0]) // the retry, past no unique index
	if st := runMerge(t, m, merge.MergeOptions{All: true}); st.Events != 5 {
		t.Errorf("the merge wrote %d events, want 5", st.Events)
	}
	checkStoredOnce(t, m, 5)
}
