package bsonutil

import (
	"math"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

func TestFindValueNaNOrDecimal(t *testing.T) {
	dec, _ := bson.ParseDecimal128("1.5")
	for _, tc := range []struct {
		name string
		doc  bson.D
		path string
	}{
		{"none", bson.D{{Key: "a", Value: 1.5}, {Key: "b", Value: bson.D{{Key: "c", Value: "x"}}}}, ""},
		{"top", bson.D{{Key: "a", Value: 1}, {Key: "b", Value: math.NaN()}}, "b"},
		{"nested", bson.D{{Key: "a", Value: bson.D{{Key: "b", Value: bson.D{{Key: "c", Value: math.NaN()}}}}}}, "a.b.c"},
		{"array", bson.D{{Key: "a", Value: bson.A{1, 2, math.NaN()}}}, "a.2"},
		{"decimal", bson.D{{Key: "d", Value: bson.A{bson.D{{Key: "x", Value: dec}}}}}, "d.0.x"},
		{"infinity is not", bson.D{{Key: "a", Value: math.Inf(1)}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw, err := bson.Marshal(tc.doc)
			if err != nil {
				t.Fatal(err)
			}
			path, ok := FindValue(bsoncore.Document(raw), IsNaNOrDecimal)
			if ok != (tc.path != "") || path != tc.path {
				t.Fatalf("FindValue = %q, %v; want %q", path, ok, tc.path)
			}
		})
	}
}

func TestFindValueMalformed(t *testing.T) {
	if p, ok := FindValue(bsoncore.Document{5, 0, 0, 0, 1, 'a'}, IsNaNOrDecimal); ok {
		t.Fatalf("found %q in a malformed document", p)
	}
}
