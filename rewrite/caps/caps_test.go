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

func TestDetectNativeTimeseries(t *testing.T) {
	cases := []struct {
		name   string
		reply  []byte
		native bool
	}{
		{"MongoDB 4.4", buildInfo([]int32{4, 4, 29, 0}, false), false},
		{"MongoDB 5.0", buildInfo([]int32{5, 0, 0, 0}, false), true},
		{"MongoDB 8.0", buildInfo([]int32{8, 0, 4, 0}, false), true},
		{"no versionArray", buildInfo(nil, false), false},
		// FerretDB says it is MongoDB 7.0 but has no time-series collections.
		{"FerretDB", buildInfo([]int32{7, 0, 77, 0}, true), false},
	}
	for _, c := range cases {
		if got := Detect(c.reply).NativeTimeseries; got != c.native {
			t.Errorf("%s: NativeTimeseries %v, want %v", c.name, got, c.native)
		}
	}
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
