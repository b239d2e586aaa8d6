package bucket

import (
	"math"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// val makes a bsoncore.Value from a Go value via the driver's marshaller.
func val(t testing.TB, v any) bsoncore.Value {
	t.Helper()
	doc, err := bson.Marshal(bson.D{{Key: "v", Value: v}})
	if err != nil {
		t.Fatal(err)
	}
	return bsoncore.Document(doc).Lookup("v")
}

func TestAddNums(t *testing.T) {
	tests := []struct {
		name string
		a, b any
		want any
	}{
		{"int32+int32", int32(2), int32(3), int32(5)},
		{"int32 overflow to int64", int32(math.MaxInt32), int32(1), int64(math.MaxInt32) + 1},
		{"int32 negative overflow to int64", int32(math.MinInt32), int32(-1), int64(math.MinInt32) - 1},
		{"int32+int64 is int64", int32(1), int64(2), int64(3)},
		{"int64 overflow to double", int64(math.MaxInt64), int64(1), float64(math.MaxInt64) + 1},
		{"int64 negative overflow to double", int64(math.MinInt64), int32(-1), float64(math.MinInt64) - 1},
		{"int + double is double", int32(1), 0.5, 1.5},
		{"int64 + double is double", int64(2), 0.25, 2.25},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := AddNums(NumFrom(val(t, tc.a)), NumFrom(val(t, tc.b)))
			doc := AppendNum(nil, "v", got)
			want := val(t, tc.want)
			gotV := bsoncore.Value{Type: bsoncore.Type(doc[0]), Data: doc[3:]}
			if !gotV.Equal(want) {
				t.Errorf("%v + %v = %s, want %s", tc.a, tc.b, gotV, want)
			}
		})
	}
}
