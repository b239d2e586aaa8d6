package expr_test

import "testing"

// MongoDB's documented answers for the string operators.
func TestStringOperators(t *testing.T) {
	runExprCases(t, []exprCase{
		{name: "toUpper", expr: D{{Key: "$toUpper", Value: "abC1é"}}, want: "ABC1é"},
		{name: "toLower", expr: D{{Key: "$toLower", Value: "$s"}}, want: "  hello world  "},
		{name: "toUpper of null", expr: D{{Key: "$toUpper", Value: nil}}, want: ""},
		{name: "toUpper of a number", expr: D{{Key: "$toUpper", Value: int32(5)}}, want: "5"},
		{name: "toUpper of an array", expr: D{{Key: "$toUpper", Value: A{A{1}}}}, code: 16007},
		{name: "trim", expr: D{{Key: "$trim", Value: D{{Key: "input", Value: "$s"}}}}, want: "Hello World"},
		{name: "ltrim", expr: D{{Key: "$ltrim", Value: D{{Key: "input", Value: "$s"}}}}, want: "Hello World  "},
		{name: "rtrim chars", expr: D{{Key: "$rtrim", Value: D{{Key: "input", Value: "xxaxx"}, {Key: "chars", Value: "x"}}}}, want: "xxa"},
		{name: "trim null", expr: D{{Key: "$trim", Value: D{{Key: "input", Value: nil}}}}, want: nil},
		{name: "trim a number", expr: D{{Key: "$trim", Value: D{{Key: "input", Value: 1}}}}, code: 50699},
		{name: "concat", expr: D{{Key: "$concat", Value: A{"a", "-", "b"}}}, want: "a-b"},
		{name: "strLenCP", expr: D{{Key: "$strLenCP", Value: "cafétéria"}}, want: int32(9)},
		{name: "strLenCP of a number", expr: D{{Key: "$strLenCP", Value: 1}}, code: 34471},
		{name: "substrCP", expr: D{{Key: "$substrCP", Value: A{"cafétéria", 0, 5}}}, want: "cafét"},
		{name: "substrCP past the end", expr: D{{Key: "$substrCP", Value: A{"abc", 1, 10}}}, want: "bc"},
		{name: "substrCP huge length", expr: D{{Key: "$substrCP", Value: A{"abc", 1, int64(1) << 62}}}, want: "bc"},
		{name: "substrBytes huge length", expr: D{{Key: "$substrBytes", Value: A{"abc", 1, int64(1) << 62}}}, want: "bc"},
		{name: "substrBytes", expr: D{{Key: "$substrBytes", Value: A{"hello", 1, 3}}}, want: "ell"},
		{name: "substrBytes at the end", expr: D{{Key: "$substrBytes", Value: A{"abc", 3, 2}}}, want: ""},
		{name: "substrBytes past the end", expr: D{{Key: "$substrBytes", Value: A{"abc", 7, 2}}}, want: ""},
		{name: "substrBytes mid-character", expr: D{{Key: "$substrBytes", Value: A{"é", 1, 1}}}, code: 28656},
		{name: "split", expr: D{{Key: "$split", Value: A{"June-15-2013", "-"}}}, want: A{"June", "15", "2013"}},
		{name: "split null", expr: D{{Key: "$split", Value: A{nil, "-"}}}, want: nil},
		{name: "split empty separator", expr: D{{Key: "$split", Value: A{"a", ""}}}, code: 40087},
		{name: "indexOfCP", expr: D{{Key: "$indexOfCP", Value: A{"cafétéria", "é"}}}, want: int32(3)},
		{name: "indexOfCP from", expr: D{{Key: "$indexOfCP", Value: A{"cafétéria", "é", 4}}}, want: int32(5)},
		{name: "indexOfCP absent", expr: D{{Key: "$indexOfCP", Value: A{"abc", "z"}}}, want: int32(-1)},
		{name: "indexOfCP null", expr: D{{Key: "$indexOfCP", Value: A{nil, "z"}}}, want: nil},
	})
}
