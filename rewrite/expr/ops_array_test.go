package expr_test

import "testing"

// MongoDB's documented answers for the array operators.
func TestArrayOperators(t *testing.T) {
	runExprCases(t, []exprCase{
		{name: "size", expr: D{{Key: "$size", Value: "$arr"}}, want: int32(3)},
		{name: "size of a non-array", expr: D{{Key: "$size", Value: "$n"}}, code: 17124},
		{name: "arrayElemAt", expr: D{{Key: "$arrayElemAt", Value: A{A{1, 2, 3}, 0}}}, want: int32(1)},
		{name: "arrayElemAt negative", expr: D{{Key: "$arrayElemAt", Value: A{A{1, 2, 3}, -2}}}, want: int32(2)},
		{name: "arrayElemAt out of range", expr: D{{Key: "$arrayElemAt", Value: A{A{1, 2, 3}, 15}}}, want: missingV},
		{name: "first", expr: D{{Key: "$first", Value: "$arr"}}, want: int32(1)},
		{name: "last", expr: D{{Key: "$last", Value: "$arr"}}, want: int32(3)},
		{name: "first of empty", expr: D{{Key: "$first", Value: A{A{}}}}, want: missingV},
		{name: "first of null", expr: D{{Key: "$first", Value: "$nope"}}, want: nil},
		{name: "concatArrays", expr: D{{Key: "$concatArrays", Value: A{A{"hello", " "}, A{"world"}}}}, want: A{"hello", " ", "world"}},
		{name: "concatArrays null", expr: D{{Key: "$concatArrays", Value: A{"$arr", nil}}}, want: nil},
		{name: "in", expr: D{{Key: "$in", Value: A{2, "$arr"}}}, want: true},
		{name: "in absent", expr: D{{Key: "$in", Value: A{"abc", A{"xyz", "abc "}}}}, want: false},
		{name: "in not an array", expr: D{{Key: "$in", Value: A{1, "$n"}}}, code: 40081},
		{name: "isArray", expr: D{{Key: "$isArray", Value: A{"$arr"}}}, want: true},
		{name: "isArray no", expr: D{{Key: "$isArray", Value: "$n"}}, want: false},
		{name: "reverseArray", expr: D{{Key: "$reverseArray", Value: "$arr"}}, want: A{int32(3), int32(2), int32(1)}},
		{name: "slice first", expr: D{{Key: "$slice", Value: A{A{1, 2, 3}, 1}}}, want: A{int32(1)}},
		{name: "slice last", expr: D{{Key: "$slice", Value: A{A{1, 2, 3}, -2}}}, want: A{int32(2), int32(3)}},
		{name: "slice position", expr: D{{Key: "$slice", Value: A{A{1, 2, 3}, 1, 1}}}, want: A{int32(2)}},
		{name: "slice negative position", expr: D{{Key: "$slice", Value: A{A{1, 2, 3}, -20, 2}}}, want: A{int32(1), int32(2)}},
		{name: "slice huge count", expr: D{{Key: "$slice", Value: A{A{1, 2, 3}, 1, int64(1) << 62}}}, want: A{int32(2), int32(3)}},
		{name: "range", expr: D{{Key: "$range", Value: A{0, 10, 2}}}, want: A{int32(0), int32(2), int32(4), int32(6), int32(8)}},
		{name: "range down", expr: D{{Key: "$range", Value: A{10, 0, -2}}}, want: A{int32(10), int32(8), int32(6), int32(4), int32(2)}},
		{name: "range empty", expr: D{{Key: "$range", Value: A{0, 10, -2}}}, want: A{}},
		{name: "range step 0", expr: D{{Key: "$range", Value: A{0, 10, 0}}}, code: 34449},
		{name: "sum of an array", expr: D{{Key: "$sum", Value: "$arr"}}, want: int32(6)},
		{name: "sum of arguments", expr: D{{Key: "$sum", Value: A{"$n", 1.5, "x"}}}, want: 6.5},
		{name: "avg of an array", expr: D{{Key: "$avg", Value: "$arr"}}, want: 2.0},
		{name: "avg of nothing numeric", expr: D{{Key: "$avg", Value: A{"a", "b"}}}, want: nil},
		{name: "min", expr: D{{Key: "$min", Value: "$arr"}}, want: int32(1)},
		{name: "max of arguments", expr: D{{Key: "$max", Value: A{"$n", 2, nil}}}, want: int32(5)},
	})
}
