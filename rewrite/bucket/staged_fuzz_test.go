package bucket_test

import (
	"bytes"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
	"github.com/tsproxy/tsproxy/rules"
)

// FuzzStagedEvents: the background merger reads every staged document
// back from the upstream (outside any connection's recover), so no bytes
// may panic StagedEvents; what it reads, staged again, reads back as the
// same events.
func FuzzStagedEvents(f *testing.F) {
	rule, lim, evs := preparedEvents(f, []any{"a", "a", "b", nil, "a"}, rwtest.Hour)
	var chunks [][]bucket.Event
	for _, g := range bucket.GroupEvents(evs) {
		chunks = append(chunks, bucket.ChunkEvents(g, lim)...)
	}
	for _, format := range []bucket.StagedFormat{bucket.StagedKeyed, bucket.StagedPacked} {
		f.Add([]byte(bucket.StagedDoc(rwtest.OID(9), chunks, bucket.StagedOptions{Format: format})))
		f.Add([]byte(bucket.StagedDoc(rwtest.OID(9), chunks, bucket.StagedOptions{At: 7, Compress: true, Format: format})))
		f.Add([]byte(bucket.StagedDoc(rwtest.OID(9), chunks[:1], bucket.StagedOptions{Format: format})))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := bucket.StagedEvents(bsoncore.Document(data), rule, lim)
		if err != nil || len(got) == 0 {
			return
		}
		var again [][]bucket.Event
		for i, ev := range got {
			if i > 0 && ev.Start == got[i-1].Start && ev.Meta.Equal(got[i-1].Meta) {
				again[len(again)-1] = append(again[len(again)-1], ev)
				continue
			}
			again = append(again, []bucket.Event{ev})
		}
		for _, opts := range []bucket.StagedOptions{{}, {Compress: true}, {Format: bucket.StagedPacked}, {Compress: true, Format: bucket.StagedPacked}} {
			back, err := bucket.StagedEvents(bucket.StagedDoc(rwtest.OID(9), again, opts), rule, lim)
			if err != nil {
				t.Fatalf("events read from input do not read back once staged again (%+v): %v", opts, err)
			}
			if len(back) != len(got) {
				t.Fatalf("%d events staged again read back as %d (%+v)", len(got), len(back), opts)
			}
			for i := range back {
				if !bytes.Equal(back[i].Stored, got[i].Stored) || back[i].Start != got[i].Start || !back[i].Meta.Equal(got[i].Meta) {
					t.Fatalf("event %d staged again reads back as another (%+v)", i, opts)
				}
			}
		}
	})
}

// preparedEvents are events of rwtest.InsertRule, one for each of metas
// in order, step ms apart, as an insert prepares them.
func preparedEvents(tb testing.TB, metas []any, step int64) (*rules.Rule, bucket.Limits, []bucket.Event) {
	tb.Helper()
	rule := rwtest.InsertRule()
	lim, err := bucket.LimitsOf(rule)
	if err != nil {
		tb.Fatal(err)
	}
	var docs []bsoncore.Document
	for i, meta := range metas {
		docs = append(docs, rwtest.Doc(tb, rwtest.Event(rwtest.OID(byte(i+1)), rwtest.DT(int64(i)*step), meta, float64(i))))
	}
	evs, errs := bucket.PrepareEvents(docs, true, rule, lim, bson.NewObjectID)
	if len(errs) > 0 {
		tb.Fatalf("prepare: %v", errs)
	}
	return rule, lim, evs
}
