package bucket

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// The series entries of the event-id index bound each series' windows, so
// that a read of one series without both time bounds (its latest events,
// its first) looks up the buckets of its windows by _id, newest or oldest
// first, instead of reading every bucket of the rule: on FerretDB v1.24
// a find pushes down nothing but {_id: X}, so a filter on the series
// decodes every bucket.
//
// One entry per series, {_id: "series:<hash of the stored meta>", first:
// window start, last: window start}, widened ($min/$max, upserted) by
// the merge before it writes the series' buckets, so first is at or
// before and last at or after every window that holds an event of the
// series: a delete or the sweeper leaves the bounds wider than the
// buckets, which costs lookups that find nothing, never an event missed.
//
// The entries answer only where the index's marker says so
// (SeriesComplete): a marker written by a merge that writes them, on an
// empty bucket collection. Every write that leaves the index (the direct
// write path, an update that moves events) deletes the marker first.

const (
	seriesPrefix = "series:"
	seriesFirst  = "first"
	seriesLast   = "last"
	// markerSeries, true in the marker: the index's series entries bound
	// every series of the collection.
	markerSeries = "series"
)

// SeriesEntryID is the _id of the series entry of meta, a Key's Meta
// (the stored meta's type byte and bytes).
func SeriesEntryID(meta []byte) string {
	if len(meta) == 0 {
		meta = []byte{byte(bsoncore.TypeNull)}
	}
	sum := sha256.Sum256(meta)
	return seriesPrefix + hex.EncodeToString(sum[:16])
}

// SeriesUpdates are the update statements (upserts) that widen the series
// entries of keys' series to cover their windows, one statement a series,
// in the order the series first appear in keys.
func SeriesUpdates(keys []Key) []bsoncore.Document {
	type bounds struct{ first, last int64 }
	var order []string
	by := map[string]*bounds{}
	for _, k := range keys {
		id := SeriesEntryID(k.Meta)
		b := by[id]
		if b == nil {
			by[id] = &bounds{k.Start, k.Start}
			order = append(order, id)
			continue
		}
		b.first, b.last = min(b.first, k.Start), max(b.last, k.Start)
	}
	nb := bsoncore.NewDocumentBuilder
	out := make([]bsoncore.Document, 0, len(order))
	for _, id := range order {
		b := by[id]
		out = append(out, nb().
			AppendDocument("q", nb().AppendString("_id", id).Build()).
			AppendDocument("u", nb().
				AppendDocument("$min", nb().AppendDateTime(seriesFirst, b.first).Build()).
				AppendDocument("$max", nb().AppendDateTime(seriesLast, b.last).Build()).
				Build()).
			AppendBoolean("upsert", true).
			Build())
	}
	return out
}

// IsSeriesEntry says whether doc, a document of the event-id index, is
// a series entry.
func IsSeriesEntry(doc bsoncore.Document) bool {
	id, _ := doc.Lookup("_id").StringValueOK()
	return strings.HasPrefix(id, seriesPrefix)
}

// SeriesBoundsOf reads a series entry: its first and last window starts.
func SeriesBoundsOf(doc bsoncore.Document) (first, last int64, ok bool) {
	f, okf := doc.Lookup(seriesFirst).DateTimeOK()
	l, okl := doc.Lookup(seriesLast).DateTimeOK()
	return f, l, okf && okl && f <= l
}

// SeriesComplete says whether marker document doc says the series entries
// bound every series.
func SeriesComplete(doc bsoncore.Document) bool {
	s, _ := doc.Lookup(markerSeries).BooleanOK()
	return s && IsIDIndexMarker(doc)
}
