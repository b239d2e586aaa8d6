package bucket

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
)
