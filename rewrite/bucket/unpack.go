package bucket

import (
	"fmt"
	"strconv"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// UnpackedEvents is bdoc with its packed events (FieldPacked) moved into
// the events array, after those it held: the form MongoDB unwinds. ok is
// false when bdoc has no packed events (nothing to change). The other
// fields stay as they are, in their order; events goes last. For
// tsproxy unpack: buckets a proxy on FerretDB wrote, moved to MongoDB.
func UnpackedEvents(bdoc bsoncore.Document) (out bsoncore.Document, ok bool, err error) {
	if _, _, has := bdoc.Lookup(FieldPacked).BinaryOK(); !has {
		return nil, false, nil
	}
	vals, err := EventValues(bdoc)
	if err != nil {
		return nil, false, fmt.Errorf("unpack bucket %s: %w", bdoc.Lookup(FieldID).String(), err)
	}
	elems, err := bdoc.Elements()
	if err != nil {
		return nil, false, fmt.Errorf("unpack bucket: %w", err)
	}
	di, d := bsoncore.AppendDocumentStart(make([]byte, 0, len(bdoc)+len(vals)*8))
	for _, e := range elems {
		if k := e.Key(); k != FieldPacked && k != FieldEvents {
			d = append(d, e...)
		}
	}
	ai, d := bsoncore.AppendArrayElementStart(d, FieldEvents)
	for i, v := range vals {
		d = bsoncore.AppendValueElement(d, strconv.Itoa(i), v)
	}
	d, _ = bsoncore.AppendArrayEnd(d, ai)
	d, _ = bsoncore.AppendDocumentEnd(d, di)
	if len(d) > MaxUnpackedDocBytes {
		return nil, false, fmt.Errorf("unpack bucket %s: %d bytes unpacked, more than a document may hold (%d)", bdoc.Lookup(FieldID).String(), len(d), MaxUnpackedDocBytes)
	}
	return d, true, nil
}

// MaxUnpackedDocBytes is the most a document may hold on MongoDB (16 MiB).
const MaxUnpackedDocBytes = 16 << 20
