package read

import (
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
	"github.com/tsproxy/tsproxy/rewrite/query"
	"github.com/tsproxy/tsproxy/rewrite/read/point"
)

func TestNaturalOrder(t *testing.T) {
	rc, err := query.NewCtx(rwtest.Rule())
	if err != nil {
		t.Fatal(err)
	}
	find := func(es ...bson.E) bson.D { return append(bson.D{{Key: "find", Value: "readings"}}, es...) }
	agg := func(hint any, stages ...any) bson.D {
		return bson.D{{Key: "aggregate", Value: "readings"}, {Key: "pipeline", Value: append(bson.A{}, stages...)}, {Key: "cursor", Value: bson.D{}}, {Key: "hint", Value: hint}}
	}
	hint := func(v any) bson.E { return bson.E{Key: "hint", Value: bson.D{{Key: "$natural", Value: v}}} }
	match := bson.D{{Key: "$match", Value: bson.D{{Key: "v", Value: 1}}}}
	natural := func(v any) bson.D { return bson.D{{Key: "$natural", Value: v}} }
	for _, tc := range []struct {
		name string
		cmd  bson.D
		want string // a part of the rewritten body, or of the error
	}{
		{"find hint backward", find(hint(int32(-1))), `"sort": {"ts": {"$numberInt":"-1"}}`},
		{"find hint forward", find(hint(1.0)), `"sort": {"ts": {"$numberInt":"1"}}`},
		{"find hint sign", find(hint(int64(-7))), `"sort": {"ts": {"$numberInt":"-1"}}`},
		{"find hint, empty sort", find(bson.E{Key: "sort", Value: bson.D{}}, hint(-1)), `"sort": {"ts": {"$numberInt":"-1"}}`},
		{"find hint under a sort", find(bson.E{Key: "sort", Value: bson.D{{Key: "v", Value: 1}}}, hint(-1)), `"sort": {"v": {"$numberInt":"1"}}`},
		{"find index hint", find(bson.E{Key: "hint", Value: bson.D{{Key: "ts", Value: 1}}}), `{"find": "readings","hint"`},
		{"find sort $natural", find(bson.E{Key: "sort", Value: natural(-1)}), `"sort": {"ts": {"$numberInt":"-1"}}`},
		{"find sort $natural after a key", find(bson.E{Key: "sort", Value: bson.D{{Key: "v", Value: 1}, {Key: "$natural", Value: 1}}}), `"sort": {"v": {"$numberInt":"1"},"ts": {"$numberInt":"1"}}`},
		{"find sort $natural and time", find(bson.E{Key: "sort", Value: bson.D{{Key: "ts", Value: 1}, {Key: "$natural", Value: -1}}}), `"sort": {"ts": {"$numberInt":"1"}}}`},
		{"find sort $natural 2", find(bson.E{Key: "sort", Value: natural(2)}), `$natural sort cannot be set to a value other than -1 or 1`},
		{"find hint not a number", find(hint("x")), `hint {$natural: ...} must be a number, got string`},
		{"aggregate empty pipeline", agg(natural(-1)), `"pipeline": [{"$sort": {"ts": {"$numberInt":"-1"}}}]`},
		{"aggregate after matches", agg(natural(-1), match, match, bson.D{{Key: "$limit", Value: 2}}),
			`"pipeline": [{"$match": {"v": {"$numberInt":"1"}}},{"$match": {"v": {"$numberInt":"1"}}},{"$sort": {"ts": {"$numberInt":"-1"}}},{"$limit": {"$numberInt":"2"}}]`},
		{"aggregate before a count", agg(natural(-1), match, bson.D{{Key: "$count", Value: "n"}}), `"pipeline": [{"$match": {"v": {"$numberInt":"1"}}},{"$count": "n"}]`},
		{"aggregate index hint", agg("ts_1", match), `"pipeline": [{"$match": {"v": {"$numberInt":"1"}}}]`},
	} {
		body := rwtest.Doc(t, tc.cmd)
		out, err := point.NaturalFind(rc, body)
		if tc.cmd[0].Key == "aggregate" {
			out, err = point.NaturalAggregate(rc, body)
		}
		got := ""
		if err != nil {
			got = err.Error()
		} else {
			got = rwtest.JSON(out)
		}
		if !strings.Contains(got, tc.want) {
			t.Errorf("%s:\n got %s\nwant %s", tc.name, got, tc.want)
		}
	}
}

// TestNaturalHintPlans: the rewritten order reaches the upstream read.
func TestNaturalHintPlans(t *testing.T) {
	p, err := rdPlan(t, rwtest.FerretCaps, bson.D{{Key: "find", Value: "readings"}, {Key: "hint", Value: bson.D{{Key: "$natural", Value: -1}}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := rwtest.JSON(p.Command); !strings.Contains(got, `{"$sort": {"events.ts": {"$numberInt":"-1"}}}`) {
		t.Fatalf("find: %s", got)
	}
	p, err = rdPlan(t, rwtest.FerretCaps, bson.D{{Key: "aggregate", Value: "readings"}, {Key: "pipeline", Value: bson.A{}}, {Key: "cursor", Value: bson.D{}}, {Key: "hint", Value: bson.D{{Key: "$natural", Value: -1}}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := rwtest.JSON(p.Command); !strings.Contains(got, `{"$sort": {"events.ts": {"$numberInt":"-1"}}}`) {
		t.Fatalf("aggregate: %s", got)
	}
}
