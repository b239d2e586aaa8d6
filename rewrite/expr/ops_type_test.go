package expr_test

import "testing"

// MongoDB's documented answers for the type operators and conditionals.
func TestTypeOperators(t *testing.T) {
	runExprCases(t, []exprCase{
		{name: "literal", expr: D{{Key: "$literal", Value: "$s"}}, want: "$s"},
		{name: "const", expr: D{{Key: "$const", Value: D{{Key: "$add", Value: 1}}}}, want: D{{Key: "$add", Value: int32(1)}}},
		{name: "type", expr: D{{Key: "$type", Value: "$arr"}}, want: "array"},
		{name: "type missing", expr: D{{Key: "$type", Value: "$nope"}}, want: "missing"},
		{name: "isNumber", expr: D{{Key: "$isNumber", Value: "$n"}}, want: true},
		{name: "isNumber string", expr: D{{Key: "$isNumber", Value: "5"}}, want: false},
		{name: "toInt", expr: D{{Key: "$toInt", Value: "42"}}, want: int32(42)},
		{name: "toLong", expr: D{{Key: "$toLong", Value: true}}, want: int64(1)},
		{name: "toDouble", expr: D{{Key: "$toDouble", Value: "1.5"}}, want: 1.5},
		{name: "toString", expr: D{{Key: "$toString", Value: 2.5}}, want: "2.5"},
		{name: "toBool", expr: D{{Key: "$toBool", Value: 0}}, want: false},
		{name: "convert", expr: D{{Key: "$convert", Value: D{{Key: "input", Value: "7"}, {Key: "to", Value: "int"}}}}, want: int32(7)},
		{name: "convert numeric to", expr: D{{Key: "$convert", Value: D{{Key: "input", Value: 7}, {Key: "to", Value: 2}}}}, want: "7"},
		{name: "convert onError", expr: D{{Key: "$convert", Value: D{{Key: "input", Value: "x"}, {Key: "to", Value: "int"}, {Key: "onError", Value: -1}}}}, want: int32(-1)},
		{name: "convert onNull", expr: D{{Key: "$convert", Value: D{{Key: "input", Value: "$nope"}, {Key: "to", Value: "int"}, {Key: "onNull", Value: 0}}}}, want: int32(0)},
		{name: "convert fails", expr: D{{Key: "$convert", Value: D{{Key: "input", Value: "x"}, {Key: "to", Value: "int"}}}}, code: 241},
		{name: "ifNull", expr: D{{Key: "$ifNull", Value: A{"$nope", "$null", "d"}}}, want: "d"},
		{name: "cond", expr: D{{Key: "$cond", Value: D{{Key: "if", Value: D{{Key: "$gte", Value: A{"$n", 5}}}}, {Key: "then", Value: "big"}, {Key: "else", Value: "small"}}}}, want: "big"},
		{name: "switch", expr: D{{Key: "$switch", Value: D{{Key: "branches", Value: A{D{{Key: "case", Value: false}, {Key: "then", Value: 1}}, D{{Key: "case", Value: true}, {Key: "then", Value: 2}}}}}}}, want: int32(2)},
	})
}
