package e2e

import (
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// TestTimeseriesAggExpr (issue 55, case 8): expressions the proxy's
// engine runs on a time-series collection, with MongoDB's answers.
func TestTimeseriesAggExpr(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	T := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	coll := tsAggColl(t, ctx, []any{
		bson.D{{Key: "t", Value: T}, {Key: "m", Value: "a"}, {Key: "val", Value: 5}, {Key: "other", Value: 3}, {Key: "name", Value: "north"}, {Key: "q", Value: bson.A{1, 2, 3}}, {Key: "in", Value: bson.D{{Key: "x", Value: 1}}}},
		bson.D{{Key: "t", Value: T.Add(time.Minute)}, {Key: "m", Value: "b"}, {Key: "val", Value: 2}, {Key: "other", Value: 4}, {Key: "name", Value: "south"}, {Key: "q", Value: bson.A{4, 5}}, {Key: "in", Value: bson.D{{Key: "x", Value: 2}}}},
	})
	sortVal := bson.D{{Key: "$sort", Value: bson.D{{Key: "val", Value: 1}}}}
	noID := func(fields bson.D) bson.D {
		return bson.D{{Key: "$project", Value: append(bson.D{{Key: "_id", Value: 0}}, fields...)}}
	}
	cases := []struct {
		name     string
		pipeline bson.A
		want     []string
	}{
		{"$expr in $match", bson.A{
			bson.D{{Key: "$match", Value: bson.D{{Key: "$expr", Value: bson.D{{Key: "$gt", Value: bson.A{"$val", "$other"}}}}}}},
			noID(bson.D{{Key: "m", Value: 1}}),
		}, []string{`{"m": "a"}`}},
		{"$replaceWith", bson.A{sortVal, bson.D{{Key: "$replaceWith", Value: "$in"}}},
			[]string{`{"x": {"$numberInt":"2"}}`, `{"x": {"$numberInt":"1"}}`}},
		{"$getField with a dotted name", bson.A{sortVal,
			bson.D{{Key: "$replaceWith", Value: bson.D{{Key: "$setField", Value: bson.D{{Key: "field", Value: "a.b"}, {Key: "input", Value: bson.D{}}, {Key: "value", Value: "$val"}}}}}},
			bson.D{{Key: "$project", Value: bson.D{{Key: "v", Value: bson.D{{Key: "$getField", Value: "a.b"}}}}}},
		}, []string{`{"v": {"$numberInt":"2"}}`, `{"v": {"$numberInt":"5"}}`}},
		{"$toUpper", bson.A{sortVal, noID(bson.D{{Key: "n", Value: bson.D{{Key: "$toUpper", Value: "$name"}}}})},
			[]string{`{"n": "SOUTH"}`, `{"n": "NORTH"}`}},
		// The first by val has val 2: 2017-02-02T00:00:00Z.
		{"$dateFromParts", bson.A{sortVal, bson.D{{Key: "$limit", Value: 1}}, noID(bson.D{{Key: "d", Value: bson.D{{Key: "$dateFromParts", Value: bson.D{{Key: "year", Value: 2017}, {Key: "month", Value: 2}, {Key: "day", Value: "$val"}}}}}})},
			[]string{`{"d": {"$date":{"$numberLong":"1485993600000"}}}`}},
		{"$map and $filter", bson.A{sortVal, noID(bson.D{
			{Key: "x2", Value: bson.D{{Key: "$map", Value: bson.D{{Key: "input", Value: "$q"}, {Key: "in", Value: bson.D{{Key: "$multiply", Value: bson.A{"$$this", 2}}}}}}}},
			{Key: "odd", Value: bson.D{{Key: "$filter", Value: bson.D{{Key: "input", Value: "$q"}, {Key: "as", Value: "v"}, {Key: "cond", Value: bson.D{{Key: "$eq", Value: bson.A{bson.D{{Key: "$mod", Value: bson.A{"$$v", 2}}}, 1}}}}}}}},
		})}, []string{
			`{"x2": [{"$numberInt":"8"},{"$numberInt":"10"}],"odd": [{"$numberInt":"5"}]}`,
			`{"x2": [{"$numberInt":"2"},{"$numberInt":"4"},{"$numberInt":"6"}],"odd": [{"$numberInt":"1"},{"$numberInt":"3"}]}`,
		}},
		{"$sum of an array in $project", bson.A{sortVal, noID(bson.D{{Key: "s", Value: bson.D{{Key: "$sum", Value: "$q"}}}})},
			[]string{`{"s": {"$numberInt":"9"}}`, `{"s": {"$numberInt":"6"}}`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := aggAll(t, ctx, coll, c.pipeline)
			if strings.Join(got, "\n") != strings.Join(c.want, "\n") {
				t.Errorf("got %v\nwant %v", got, c.want)
			}
		})
	}
}

// TestTimeseriesAggExprReplaceError: a newRoot that is not a document
// is MongoDB's error 40228.
func TestTimeseriesAggExprReplaceError(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	coll := tsAggColl(t, ctx, []any{bson.D{{Key: "t", Value: time.Now()}, {Key: "m", Value: "a"}, {Key: "val", Value: 5}}})
	_, err := coll.Aggregate(ctx, bson.A{bson.D{{Key: "$replaceRoot", Value: bson.D{{Key: "newRoot", Value: "$val"}}}}})
	if err == nil || !strings.Contains(err.Error(), "'newRoot' expression must evaluate to an object") {
		t.Fatalf("got %v, want error 40228", err)
	}
}
