package expr_test

import "testing"

// MongoDB's documented answers for the operators that bind variables.
func TestVariableOperators(t *testing.T) {
	runExprCases(t, []exprCase{
		{name: "map", expr: D{{Key: "$map", Value: D{{Key: "input", Value: "$arr"}, {Key: "as", Value: "x"}, {Key: "in", Value: D{{Key: "$add", Value: A{"$$x", 2}}}}}}}, want: A{int32(3), int32(4), int32(5)}},
		{name: "map this", expr: D{{Key: "$map", Value: D{{Key: "input", Value: "$arr"}, {Key: "in", Value: D{{Key: "$multiply", Value: A{"$$this", "$n"}}}}}}}, want: A{int32(5), int32(10), int32(15)}},
		{name: "map null", expr: D{{Key: "$map", Value: D{{Key: "input", Value: "$nope"}, {Key: "in", Value: "$$this"}}}}, want: nil},
		{name: "map non-array", expr: D{{Key: "$map", Value: D{{Key: "input", Value: "$n"}, {Key: "in", Value: "$$this"}}}}, code: 16883},
		{name: "nested map", expr: D{{Key: "$map", Value: D{{Key: "input", Value: A{A{1, 2}, A{3}}}, {Key: "as", Value: "o"}, {Key: "in", Value: D{{Key: "$map", Value: D{{Key: "input", Value: "$$o"}, {Key: "in", Value: D{{Key: "$add", Value: A{"$$this", D{{Key: "$size", Value: "$$o"}}}}}}}}}}}}}, want: A{A{int32(3), int32(4)}, A{int32(4)}}},
		{name: "filter", expr: D{{Key: "$filter", Value: D{{Key: "input", Value: "$arr"}, {Key: "as", Value: "v"}, {Key: "cond", Value: D{{Key: "$gte", Value: A{"$$v", 2}}}}}}}, want: A{int32(2), int32(3)}},
		{name: "filter limit", expr: D{{Key: "$filter", Value: D{{Key: "input", Value: "$arr"}, {Key: "cond", Value: true}, {Key: "limit", Value: 1}}}}, want: A{int32(1)}},
		{name: "reduce sum", expr: D{{Key: "$reduce", Value: D{{Key: "input", Value: "$arr"}, {Key: "initialValue", Value: 0}, {Key: "in", Value: D{{Key: "$add", Value: A{"$$value", "$$this"}}}}}}}, want: int32(6)},
		{name: "reduce concat", expr: D{{Key: "$reduce", Value: D{{Key: "input", Value: A{"a", "b", "c"}}, {Key: "initialValue", Value: ""}, {Key: "in", Value: D{{Key: "$concat", Value: A{"$$value", "$$this"}}}}}}}, want: "abc"},
		{name: "reduce object value", expr: D{{Key: "$reduce", Value: D{{Key: "input", Value: A{1, 2}}, {Key: "initialValue", Value: D{{Key: "sum", Value: 5}}}, {Key: "in", Value: D{{Key: "sum", Value: D{{Key: "$add", Value: A{"$$value.sum", "$$this"}}}}}}}}}, want: D{{Key: "sum", Value: int32(8)}}},
		{name: "let", expr: D{{Key: "$let", Value: D{{Key: "vars", Value: D{{Key: "total", Value: D{{Key: "$add", Value: A{"$n", 1}}}}, {Key: "k", Value: 2}}}, {Key: "in", Value: D{{Key: "$multiply", Value: A{"$$total", "$$k"}}}}}}}, want: int32(12)},
		{name: "let shadows", expr: D{{Key: "$let", Value: D{{Key: "vars", Value: D{{Key: "x", Value: 1}}}, {Key: "in", Value: D{{Key: "$let", Value: D{{Key: "vars", Value: D{{Key: "x", Value: 2}}}, {Key: "in", Value: "$$x"}}}}}}}}, want: int32(2)},
		{name: "undefined variable", expr: D{{Key: "$add", Value: A{"$$nope", 1}}}, code: 17276},
		{name: "system variable", expr: "$$NOW", code: 238},
		{name: "let bad name", expr: D{{Key: "$let", Value: D{{Key: "vars", Value: D{{Key: "X", Value: 1}}}, {Key: "in", Value: 1}}}}, code: 16867},
	})
}
