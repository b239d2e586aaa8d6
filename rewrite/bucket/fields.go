package bucket

import "go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

// Field names of the stored bucket document (see DESIGN.md). Changing any of
// them changes the stored format and needs a migration.
const (
	FieldID     = "_id"
	FieldMeta   = "meta"
	FieldStart  = "start"
	FieldCount  = "count"
	FieldBytes  = "bytes" // summed BSON size of the stored events; bounds bucket growth (maxBytes)
	FieldMin    = "min"
	FieldMax    = "max"
	FieldSum    = "sum"
	FieldEvents = "events"
	// FieldPacked holds the events of a staged document (StagedGroups), and of
	// a bucket written whole on an upstream with packed events
	// (caps.Upstream.PackedEvents): the BSON of their array, as binary
	// data. A bucket may have both fields (EventValues).
	FieldPacked = "packed"
	// FieldMore holds the groups of a staged document other than the one
	// at its top (StagedKeyed), or all of them (StagedPacked): the BSON of
	// an array of {meta, start, events}, as binary data.
	FieldMore = "more"
	// FieldStagedAt is a staged document's arrival stamp
	// (StagedOptions.At).
	FieldStagedAt = "at"
	// FieldMovedLate marks a staged document that a merge moved back to
	// staging: it reached a retired collection after the merge read it.
	// The merge that stores its events records its _id, as a retryable
	// write's, so that a copy of the move landing later (a holder whose
	// lease lapsed while its insert was on its way) is merged once
	// (rewrite/stage). Every version of the proxy reads past it.
	FieldMovedLate = "late"
)

// IndexName is the proxy's own index {meta: 1, start: 1} on every
// collection of buckets (and rollups): reads select buckets by series and
// window with it, on an upstream that reads by such an index (not
// FerretDB: caps.UnusedIndexes).
const IndexName = "meta_1_start_1"

// IndexCommand creates that index on db.coll (and so the collection).
func IndexCommand(db, coll string) []byte {
	key := bsoncore.NewDocumentBuilder().AppendInt32(FieldMeta, 1).AppendInt32(FieldStart, 1).Build()
	spec := bsoncore.NewDocumentBuilder().AppendDocument("key", key).AppendString("name", IndexName).Build()
	return bsoncore.NewDocumentBuilder().AppendString("createIndexes", coll).
		AppendArray("indexes", bsoncore.NewArrayBuilder().AppendDocument(spec).Build()).
		AppendString("$db", db).Build()
}

// CreateCommand creates collection db.coll (NamespaceExists when it is
// there): a bucket collection where the proxy makes no index on it
// (caps.UnusedIndexes), a staging collection, a marker.
func CreateCommand(db, coll string) []byte {
	return bsoncore.NewDocumentBuilder().AppendString("create", coll).AppendString("$db", db).Build()
}
