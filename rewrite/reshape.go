package rewrite

import (
	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// reshapeEvent turns one unwound bucket document {_id, meta, start, ...,
// events: {<stored event>}} back into the event the app inserted: the
// stored event with the bucket's meta put back at the marker's position
// under the metaField's name. No marker: the event had no metaField.
func reshapeEvent(unwound bsoncore.Document, metaField string, metas *metaResolver) (bsoncore.Document, error) {
	ev, err := unwound.LookupErr(rules.BucketEvents)
	if err != nil {
		return nil, mongoerr.Errorf(mongoerr.InternalError, "upstream document has no %q field", rules.BucketEvents)
	}
	stored, ok := ev.DocumentOK()
	if !ok {
		return nil, mongoerr.Errorf(mongoerr.InternalError, "upstream document's %q is a %s, not an event document", rules.BucketEvents, bsonutil.TypeName(ev.Type))
	}
	return restoreMeta(stored, metaField, func() (bsoncore.Value, error) { return metas.metaOf(unwound) })
}

// restoreMeta puts the bucket's meta (metaOf, called only when needed)
// back into a stored event at its marker's position.
func restoreMeta(stored bsoncore.Document, metaField string, metaOf func() (bsoncore.Value, error)) (bsoncore.Document, error) {
	if metaField == "" {
		return stored, nil
	}
	elems, err := stored.Elements()
	if err != nil {
		return nil, mongoerr.Errorf(mongoerr.InternalError, "stored event is not valid BSON: %v", err)
	}
	hasMarker := false
	for _, e := range elems {
		if e.Key() == metaField {
			hasMarker = true
			break
		}
	}
	if !hasMarker {
		return stored, nil
	}
	meta, err := metaOf()
	if err != nil {
		return nil, err
	}
	idx, out := bsoncore.AppendDocumentStart(make([]byte, 0, len(stored)+len(meta.Data)+8))
	for _, e := range elems {
		if e.Key() == metaField {
			out = bsoncore.AppendValueElement(out, metaField, meta)
			continue
		}
		out = append(out, e...)
	}
	return bsoncore.AppendDocumentEnd(out, idx)
}
