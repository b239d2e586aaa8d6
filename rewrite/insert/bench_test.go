package insert

import (
	"fmt"
	"testing"
	"time"

	"github.com/tsproxy/tsproxy/rewrite"

	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"

	"github.com/tsproxy/tsproxy/rewrite/caps"

	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// benchInsertCommand is tsbench ingest's batch: n events of 10 series at
// 1-second cadence, in a document sequence as drivers send them.
func benchInsertCommand(b *testing.B, n int) rewrite.Command {
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	seq := rewrite.Sequence{Identifier: "documents"}
	for k := 0; k < n; k++ {
		seq.Documents = append(seq.Documents, rwtest.Doc(b, bson.D{
			{Key: "_id", Value: bson.NewObjectID()},
			{Key: "ts", Value: base.Add(time.Duration(k/10) * time.Second)},
			{Key: "sensorId", Value: fmt.Sprintf("s%02d", k%10)},
			{Key: "value", Value: float64(k%1000) / 10},
		}))
	}
	body := rwtest.Doc(b, bson.D{{Key: "insert", Value: "readings"}, {Key: "ordered", Value: true}, {Key: "$db", Value: "iot"}})
	return rewrite.Command{Body: body, Sequences: []rewrite.Sequence{seq}}
}

func benchRule() *rules.Rule {
	r := rwtest.InsertRule()
	r.MaxEvents, r.InsertThreshold = 3600, 100
	return r
}

// BenchmarkInsertPlan1000 is the proxy's rewrite CPU per batch of 1000
// events: prepare, then plan (groups of 100 become complete buckets).
func BenchmarkInsertPlan1000(b *testing.B) {
	cmd, rule := benchInsertCommand(b, 1000), benchRule()
	caps := caps.Upstream{IDOnlyFilters: true, CostlyUpdates: true, MaxUpdateStatements: caps.FerretDBMaxUpdateStatements}
	b.ReportAllocs()
	for b.Loop() {
		pi, err := Prepare(cmd, rule, bson.NewObjectID)
		if err != nil || len(pi.Keys()) != 10 {
			b.Fatalf("prepare: %v", err)
		}
		if p := pi.Plan(Options{Caps: caps}); len(p.Commands) != 1 {
			b.Fatalf("plan: %d commands", len(p.Commands))
		}
	}
}
