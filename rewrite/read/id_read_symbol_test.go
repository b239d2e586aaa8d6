package read

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
)

// A find by _id with the event-id index (marker there) returns what the
// event scan (no marker) returns. MongoDB compares a string and a symbol
// of the same characters equal, and so does the proxy's own filter: the
// scan finds the event stored with _id Symbol("abc") for {_id: "abc"}, but
// the index's Bloom filter rules its bucket out.
func TestIDIndexReadSymbolID(t *testing.T) {
	sb, _ := eventScanData(t)
	// One more bucket, whose one event has _id Symbol("abc").
	ev := bsoncore.NewDocumentBuilder().AppendSymbol("_id", "abc").AppendDateTime("ts", 5*rwtest.Hour+1000).AppendNull("sensorId").AppendInt32("v", 1).Build()
	meta := bsoncore.NewDocumentBuilder().AppendString("site", "east").AppendInt32("n", 1).Build()
	b := bsoncore.NewDocumentBuilder().AppendObjectID("_id", bson.NewObjectID()).AppendDocument("meta", meta).
		AppendDateTime("start", 5*rwtest.Hour).AppendInt32("count", 1).
		AppendArray("events", bsoncore.NewArrayBuilder().AppendDocument(ev).Build()).Build()
	sb.all = append(sb.all, b)
	count := func(marker bool) int {
		cmd := D{{Key: "find", Value: "readings"}, {Key: "filter", Value: D{{Key: "_id", Value: "abc"}}}}
		plan, err := rdPlan(t, rwtest.FerretCaps, cmd)
		if err != nil {
			t.Fatal(err)
		}
		if plan.Point == nil || plan.Point.Ids == nil {
			t.Fatal("not an index read")
		}
		ib := newIndexedBuckets(t, sb, marker)
		pr := plan.Point
		n := 0
		for round := 0; round < 100; round++ {
			if round > 0 {
				pr.Want(-1)
			}
			for cmds := pr.Lookups(); cmds != nil; cmds = pr.Lookups() {
				var replies [][]byte
				for _, c := range cmds {
					replies = append(replies, ib.reply(t, c))
				}
				if err := pr.Feed(replies); err != nil {
					t.Fatal(err)
				}
			}
			reply, more := pr.Batch(42)
			key := "nextBatch"
			if round == 0 {
				key = "firstBatch"
			}
			vals, _ := bsoncore.Document(reply).Lookup("cursor", key).Array().Values()
			n += len(vals)
			if !more {
				return n
			}
		}
		t.Fatal("cursor never exhausted")
		return 0
	}
	scan, index := count(false), count(true)
	if scan != 1 {
		t.Fatalf("the event scan found %d events, want 1", scan)
	}
	if index != scan {
		t.Fatalf("find {_id: \"abc\"}: the event-id index read returned %d events, the event scan %d", index, scan)
	}
}
