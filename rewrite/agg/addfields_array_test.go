package agg_test

import "testing"

// TestAddFieldsThroughArray: a dotted $set through an array sets the field
// in each element (MongoDB's AppliesDottedAdditionToEachElementInArray);
// the engine replaced the array with one document.
func TestAddFieldsThroughArray(t *testing.T) {
	mixed := []D{{{Key: "_id", Value: 2}, {Key: "a", Value: A{1, D{}, D{{Key: "b", Value: 1}}, D{{Key: "b", Value: 1}, {Key: "c", Value: 2}}, A{}, A{1, D{{Key: "c", Value: 1}}}}}}}
	checkRun(t, mixed, A{D{{Key: "$set", Value: D{{Key: "a.b", Value: true}}}}},
		[]D{{{Key: "_id", Value: 2}, {Key: "a", Value: A{D{{Key: "b", Value: true}}, D{{Key: "b", Value: true}}, D{{Key: "b", Value: true}}, D{{Key: "b", Value: true}, {Key: "c", Value: 2}}, A{}, A{D{{Key: "b", Value: true}}, D{{Key: "c", Value: 1}, {Key: "b", Value: true}}}}}}})
	in := []D{{{Key: "_id", Value: 1}, {Key: "a", Value: A{D{{Key: "x", Value: 1}}, D{{Key: "x", Value: 2}}}}}}
	checkRun(t, in, A{D{{Key: "$set", Value: D{{Key: "a.b", Value: 7}}}}},
		[]D{{{Key: "_id", Value: 1}, {Key: "a", Value: A{D{{Key: "x", Value: 1}, {Key: "b", Value: 7}}, D{{Key: "x", Value: 2}, {Key: "b", Value: 7}}}}}})
}

// $densify's generated numbers are the previous value plus the step
// (ExpressionAdd in DensifyValue::increment): doubles stay doubles.
