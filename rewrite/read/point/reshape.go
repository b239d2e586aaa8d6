package point

import (
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// ReshapeEvent turns one unwound bucket document {_id, meta, start, ...,
// events: {<stored event>}} back into the event the app inserted: the
// stored event with the bucket's meta put back at the marker's position
// under the metaField's name. No marker: the event had no metaField.
func ReshapeEvent(unwound bsoncore.Document, metaField string, metas *MetaResolver) (bsoncore.Document, error) {
	ev, err := unwound.LookupErr(bucket.FieldEvents)
	if err != nil {
		return nil, mongoerr.Errorf(mongoerr.InternalError, "upstream document has no %q field", bucket.FieldEvents)
	}
	stored, ok := ev.DocumentOK()
	if !ok {
		return nil, mongoerr.Errorf(mongoerr.InternalError, "upstream document's %q is a %s, not an event document", bucket.FieldEvents, bsonutil.TypeName(ev.Type))
	}
	return bucket.RestoreMeta(stored, metaField, func() (bsoncore.Value, error) { return metas.metaOf(unwound) })
}
