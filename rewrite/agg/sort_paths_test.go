package agg_test

import (
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// A sort key's path through an array in a document is refused: MongoDB
// sorts by every value such a path reaches (arrays inside flattened, an
// element without the field as null), which the engine does not. An
// array at the path's end sorts by its least or greatest element.
func TestSortPathThroughArray(t *testing.T) {
	through := []bson.D{
		{{Key: "_id", Value: int32(1)}, {Key: "a", Value: bson.D{{Key: "b", Value: 0.5}}}},
		{{Key: "_id", Value: int32(2)}, {Key: "a", Value: bson.A{bson.D{{Key: "b", Value: bson.A{3, 0}}}, bson.D{{Key: "b", Value: 1}}}}},
	}
	for _, stage := range []bson.D{
		{{Key: "$sort", Value: bson.D{{Key: "a.b", Value: 1}}}},
		{{Key: "$setWindowFields", Value: bson.D{{Key: "sortBy", Value: bson.D{{Key: "a.b", Value: 1}}}, {Key: "output", Value: bson.D{{Key: "n", Value: bson.D{{Key: "$documentNumber", Value: bson.D{}}}}}}}}},
	} {
		_, err := run(t, through, bson.A{stage})
		if err == nil || !strings.Contains(err.Error(), `"a.b", which goes through an array`) {
			t.Fatalf("%s: err %v, want the path refused", stage[0].Key, err)
		}
	}
	leaf := []bson.D{
		{{Key: "_id", Value: int32(1)}, {Key: "a", Value: bson.D{{Key: "b", Value: 2}}}},
		{{Key: "_id", Value: int32(2)}, {Key: "a", Value: bson.D{{Key: "b", Value: bson.A{5, 1}}}}},
		{{Key: "_id", Value: int32(3)}, {Key: "a", Value: bson.D{{Key: "b", Value: 3}}}},
	}
	for _, c := range []struct {
		dir  int
		want []int32
	}{{1, []int32{2, 1, 3}}, {-1, []int32{2, 3, 1}}} {
		got, err := run(t, leaf, bson.A{bson.D{{Key: "$sort", Value: bson.D{{Key: "a.b", Value: c.dir}}}}})
		if err != nil {
			t.Fatal(err)
		}
		var ids []int32
		for _, d := range got {
			ids = append(ids, d.Lookup("_id").Int32())
		}
		if len(ids) != 3 || ids[0] != c.want[0] || ids[1] != c.want[1] || ids[2] != c.want[2] {
			t.Fatalf("$sort {a.b: %d}: %v, want %v", c.dir, ids, c.want)
		}
	}
}
