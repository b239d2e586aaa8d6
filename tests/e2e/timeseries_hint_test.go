package e2e

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// TestTimeseriesNaturalHint (issue 55, case 4): hint({$natural: -1}) on a
// find and on an aggregate, and sort({$natural: -1}), return the events in
// reverse insertion order, as MongoDB's backward scan of a time-series
// collection does; {$natural: 1} in insertion order. Staged and merged
// alike. Before: the hint was ignored and the order was ascending.
func TestTimeseriesNaturalHint(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	T := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	const n = 12
	var docs []any
	var asc []int32
	for i := range int32(n) {
		// Inserted in time order, three series interleaved, each event
		// in a window of its own every fourth event.
		docs = append(docs, bson.D{{Key: "_id", Value: i}, {Key: "t", Value: T.Add(time.Duration(i) * 20 * time.Minute)}, {Key: "m", Value: i % 3}, {Key: "v", Value: i * 10}})
		asc = append(asc, i)
	}
	desc := slices.Clone(asc)
	slices.Reverse(desc)
	coll := tsAggColl(t, ctx, docs)
	natural := func(d int32) bson.D { return bson.D{{Key: "$natural", Value: d}} }
	for _, tier := range []string{"staged", "merged"} {
		if tier == "merged" {
			flush(t, ctx, coll.Database().Client(), coll.Database().Name()+".c")
		}
		for _, c := range []struct {
			name string
			find *options.FindOptionsBuilder
			want []int32
		}{
			{"hint $natural 1", options.Find().SetHint(natural(1)), asc},
			{"hint $natural -1", options.Find().SetHint(natural(-1)), desc},
			{"sort $natural -1", options.Find().SetSort(natural(-1)), desc},
			{"hint $natural -1, limit 3", options.Find().SetHint(natural(-1)).SetLimit(3), desc[:3]},
			{"hint $natural -1 under a sort", options.Find().SetHint(natural(-1)).SetSort(bson.D{{Key: "v", Value: 1}}), asc},
		} {
			cur, err := coll.Find(ctx, bson.D{}, c.find)
			if got := idsOf(t, ctx, cur, err); !slices.Equal(got, c.want) {
				t.Errorf("%s: find %s: %v, want %v", tier, c.name, got, c.want)
			}
		}
		// Series 1 only: events 1, 4, 7, 10.
		series := bson.D{{Key: "$match", Value: bson.D{{Key: "m", Value: 1}}}}
		for _, c := range []struct {
			name     string
			hint     int32
			pipeline bson.A
			want     []int32
		}{
			{"no stages", -1, bson.A{}, desc},
			{"no stages, forward", 1, bson.A{}, asc},
			{"$match, $limit", -1, bson.A{series, bson.D{{Key: "$limit", Value: 2}}}, []int32{10, 7}},
			{"$match, $project", -1, bson.A{series, bson.D{{Key: "$project", Value: bson.D{{Key: "v", Value: 1}}}}}, []int32{10, 7, 4, 1}},
			// $first sees the events in the hint's order: the latest
			// event of each series.
			{"$group $first", -1, bson.A{
				bson.D{{Key: "$group", Value: bson.D{{Key: "_id", Value: "$m"}, {Key: "last", Value: bson.D{{Key: "$first", Value: "$_id"}}}}}},
				bson.D{{Key: "$sort", Value: bson.D{{Key: "_id", Value: 1}}}},
				bson.D{{Key: "$project", Value: bson.D{{Key: "_id", Value: "$last"}}}},
			}, []int32{9, 10, 11}},
		} {
			cur, err := coll.Aggregate(ctx, c.pipeline, options.Aggregate().SetHint(natural(c.hint)))
			if got := idsOf(t, ctx, cur, err); !slices.Equal(got, c.want) {
				t.Errorf("%s: aggregate %s with hint $natural %d: %v, want %v", tier, c.name, c.hint, got, c.want)
			}
		}
	}
	// A count takes the hint and ignores it.
	if got, err := coll.CountDocuments(ctx, bson.D{{Key: "m", Value: 2}}, options.Count().SetHint(natural(-1))); err != nil || got != n/3 {
		t.Errorf("countDocuments with hint $natural -1: %d, %v", got, err)
	}
	// A sort on $natural other than 1 or -1 is refused, as the server does.
	err := coll.Database().RunCommand(ctx, bson.D{{Key: "find", Value: "c"}, {Key: "sort", Value: natural(2)}}).Err()
	var se mongo.ServerError
	if !errors.As(err, &se) || !se.HasErrorCode(2) {
		t.Errorf("find sort {$natural: 2}: %v, want BadValue", err)
	}
}

// idsOf drains cur and returns its documents' int32 _ids.
func idsOf(t *testing.T, ctx context.Context, cur *mongo.Cursor, err error) []int32 {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	var got []struct {
		ID int32 `bson:"_id"`
	}
	if err := cur.All(ctx, &got); err != nil {
		t.Fatal(err)
	}
	out := make([]int32, len(got))
	for i, d := range got {
		out[i] = d.ID
	}
	return out
}
