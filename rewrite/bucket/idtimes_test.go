package bucket_test

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
)

func oidAt(sec uint32, n byte) bsoncore.Value {
	id := bson.ObjectID{byte(sec >> 24), byte(sec >> 16), byte(sec >> 8), byte(sec), 0, 0, 0, 0, 0, 0, 0, n}
	return bsoncore.Value{Type: bsoncore.TypeObjectID, Data: id[:]}
}

// TestIDTimeLookupServes: which finds by _id the id-time documents serve
// (ObjectIDs of at most MaxIDTimeMinutes minutes), and that they answer
// only under a marker that vouches for them.
func TestIDTimeLookupServes(t *testing.T) {
	str := bsoncore.Value{Type: bsoncore.TypeString, Data: bsoncore.AppendString(nil, "x")}
	var spread []bsoncore.Value
	for i := range bucket.MaxIDTimeMinutes + 1 {
		spread = append(spread, oidAt(1_800_000_000+uint32(i)*60, 1))
	}
	cases := []struct {
		name  string
		ids   []bsoncore.Value
		serve bool
	}{
		{"ObjectIDs of one minute", []bsoncore.Value{oidAt(1_800_000_000, 1), oidAt(1_800_000_001, 2)}, true},
		{"ObjectIDs of the most minutes", spread[:bucket.MaxIDTimeMinutes], true},
		{"ObjectIDs of more minutes", spread, false},
		{"a string among them", []bsoncore.Value{oidAt(1_800_000_000, 1), str}, false},
	}
	for _, c := range cases {
		l := bucket.NewIDTimeLookup(bucket.NewIDSet(c.ids))
		if (l != nil) != c.serve {
			t.Fatalf("%s: served %v, want %v", c.name, l != nil, c.serve)
		}
	}
	l := bucket.NewIDTimeLookup(bucket.NewIDSet(spread[:2]))
	cmds := l.Finds("ids", "iot")
	if len(cmds) != 3 {
		t.Fatalf("%d finds, want the marker's and two minutes'", len(cmds))
	}
	oldMarker := bsoncore.NewDocumentBuilder().AppendString("_id", bucket.IDIndexMarker).AppendInt64("v", 1).Build()
	l.Take([]bsoncore.Document{oldMarker, nil, nil})
	if _, ok := l.Candidates(); ok || l.Pending() {
		t.Fatal("answered under a marker that does not vouch for the id-time documents")
	}
	l = bucket.NewIDTimeLookup(bucket.NewIDSet(spread[:2]))
	l.Finds("ids", "iot")
	l.Take([]bsoncore.Document{bucket.IDIndexMarkerDoc(1), nil, nil})
	if ids, ok := l.Candidates(); !ok || len(ids) != 0 || l.Pending() {
		t.Fatalf("no documents for the minutes: candidates %v ok=%v, want none, answered", ids, ok)
	}
}
