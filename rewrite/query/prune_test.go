package query_test

import (
	"math"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
	"github.com/tsproxy/tsproxy/rewrite/query"
)

// completeBucket is the bucket the write path builds of events holding
// values in "value" (nil: the event has no value).
func completeBucket(t *testing.T, values ...any) bsoncore.Document {
	t.Helper()
	rule := rwtest.InsertRule()
	rule.MaxEvents = 1000
	lim, err := bucket.LimitsOf(rule)
	if err != nil {
		t.Fatal(err)
	}
	var docs []bsoncore.Document
	for i, v := range values {
		d := bson.D{{Key: "_id", Value: rwtest.OID(byte(i + 1))}, {Key: "ts", Value: rwtest.DT(int64(i))}, {Key: "sensorId", Value: "a"}}
		if v != nil {
			d = append(d, bson.E{Key: "value", Value: v})
		}
		docs = append(docs, rwtest.Doc(t, d))
	}
	evs, werrs := bucket.PrepareEvents(docs, true, rule, lim, bson.NewObjectID)
	if len(werrs) > 0 {
		t.Fatalf("prepare: %v", werrs)
	}
	return bucket.Complete(bson.NewObjectID(), evs, rule, lim)
}

func TestPrunePlan(t *testing.T) {
	rc := rwtest.Ctx(t, rwtest.FerretCaps)
	rc.Rule = rwtest.InsertRule() // aggregates: [value]
	cases := []struct {
		name   string
		filter bson.D
		want   string // the prune's bucket filters, "" for none
	}{
		{"range", bson.D{{Key: "value", Value: bson.D{{Key: "$gt", Value: 5}, {Key: "$lt", Value: 9.5}}}},
			`{"$or": [{"mixed.value": true},{"summed.value": {"$exists": false}},{"min.value": {"$lte": {"$numberDouble":"9.5"}},"max.value": {"$gte": {"$numberInt":"5"}}}]}`},
		{"equality", bson.D{{Key: "value", Value: int64(7)}},
			`{"$or": [{"mixed.value": true},{"summed.value": {"$exists": false}},{"min.value": {"$lte": {"$numberLong":"7"}},"max.value": {"$gte": {"$numberLong":"7"}}}]}`},
		{"$in of numbers and $and", bson.D{{Key: "$and", Value: bson.A{bson.D{{Key: "value", Value: bson.D{{Key: "$in", Value: bson.A{3, 1, 2}}}}}, bson.D{{Key: "value", Value: bson.D{{Key: "$gte", Value: 2}}}}}}},
			`{"$or": [{"mixed.value": true},{"summed.value": {"$exists": false}},{"min.value": {"$lte": {"$numberInt":"3"}},"max.value": {"$gte": {"$numberInt":"2"}}}]}`},
		{"upper bound only, other operators ignored", bson.D{{Key: "value", Value: bson.D{{Key: "$ne", Value: 3}, {Key: "$lte", Value: 4}}}},
			`{"$or": [{"mixed.value": true},{"summed.value": {"$exists": false}},{"min.value": {"$lte": {"$numberInt":"4"}}}]}`},
		{"not an aggregate", bson.D{{Key: "other", Value: bson.D{{Key: "$gt", Value: 5}}}}, ""},
		{"a string", bson.D{{Key: "value", Value: bson.D{{Key: "$gt", Value: "a"}}}}, ""},
		{"$in with a null", bson.D{{Key: "value", Value: bson.D{{Key: "$in", Value: bson.A{1, nil}}}}}, ""},
		{"NaN", bson.D{{Key: "value", Value: bson.D{{Key: "$gte", Value: math.NaN()}}}}, ""},
		{"$not", bson.D{{Key: "value", Value: bson.D{{Key: "$not", Value: bson.D{{Key: "$gt", Value: 5}}}}}}, ""},
		{"inside $or", bson.D{{Key: "$or", Value: bson.A{bson.D{{Key: "value", Value: 1}}, bson.D{{Key: "sensorId", Value: "a"}}}}}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := rc.PlanPrune(rwtest.Doc(t, c.filter))
			got := ""
			for _, f := range p.BucketFilters() {
				got += rwtest.JSON(f)
			}
			if got != c.want {
				t.Fatalf("bucket filters\n got: %s\nwant: %s", got, c.want)
			}
		})
	}
}

func TestPruneMayMatch(t *testing.T) {
	rc := rwtest.Ctx(t, rwtest.FerretCaps)
	rc.Rule = rwtest.InsertRule()
	gt := func(v any) *query.Prune {
		return rc.PlanPrune(rwtest.Doc(t, bson.D{{Key: "value", Value: bson.D{{Key: "$gt", Value: v}}}}))
	}
	between := func(lo, hi any) *query.Prune {
		return rc.PlanPrune(rwtest.Doc(t, bson.D{{Key: "value", Value: bson.D{{Key: "$gte", Value: lo}, {Key: "$lte", Value: hi}}}}))
	}
	withoutSummed := func(b bsoncore.Document) bsoncore.Document {
		elems, _ := b.Elements()
		idx, d := bsoncore.AppendDocumentStart(nil)
		for _, e := range elems {
			if e.Key() != bucket.FieldSummed {
				d = append(d, e...)
			}
		}
		d, _ = bsoncore.AppendDocumentEnd(d, idx)
		return d
	}
	cases := []struct {
		name   string
		prune  *query.Prune
		bucket bsoncore.Document
		want   bool
	}{
		{"range above the bucket's max", gt(11), completeBucket(t, 1, 5, 10), false},
		{"a strict bound at the max is compared inclusively", gt(10), completeBucket(t, 1, 5, 10), true},
		{"range inside", gt(4), completeBucket(t, 1, 5, 10), true},
		{"between, below", between(-3, 0.5), completeBucket(t, 1, 5, 10), false},
		{"between, straddling", between(6, 7), completeBucket(t, 1, 5, 10), true},
		{"int64 and double", gt(9.5), completeBucket(t, int64(1), int64(10)), true},
		{"no event holds the field", gt(0), completeBucket(t, nil, nil), false},
		{"some hold a string: mixed", gt(10), completeBucket(t, 1, "high"), true},
		{"an array may hold a match: mixed", gt(10), completeBucket(t, 1, bson.A{50}), true},
		{"an infinity: mixed", gt(10), completeBucket(t, 1, math.Inf(1)), true},
		{"summaries not known to cover every event", gt(10), withoutSummed(completeBucket(t, 1, 5)), true},
		{"a staged document", gt(10), rwtest.Doc(t, bson.D{{Key: "_id", Value: 1}, {Key: "events", Value: bson.A{}}}), true},
		{"no prune", nil, completeBucket(t, 1), true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := c.prune.MayMatch(c.bucket); got != c.want {
				t.Fatalf("MayMatch = %v, want %v (bucket %s)", got, c.want, rwtest.JSON(c.bucket))
			}
		})
	}
}

// TestPruneOutlivesFilter: a scan's getMores apply the prune after the
// request's buffer is reused, so it must not alias the filter (a test
// that read 131 of 183 events when it did).
func TestPruneOutlivesFilter(t *testing.T) {
	rc := rwtest.Ctx(t, rwtest.FerretCaps)
	rc.Rule = rwtest.InsertRule()
	f := rwtest.Doc(t, bson.D{{Key: "value", Value: int64(1)}})
	p := rc.PlanPrune(f)
	before := rwtest.JSON(p.BucketFilters()[0])
	for i := range f {
		f[i] = 0xff
	}
	if after := rwtest.JSON(p.BucketFilters()[0]); after != before {
		t.Fatalf("the prune changed with the filter's buffer:\n%s\n%s", before, after)
	}
}
