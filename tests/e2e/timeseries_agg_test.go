package e2e

import (
	"context"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// tsAggColl makes a time-series collection c (timeField t, metaField m)
// through a proxy, with docs inserted.
func tsAggColl(t *testing.T, ctx context.Context, docs []any) *mongo.Collection {
	t.Helper()
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{})
	c := connect(t, p.URI())
	dropAtEnd(t, c, db)
	tsOpts := options.TimeSeries().SetTimeField("t").SetMetaField("m")
	if err := c.Database(db).CreateCollection(ctx, "c", options.CreateCollection().SetTimeSeriesOptions(tsOpts)); err != nil {
		t.Fatalf("create: %v", err)
	}
	coll := c.Database(db).Collection("c")
	if _, err := coll.InsertMany(ctx, docs); err != nil {
		t.Fatalf("insert: %v", err)
	}
	return coll
}

// aggAll runs pipeline on coll and returns the results as extended JSON.
func aggAll(t *testing.T, ctx context.Context, coll *mongo.Collection, pipeline bson.A) []string {
	t.Helper()
	cur, err := coll.Aggregate(ctx, pipeline)
	if err != nil {
		t.Fatalf("aggregate %v: %v", pipeline, err)
	}
	var docs []bson.Raw
	if err := cur.All(ctx, &docs); err != nil {
		t.Fatalf("aggregate %v: %v", pipeline, err)
	}
	out := make([]string, len(docs))
	for i, d := range docs {
		out[i] = d.String()
	}
	return out
}

// TestTimeseriesGroupMissingKey (issue 55, case 3): a missing field in a
// compound group key is null, one group with the null one, as MongoDB
// answers [{_id: {x: null}, n: 2}].
func TestTimeseriesGroupMissingKey(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	T := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	coll := tsAggColl(t, ctx, []any{
		bson.D{{Key: "t", Value: T}, {Key: "m", Value: nil}, {Key: "val", Value: 1}},
		bson.D{{Key: "t", Value: T}, {Key: "val", Value: 2}},
	})
	got := aggAll(t, ctx, coll, bson.A{bson.D{{Key: "$group", Value: bson.D{{Key: "_id", Value: bson.D{{Key: "x", Value: "$m"}}}, {Key: "n", Value: bson.D{{Key: "$sum", Value: 1}}}}}}})
	if want := `{"_id": {"x": null},"n": {"$numberInt":"2"}}`; len(got) != 1 || got[0] != want {
		t.Fatalf("got %v, want [%s]", got, want)
	}
}
