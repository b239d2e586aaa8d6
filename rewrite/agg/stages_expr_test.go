package agg_test

import (
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

func spending() []bson.D {
	return []bson.D{
		{{Key: "_id", Value: int32(1)}, {Key: "category", Value: "food"}, {Key: "budget", Value: int32(400)}, {Key: "spent", Value: int32(450)}, {Key: "in", Value: D{{Key: "a", Value: int32(1)}}}},
		{{Key: "_id", Value: int32(2)}, {Key: "category", Value: "drinks"}, {Key: "budget", Value: int32(100)}, {Key: "spent", Value: int32(150)}, {Key: "in", Value: D{{Key: "a", Value: int32(2)}}}},
		{{Key: "_id", Value: int32(3)}, {Key: "category", Value: "clothes"}, {Key: "budget", Value: int32(100)}, {Key: "spent", Value: int32(50)}, {Key: "in", Value: "x"}},
	}
}

func TestMatchExpr(t *testing.T) {
	gt := D{{Key: "$expr", Value: D{{Key: "$gt", Value: A{"$spent", "$budget"}}}}}
	checkRun(t, spending(), A{D{{Key: "$match", Value: gt}}, D{{Key: "$project", Value: D{{Key: "_id", Value: 1}}}}},
		[]D{{{Key: "_id", Value: int32(1)}}, {{Key: "_id", Value: int32(2)}}})
	// With an ordinary predicate: both must hold.
	both := D{{Key: "category", Value: "drinks"}, gt[0]}
	checkRun(t, spending(), A{D{{Key: "$match", Value: both}}, D{{Key: "$project", Value: D{{Key: "_id", Value: 1}}}}},
		[]D{{{Key: "_id", Value: int32(2)}}})
	// Inside $and with other predicates is the query language's; a
	// failing expression is an error, not a non-match.
	_, err := run(t, spending(), A{D{{Key: "$match", Value: D{{Key: "$expr", Value: D{{Key: "$divide", Value: A{1, 0}}}}}}}})
	if err == nil || !strings.Contains(err.Error(), "divide by zero") {
		t.Errorf("a failing $expr: %v", err)
	}
}

func TestReplaceRoot(t *testing.T) {
	docs := spending()[:2]
	checkRun(t, docs, A{D{{Key: "$replaceRoot", Value: D{{Key: "newRoot", Value: "$in"}}}}},
		[]D{{{Key: "a", Value: int32(1)}}, {{Key: "a", Value: int32(2)}}})
	checkRun(t, docs, A{D{{Key: "$replaceWith", Value: D{{Key: "$mergeObjects", Value: A{D{{Key: "c", Value: "$category"}}, "$in"}}}}}},
		[]D{{{Key: "c", Value: "food"}, {Key: "a", Value: int32(1)}}, {{Key: "c", Value: "drinks"}, {Key: "a", Value: int32(2)}}})
	for _, st := range []D{
		{{Key: "$replaceRoot", Value: D{{Key: "newRoot", Value: "$in"}}}},
		{{Key: "$replaceWith", Value: "$nope"}},
	} {
		_, err := run(t, spending(), A{st})
		if mongoerr.CodeOf(err) != 40228 || !strings.Contains(err.Error(), "'newRoot' expression must evaluate to an object") {
			t.Errorf("%v over a non-document: %v, want 40228", st, err)
		}
	}
	if _, err := run(t, nil, A{D{{Key: "$replaceRoot", Value: D{}}}}); mongoerr.CodeOf(err) != 40231 {
		t.Errorf("$replaceRoot without newRoot: %v, want 40231", err)
	}
}

// $sum of an array and $map in $project, $filter in $addFields.
func TestExprOperatorsInStages(t *testing.T) {
	in := []bson.D{{{Key: "_id", Value: int32(1)}, {Key: "q", Value: A{int32(5), int32(10), int32(15)}}}}
	checkRun(t, in, A{
		D{{Key: "$project", Value: D{{Key: "total", Value: D{{Key: "$sum", Value: "$q"}}}, {Key: "x2", Value: D{{Key: "$map", Value: D{{Key: "input", Value: "$q"}, {Key: "in", Value: D{{Key: "$multiply", Value: A{"$$this", 2}}}}}}}}, {Key: "q", Value: 1}}}},
		D{{Key: "$addFields", Value: D{{Key: "big", Value: D{{Key: "$filter", Value: D{{Key: "input", Value: "$q"}, {Key: "as", Value: "v"}, {Key: "cond", Value: D{{Key: "$gt", Value: A{"$$v", 7}}}}}}}}}}},
	}, []D{{{Key: "_id", Value: int32(1)}, {Key: "q", Value: A{int32(5), int32(10), int32(15)}}, {Key: "total", Value: int32(30)}, {Key: "x2", Value: A{int32(10), int32(20), int32(30)}}, {Key: "big", Value: A{int32(10), int32(15)}}}})
}
