package agg_test

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// TestGroupMissingKeyField: a missing field of an _id object is null, so
// a null and a missing m are one group (MongoDB: [{_id: {x: null}, n: 2}]);
// nested objects keep MongoDB's object-expression rule (the field goes).
func TestGroupMissingKeyField(t *testing.T) {
	in := []bson.D{{{Key: "m", Value: nil}, {Key: "val", Value: int32(1)}}, {{Key: "val", Value: int32(2)}}}
	checkRun(t, in, A{D{{Key: "$group", Value: D{{Key: "_id", Value: D{{Key: "x", Value: "$m"}}}, {Key: "n", Value: D{{Key: "$sum", Value: 1}}}}}}},
		[]D{{{Key: "_id", Value: D{{Key: "x", Value: nil}}}, {Key: "n", Value: int32(2)}}})
	checkRun(t, in, A{D{{Key: "$group", Value: D{{Key: "_id", Value: D{{Key: "x", Value: "$m"}, {Key: "v", Value: "$val"}}}, {Key: "n", Value: D{{Key: "$sum", Value: 1}}}}}}},
		[]D{{{Key: "_id", Value: D{{Key: "x", Value: nil}, {Key: "v", Value: int32(1)}}}, {Key: "n", Value: int32(1)}},
			{{Key: "_id", Value: D{{Key: "x", Value: nil}, {Key: "v", Value: int32(2)}}}, {Key: "n", Value: int32(1)}}})
}
