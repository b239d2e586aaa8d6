package merge_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
	"github.com/tsproxy/tsproxy/rewrite/stage/merge"
)

func TestNextInserts(t *testing.T) {
	const mb = 1 << 20
	rep := func(n, size int) []int { return slices.Repeat([]int{size}, n) }
	cases := []struct {
		name    string
		sizes   []int
		streams int
		want    []int
	}{
		{"one stream: one insert", rep(40, 100_000), 1, []int{40}},
		{"no streams asked: one insert", rep(40, 100_000), 0, []int{40}},
		{"under 1 MiB: one insert", rep(10, 100_000), 2, []int{10}},
		{"two halves", rep(40, 100_000), 2, []int{20, 20}},
		{"odd count: the bytes shared", rep(41, 100_000), 2, []int{21, 20}},
		{"uneven sizes: by bytes, not by count", append(rep(1, 3*mb), rep(30, 100_000)...), 2, []int{1, 30}},
		{"three streams", rep(30, 100_000), 3, []int{10, 10, 10}},
		{"past what streams inserts take: the rest waits", rep(3000, 1000), 2, []int{1000, 1000}},
		{"one big bucket: one insert", []int{5 * mb}, 2, []int{1}},
		{"a share over the insert's bound: one at a time", []int{7 * mb, 7 * mb, 100}, 2, []int{1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := merge.NextInsertLens(c.sizes, c.streams); !slices.Equal(got, c.want) {
				t.Fatalf("nextInserts: %v, want %v", got, c.want)
			}
		})
	}
}

// bigEvents are n events of series s from from on, each with 100 KB of
// padding: three make a bucket of 300 KB (maxEvents 3).
func bigEvents(s string, from, n int) []bson.D {
	evs := events(s, from, n)
	for i := range evs {
		evs[i] = append(evs[i], bson.E{Key: "pad", Value: strings.Repeat("x", 100_000)})
	}
	return evs
}

// bucketInserts are the inserts into the bucket collection among a
// step's commands.
func bucketInserts(step rewrite.Step) []rewrite.Upstream {
	var out []rewrite.Upstream
	for _, u := range step {
		if coll, _ := bsoncore.Document(u.Body).Lookup("insert").StringValueOK(); coll == "readings.buckets" {
			out = append(out, u)
		}
	}
	return out
}

// recorded is a plan whose steps' bucket inserts are recorded.
type recorded struct {
	rewrite.Plan
	steps [][]rewrite.Upstream
}

func (r *recorded) Next() (rewrite.Step, bool) {
	step, done := r.Plan.Next()
	if ins := bucketInserts(step); len(ins) > 0 {
		r.steps = append(r.steps, ins)
	}
	return step, done
}

func TestMergeParallelInserts(t *testing.T) {
	runMerge := func(t *testing.T, m *mem, streams int, answer func(rewrite.Upstream) []byte) (*merge.Merge, [][]rewrite.Upstream, bool) {
		t.Helper()
		mp := merge.NewMerge(rwtest.InsertRule(), merge.MergeOptions{All: true, InsertStreams: streams, RetryHorizon: time.Hour, Now: time.UnixMilli(1_000_000)})
		rec := &recorded{Plan: mp}
		res := m.runWith(rec, answer)
		ok, _ := bson.Raw(res.Reply).Lookup("ok").AsFloat64OK()
		return mp, rec.steps, ok == 1
	}

	t.Run("a large merge inserts its buckets in two commands at once", func(t *testing.T) {
		m := newMem(t)
		stagedInsert(t, m, bigEvents("a", 0, 24)) // 8 buckets of 300 KB
		mp, steps, ok := runMerge(t, m, 2, m.answer)
		if !ok {
			t.Fatal("merge failed")
		}
		if len(steps) != 1 || len(steps[0]) != 2 {
			t.Fatalf("bucket inserts by step: %d steps, first of %d; want one step of two", len(steps), len(steps[0]))
		}
		var docs []int
		for _, u := range steps[0] {
			if !u.Parallel {
				t.Fatal("an insert of the step is not marked Parallel")
			}
			docs = append(docs, len(u.Seq.Documents))
		}
		if !slices.Equal(docs, []int{4, 4}) {
			t.Fatalf("buckets per insert %v, want [4 4]", docs)
		}
		if mp.Stats.ParallelInserts != 2 || mp.Stats.Buckets != 8 {
			t.Fatalf("stats %+v, want 8 buckets in 2 parallel inserts", mp.Stats)
		}
		onceEachStored(t, m, 24)
	})

	t.Run("without streams, or small, one insert", func(t *testing.T) {
		for _, c := range []struct {
			streams, events int
		}{{0, 24}, {2, 6}} {
			m := newMem(t)
			stagedInsert(t, m, bigEvents("a", 0, c.events))
			mp, steps, ok := runMerge(t, m, c.streams, m.answer)
			if !ok {
				t.Fatal("merge failed")
			}
			if len(steps) != 1 || len(steps[0]) != 1 || steps[0][0].Parallel {
				t.Fatalf("streams %d, %d events: %d steps of bucket inserts, want one insert, not Parallel", c.streams, c.events, len(steps))
			}
			if mp.Stats.ParallelInserts != 0 {
				t.Fatalf("stats %+v, want no parallel inserts", mp.Stats)
			}
			onceEachStored(t, m, c.events)
		}
	})

	t.Run("one of the two fails: the merge fails, its repeat stores each event once", func(t *testing.T) {
		m := newMem(t)
		stagedInsert(t, m, bigEvents("a", 0, 24))
		n := 0
		failSecond := func(u rewrite.Upstream) []byte {
			if len(bucketInserts(rewrite.Step{u})) > 0 {
				if n++; n == 2 {
					return doc(bson.D{{Key: "ok", Value: 0.0}, {Key: "code", Value: 1}, {Key: "errmsg", Value: "injected"}})
				}
			}
			return m.answer(u)
		}
		if _, _, ok := runMerge(t, m, 2, failSecond); ok {
			t.Fatal("the merge succeeded with an insert failed")
		}
		if got := len(storedEvents(t, m)); got != 12 {
			t.Fatalf("%d events stored after the failed merge, want the 12 of the insert that went through", got)
		}
		if _, _, ok := runMerge(t, m, 2, m.answer); !ok {
			t.Fatal("the repeated merge failed")
		}
		onceEachStored(t, m, 24)
	})
}
