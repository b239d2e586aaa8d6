package read

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/read/point"
)

func TestHeldCursor(t *testing.T) {
	var docs []bsoncore.Document
	for i := 0; i < 250; i++ {
		docs = append(docs, bsoncore.NewDocumentBuilder().AppendInt32("i", int32(i)).Build())
	}
	ids := int64(0)
	newID := func() int64 { ids++; return 77 }
	res := point.HeldResult(docs, "iot.readings", -1, newID)
	first := bson.Raw(res.Reply)
	arr, _ := first.Lookup("cursor", "firstBatch").Array().Values()
	if len(arr) != point.DefaultFirstBatch || first.Lookup("cursor", "id").Int64() != 77 || res.Cursor == nil {
		t.Fatalf("first batch of %d, id %v, cursor %v", len(arr), first.Lookup("cursor", "id"), res.Cursor)
	}
	seen := len(arr)
	c := res.Cursor
	for c != nil {
		gm := bsoncore.NewDocumentBuilder().AppendInt64("getMore", 77).AppendString("collection", "readings").AppendInt32("batchSize", 100).Build()
		r := c.More(gm)
		step, done := r.Next()
		if !done || step != nil {
			t.Fatal("a held cursor's getMore needs no upstream")
		}
		out := r.Result()
		batch, _ := bson.Raw(out.Reply).Lookup("cursor", "nextBatch").Array().Values()
		if got := batch[0].Document().Lookup("i").Int32(); int(got) != seen {
			t.Fatalf("batch starts at %d, want %d", got, seen)
		}
		seen += len(batch)
		if (out.Cursor == nil) != (bson.Raw(out.Reply).Lookup("cursor", "id").Int64() == 0) {
			t.Fatalf("cursor %v but id %v", out.Cursor, bson.Raw(out.Reply).Lookup("cursor", "id"))
		}
		c = out.Cursor
	}
	if seen != 250 || ids != 1 {
		t.Fatalf("%d documents read, %d ids made", seen, ids)
	}
	small := point.HeldResult(docs[:3], "iot.readings", -1, newID)
	if small.Cursor != nil || bson.Raw(small.Reply).Lookup("cursor", "id").Int64() != 0 {
		t.Fatal("a result of one batch holds a cursor")
	}
}
