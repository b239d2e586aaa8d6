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
	f.Add([]byte(bucket.StagedGroups(rwtest.OID(9), chunks)))
	f.Add([]byte(bucket.StagedGroupsAt(rwtest.OID(9), chunks, 7, true)))
	f.Add([]byte(bucket.StagedGroups(rwtest.OID(9), chunks[:1])))
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
		for _, compress := range []bool{false, true} {
			back, err := bucket.StagedEvents(bucket.StagedGroupsAt(rwtest.OID(9), again, 0, compress), rule, lim)
			if err != nil {
				t.Fatalf("events read from input do not read back once staged again (compress %v): %v", compress, err)
			}
			if len(back) != len(got) {
				t.Fatalf("%d events staged again read back as %d (compress %v)", len(got), len(back), compress)
			}
			for i := range back {
				if !bytes.Equal(back[i].Stored, got[i].Stored) || back[i].Start != got[i].Start || !back[i].Meta.Equal(got[i].Meta) {
					t.Fatalf("event %d staged again reads back as another (compress %v)", i, compress)
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
