package expr_test

import "testing"

// MongoDB's documented answers for the object operators.
func TestObjectOperators(t *testing.T) {
	runExprCases(t, []exprCase{
		{name: "getField dotted name", expr: D{{Key: "$getField", Value: D{{Key: "field", Value: "a.b"}, {Key: "input", Value: "$obj"}}}}, want: "dotted"},
		{name: "getField $-name", expr: D{{Key: "$getField", Value: D{{Key: "field", Value: D{{Key: "$literal", Value: "$price"}}}, {Key: "input", Value: "$obj"}}}}, want: int32(10)},
		{name: "getField shorthand", expr: D{{Key: "$getField", Value: "n"}}, want: int32(5)},
		{name: "getField absent", expr: D{{Key: "$getField", Value: D{{Key: "field", Value: "z"}, {Key: "input", Value: "$obj"}}}}, want: missingV},
		{name: "getField null input", expr: D{{Key: "$getField", Value: D{{Key: "field", Value: "z"}, {Key: "input", Value: nil}}}}, want: nil},
		{name: "getField non-object input", expr: D{{Key: "$getField", Value: D{{Key: "field", Value: "z"}, {Key: "input", Value: 1}}}}, code: 3041705},
		{name: "setField", expr: D{{Key: "$setField", Value: D{{Key: "field", Value: "a.b"}, {Key: "input", Value: D{{Key: "x", Value: 1}}}, {Key: "value", Value: 2}}}}, want: D{{Key: "x", Value: int32(1)}, {Key: "a.b", Value: int32(2)}}},
		{name: "setField replaces", expr: D{{Key: "$setField", Value: D{{Key: "field", Value: "x"}, {Key: "input", Value: D{{Key: "x", Value: 1}, {Key: "y", Value: 2}}}, {Key: "value", Value: 3}}}}, want: D{{Key: "x", Value: int32(3)}, {Key: "y", Value: int32(2)}}},
		{name: "setField $$REMOVE", expr: D{{Key: "$setField", Value: D{{Key: "field", Value: "x"}, {Key: "input", Value: D{{Key: "x", Value: 1}, {Key: "y", Value: 2}}}, {Key: "value", Value: "$$REMOVE"}}}}, want: D{{Key: "y", Value: int32(2)}}},
		{name: "unsetField", expr: D{{Key: "$unsetField", Value: D{{Key: "field", Value: "a.b"}, {Key: "input", Value: "$obj"}}}}, want: D{{Key: "$price", Value: int32(10)}, {Key: "c", Value: int32(1)}}},
		{name: "setField non-constant field", expr: D{{Key: "$setField", Value: D{{Key: "field", Value: "$s"}, {Key: "input", Value: "$obj"}, {Key: "value", Value: 1}}}}, code: 4161106},
		{name: "mergeObjects", expr: D{{Key: "$mergeObjects", Value: A{D{{Key: "a", Value: 1}, {Key: "b", Value: 1}}, nil, D{{Key: "b", Value: 2}, {Key: "c", Value: 3}}}}}, want: D{{Key: "a", Value: int32(1)}, {Key: "b", Value: int32(2)}, {Key: "c", Value: int32(3)}}},
		{name: "mergeObjects non-object", expr: D{{Key: "$mergeObjects", Value: A{D{}, 1}}}, code: 40400},
		{name: "objectToArray", expr: D{{Key: "$objectToArray", Value: D{{Key: "item", Value: "foo"}, {Key: "qty", Value: 25}}}}, want: A{D{{Key: "k", Value: "item"}, {Key: "v", Value: "foo"}}, D{{Key: "k", Value: "qty"}, {Key: "v", Value: int32(25)}}}},
		{name: "objectToArray null", expr: D{{Key: "$objectToArray", Value: "$nope"}}, want: nil},
		{name: "arrayToObject pairs", expr: D{{Key: "$arrayToObject", Value: A{A{A{"item", "abc123"}, A{"qty", 25}}}}}, want: D{{Key: "item", Value: "abc123"}, {Key: "qty", Value: int32(25)}}},
		{name: "arrayToObject k v", expr: D{{Key: "$arrayToObject", Value: A{A{D{{Key: "k", Value: "item"}, {Key: "v", Value: "abc"}}, D{{Key: "k", Value: "item"}, {Key: "v", Value: "def"}}}}}}, want: D{{Key: "item", Value: "def"}}},
		{name: "arrayToObject bad key", expr: D{{Key: "$arrayToObject", Value: A{A{A{1, 2}}}}}, code: 40394},
	})
}
