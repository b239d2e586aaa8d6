package cursor

import (
	"bytes"
	"strconv"
	"testing"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// TestWithID: the reply is {cursor: {<key>: [...], id, ns}, ok: 1}, the
// same bytes as built piece by piece, for batches whose array keys take
// one to five digits; and Docs reads it back.
func TestWithID(t *testing.T) {
	for _, n := range []int{0, 1, 10, 11, 101, 12_345} {
		batch := make([]bsoncore.Document, n)
		for i := range batch {
			batch[i] = bsoncore.NewDocumentBuilder().AppendInt64("i", int64(i)).AppendString("s", strconv.Itoa(i*7)).Build()
		}
		got := Reply{Key: "nextBatch", Batch: batch, NS: "iot.readings"}.WithID(42)
		arr := bsoncore.NewArrayBuilder()
		for _, d := range batch {
			arr.AppendDocument(d)
		}
		cur := bsoncore.NewDocumentBuilder().AppendArray("nextBatch", arr.Build()).AppendInt64("id", 42).AppendString("ns", "iot.readings").Build()
		want := bsoncore.NewDocumentBuilder().AppendDocument("cursor", cur).AppendDouble("ok", 1).Build()
		if !bytes.Equal(got, want) {
			t.Fatalf("%d documents: %s, want %s", n, got, want)
		}
		docs, id, err := Docs(got)
		if err != nil || id != 42 || len(docs) != n {
			t.Fatalf("%d documents: read back %d, id %d, err %v", n, len(docs), id, err)
		}
	}
}

func TestDecimalDigits(t *testing.T) {
	for _, i := range []int{0, 9, 10, 99, 100, 12_345, 1 << 40} {
		if got, want := decimalDigits(i), len(strconv.Itoa(i)); got != want {
			t.Errorf("decimalDigits(%d) = %d, want %d", i, got, want)
		}
	}
}
