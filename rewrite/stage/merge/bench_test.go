package merge_test

import (
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/insert"
	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rewrite/stage/merge"
)

// BenchmarkMerge50k merges 50,000 events staged by inserts of 100 (4
// series of 1-second data, buckets of 1,000): the proxy's CPU in a
// merge, with the in-memory upstream's (which stores what it is sent).
func BenchmarkMerge50k(b *testing.B) { benchmarkMerge(b, 50_000, 100) }

// BenchmarkMergeBatch10 is what a flush merges after 10,000 events sent
// 10 at a time: 1,000 staged documents, one a client insert.
func BenchmarkMergeBatch10(b *testing.B) { benchmarkMerge(b, 10_000, 10) }

// BenchmarkMergeBatch1 is a background merge of per-event inserts: a
// merge batch (4 series of buckets of 1,000) of staged documents of one
// event each.
func BenchmarkMergeBatch1(b *testing.B) { benchmarkMerge(b, 4_000, 1) }

func benchmarkMerge(b *testing.B, events, batch int) {
	rule := rwtest.InsertRule()
	rule.MaxEvents = 1000
	t := &testing.T{}
	var batches [][]bson.D
	for i := 0; i < events; i += batch {
		var evs []bson.D
		for j := i; j < i+batch; j++ {
			evs = append(evs, rwtest.Event(bson.NewObjectID(), rwtest.DT(36_000_000+int64(j/4)*1000), []string{"a", "b", "c", "d"}[j%4], float64(j)))
		}
		batches = append(batches, evs)
	}
	for b.Loop() {
		b.StopTimer()
		m := newMem(t)
		for _, evs := range batches {
			cmd := rwtest.SeqCmd(t, evs)
			pi, err := insert.Prepare(cmd, rule, bson.NewObjectID)
			if err != nil {
				b.Fatal(err)
			}
			m.run(stage.Insert(cmd, pi, stage.InsertEnv{Identity: "u", NewObjectID: bson.NewObjectID}))
		}
		b.StartTimer()
		mp := merge.NewMerge(rule, merge.MergeOptions{All: true, RetryHorizon: time.Hour, Now: time.UnixMilli(1_000_000), PackedEvents: true})
		m.run(mp)
		if mp.Stats.Events != events {
			b.Fatalf("merged %d events", mp.Stats.Events)
		}
	}
}

// BenchmarkStagedInsert1 and BenchmarkStagedInsert10 are the proxy's
// rewrite CPU per staged insert call of 1 and 10 events (prepare, build
// the staged document, run the plan against an upstream that answers
// at once): what a per-event insert costs the proxy besides its round
// trips.
func BenchmarkStagedInsert1(b *testing.B)  { benchmarkStagedInsert(b, 1) }
func BenchmarkStagedInsert10(b *testing.B) { benchmarkStagedInsert(b, 10) }

func benchmarkStagedInsert(b *testing.B, batch int) {
	rule := rwtest.InsertRule()
	rule.MaxEvents = 1000
	t := &testing.T{}
	var evs []bson.D
	for j := range batch {
		evs = append(evs, rwtest.Event(bson.NewObjectID(), rwtest.DT(36_000_000+int64(j/4)*1000), []string{"a", "b", "c", "d"}[j%4], float64(j)))
	}
	cmd := rwtest.SeqCmd(t, evs)
	m := newMem(t)
	ok := doc(bson.D{{Key: "n", Value: int32(1)}, {Key: "ok", Value: 1.0}})
	b.ReportAllocs()
	for b.Loop() {
		pi, err := insert.Prepare(cmd, rule, bson.NewObjectID)
		if err != nil {
			b.Fatal(err)
		}
		res := m.runWith(stage.Insert(cmd, pi, stage.InsertEnv{Identity: "u", NewObjectID: bson.NewObjectID, Combinable: true}), func(rewrite.Upstream) []byte { return ok })
		if res.Reply == nil {
			b.Fatal("no reply")
		}
	}
}
