package caps

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// buildInfo is a buildInfo reply with versionArray v (none when nil),
// from FerretDB when ferret.
func buildInfo(v []int32, ferret bool) []byte {
	b := bsoncore.NewDocumentBuilder().AppendString("version", "x")
	if v != nil {
		arr := bsoncore.NewArrayBuilder()
		for _, n := range v {
			arr.AppendInt32(n)
		}
		b.AppendArray("versionArray", arr.Build())
	}
	if ferret {
		b.AppendString("ferretdbVersion", "v1.24.0")
	}
	return b.AppendDouble("ok", 1).Build()
}

// TestDetectUnusedIndexes: only FerretDB reads by no index but _id's.
func TestDetectUnusedIndexes(t *testing.T) {
	if !Detect(buildInfo([]int32{7, 0, 77, 0}, true)).UnusedIndexes {
		t.Error("FerretDB: UnusedIndexes false")
	}
	if Detect(buildInfo([]int32{8, 0, 4, 0}, false)).UnusedIndexes {
		t.Error("MongoDB: UnusedIndexes true")
	}
}
