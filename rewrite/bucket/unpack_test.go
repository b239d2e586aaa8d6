package bucket

import (
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// TestUnpackedEvents: a packed bucket (raw or compressed, alone or with
// events a later $push added) becomes the array form with the same events
// in the same order and its other fields as they were; a bucket without
// packed events is left alone; a damaged one is an error, not a bucket
// with fewer events.
func TestUnpackedEvents(t *testing.T) {
	packed := readings(t, 300)
	pushed := readings(t, 3)
	pushedVals, _ := bsoncore.Array(pushed).Values()
	id := bson.NewObjectID()
	bucketOf := func(packedArr []byte, compress bool, events []byte) bsoncore.Document {
		idx, doc := bsoncore.AppendDocumentStart(nil)
		doc = bsoncore.AppendObjectIDElement(doc, FieldID, id)
		doc = bsoncore.AppendStringElement(doc, FieldMeta, "s1")
		doc = bsoncore.AppendInt32Element(doc, FieldCount, 303)
		if packedArr != nil {
			doc = appendPacked(doc, FieldPacked, packedArr, compress)
		}
		if events != nil {
			doc = bsoncore.AppendArrayElement(doc, FieldEvents, events)
		}
		doc = bsoncore.AppendInt32Element(doc, FieldBytes, 1)
		doc, _ = bsoncore.AppendDocumentEnd(doc, idx)
		return doc
	}
	for _, c := range []struct {
		name     string
		doc      bsoncore.Document
		compress bool
	}{
		{"raw", bucketOf(packed, false, nil), false},
		{"compressed", bucketOf(packed, true, nil), true},
		{"compressed, then pushed", bucketOf(packed, true, pushed), true},
	} {
		t.Run(c.name, func(t *testing.T) {
			want, err := EventValues(c.doc)
			if err != nil {
				t.Fatal(err)
			}
			out, ok, err := UnpackedEvents(c.doc)
			if err != nil || !ok {
				t.Fatalf("ok %v err %v", ok, err)
			}
			if _, err := out.LookupErr(FieldPacked); err == nil {
				t.Fatal("packed is still there")
			}
			got, err := EventValues(out)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(want) {
				t.Fatalf("%d events, want %d", len(got), len(want))
			}
			for i := range got {
				if !got[i].Equal(want[i]) {
					t.Fatalf("event %d differs", i)
				}
			}
			if strings.HasSuffix(c.name, "pushed") && !got[len(got)-1].Equal(pushedVals[len(pushedVals)-1]) {
				t.Fatal("the pushed events are not last")
			}
			var keys []string
			elems, _ := out.Elements()
			for _, e := range elems {
				keys = append(keys, e.Key())
			}
			if k := strings.Join(keys, ","); k != "_id,meta,count,bytes,events" {
				t.Fatalf("fields %s", k)
			}
			// Done: a second pass has nothing to do.
			if _, ok, err := UnpackedEvents(out); ok || err != nil {
				t.Fatalf("unpacked again: ok %v err %v", ok, err)
			}
		})
	}
	if _, ok, err := UnpackedEvents(bucketOf(nil, false, pushed)); ok || err != nil {
		t.Fatalf("array bucket: ok %v err %v", ok, err)
	}
	// A damaged frame: an error naming the bucket.
	idx, bad := bsoncore.AppendDocumentStart(nil)
	bad = bsoncore.AppendObjectIDElement(bad, FieldID, id)
	bad = bsoncore.AppendBinaryElement(bad, FieldPacked, SubtypeZstdArray, []byte("\x28\xb5\x2f\xfd\x00"))
	bad, _ = bsoncore.AppendDocumentEnd(bad, idx)
	if _, ok, err := UnpackedEvents(bad); ok || err == nil || !strings.Contains(err.Error(), id.Hex()) {
		t.Fatalf("damaged: ok %v err %v", ok, err)
	}
}
