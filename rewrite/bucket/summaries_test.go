package bucket

import (
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rules"
)

// TestSummariesUpdate: a bucket written before "value" was an aggregate
// gets, from all its events, the summaries a bucket written after has,
// under a filter on the bucket as read; one that has them needs none.
func TestSummariesUpdate(t *testing.T) {
	rule := &rules.Rule{Namespace: "iot.r", DB: "iot", Collection: "r", TimeField: "ts", MetaField: "m",
		Span: time.Hour, MaxEvents: 100, MaxBytes: 1 << 20, BucketCollection: "r.buckets", Layout: rules.LayoutEvents}
	before, err := LimitsOf(rule)
	if err != nil {
		t.Fatal(err)
	}
	indexed := *rule
	indexed.Aggregates = []string{"value"}
	after, err := LimitsOf(&indexed)
	if err != nil {
		t.Fatal(err)
	}
	for _, packed := range []bool{false, true} {
		var docs []bsoncore.Document
		for i, v := range []any{int32(3), 1.5, "hot", int64(7), nil} {
			d := bson.D{{Key: "_id", Value: bson.NewObjectID()}, {Key: "ts", Value: bson.DateTime(int64(i))}, {Key: "m", Value: "a"}}
			if v != nil {
				d = append(d, bson.E{Key: "value", Value: v})
			}
			b, _ := bson.Marshal(d)
			docs = append(docs, b)
		}
		lb, la := before, after
		lb.Packed, la.Packed = packed, packed
		evs, werrs := PrepareEvents(docs, true, rule, lb, bson.NewObjectID)
		if len(werrs) > 0 {
			t.Fatal(werrs)
		}
		id := bson.NewObjectID()
		old := Complete(id, evs, rule, lb)
		stmt, ok, err := SummariesUpdate(old, &indexed, la)
		if err != nil || !ok {
			t.Fatalf("packed %v: SummariesUpdate: %v %v", packed, ok, err)
		}
		q, _ := stmt.Lookup("q").DocumentOK()
		for _, k := range []string{FieldID, FieldCount} {
			if _, err := q.LookupErr(k); err != nil {
				t.Fatalf("packed %v: the filter lacks %s: %s", packed, k, q)
			}
		}
		if _, errP := q.LookupErr(FieldPacked); (errP == nil) != packed {
			t.Fatalf("packed %v: the filter %s", packed, q)
		}
		set, _ := stmt.Lookup("u", "$set").DocumentOK()
		aevs, _ := PrepareEvents(docs, true, &indexed, la, bson.NewObjectID)
		want := Complete(id, aevs, &indexed, la)
		for _, path := range [][]string{{FieldMin, "value"}, {FieldMax, "value"}, {FieldSum, "value"}, {FieldCounts, "value"}, {FieldLowBit, "value"}, {FieldMixed, "value"}, {FieldSummed, "value"}} {
			w, err := want.LookupErr(path...)
			if err != nil {
				t.Fatalf("the bucket written with the aggregate has no %v", path)
			}
			g, err := set.LookupErr(path[0] + "." + path[1])
			if err != nil || !g.Equal(w) {
				t.Fatalf("packed %v: $set %s.%s = %v, want %v", packed, path[0], path[1], g, w)
			}
		}
		if _, ok, _ := SummariesUpdate(want, &indexed, la); ok {
			t.Fatalf("packed %v: a bucket written with the aggregate was given summaries again", packed)
		}
	}
}
