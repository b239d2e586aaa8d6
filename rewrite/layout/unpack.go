package layout

import (
	"fmt"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rules"
)

// UnpackedCounter is a counter bucket with its packed slots (a binary
// field, written on FerretDB) turned back into the document
// {"<slot>": n} that MongoDB's $inc counts into; ok is false when its
// slots are not packed. For tsproxy unpack: counters moved to MongoDB.
// (A slots bucket needs no such step: its next write rewrites it whole,
// in the form of the upstream, and reads take both forms.)
func UnpackedCounter(doc bsoncore.Document) (out bsoncore.Document, ok bool, err error) {
	inner, packed, err := packedMap(doc, rules.BucketSlots)
	if !packed {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("unpack counter bucket %s: %w", doc.Lookup("_id").String(), err)
	}
	elems, err := doc.Elements()
	if err != nil {
		return nil, false, fmt.Errorf("unpack counter bucket: %w", err)
	}
	di, d := bsoncore.AppendDocumentStart(make([]byte, 0, len(doc)+len(inner)))
	for _, e := range elems {
		if e.Key() == rules.BucketSlots {
			d = bsoncore.AppendDocumentElement(d, rules.BucketSlots, inner)
			continue
		}
		d = append(d, e...)
	}
	d, _ = bsoncore.AppendDocumentEnd(d, di)
	return d, true, nil
}
