package read

import (
	"math"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/cursor"
	"github.com/tsproxy/tsproxy/rewrite/query"
	"github.com/tsproxy/tsproxy/rewrite/read/point"
	"github.com/tsproxy/tsproxy/rules"
)

// A find of one series (or a few) that bounds time on one side or not at
// all, the latest reading of a sensor above all ({sensorId: X} sorted by
// time descending, limit 1), is one the point lookups serve once the
// time is bounded by the windows the series has: the event-id index's
// series entries say so (bucket.SeriesUpdates). The proxy looks up the
// index's marker and the series' entries by _id, then plans the find
// with the filter also bounded to [first window, end of last window):
// the point read looks the windows up newest first (or oldest) and
// stops at the limit, so its cost is that of the windows it reads,
// whatever the rule holds. Without the marker's word (an index that
// does not cover every bucket) the find is planned as it was.
//
// Only where a lookup by _id is an index lookup (the embedded upstream
// indexes _id itself; MongoDB, FerretDB 2.x) and the rule is staged: on
// FerretDB v1.24 the series filter is otherwise a scan of every bucket;
// on FerretDB 2.x an aggregate that unwinds every bucket of the series
// before its sort and limit ({meta, start} index or not).

// seriesToBound is the metas a find on rule fixes when it is a series
// read to bound (point.SeriesToBound), or nil.
func seriesToBound(body []byte, rule *rules.Rule, opts Options) (*query.Ctx, []bsoncore.Value) {
	// Merges write the series entries: only a staged rule has them. Where
	// buckets are not packed (MongoDB, FerretDB 2.x) the point lookups
	// are dropped for a read the server must guarantee (plan), and the
	// entries would be read outside its session.
	if opts.IDLookups != IDLookupIndexed || !rule.Staged(opts.Caps.StagesEvents()) || rule.MetaField == "" ||
		(!opts.Caps.PackedEvents && serverGuarantees(body)) {
		return nil, nil
	}
	doc := bsoncore.Document(body)
	if elems, _ := doc.Elements(); len(elems) == 0 || elems[0].Key() != "find" {
		return nil, nil
	}
	rc, err := query.NewCtx(rule)
	if err != nil {
		return nil, nil
	}
	rc.Caps = opts.Caps
	filter, err := rc.ReadDoc(doc, "filter", "find")
	if err != nil {
		return nil, nil
	}
	sortDoc, err := rc.ReadDoc(doc, "sort", "find")
	if err != nil {
		return nil, nil
	}
	return rc, point.SeriesToBound(rc, filter, sortDoc)
}

// seriesBounded is the plan of a series read to bound: the marker and
// series entries looked up (one pipelined step), then the find with its
// filter bounded, or as it was when the index cannot say.
func seriesBounded(body []byte, rule *rules.Rule, opts Options, newID func() int64, rc *query.Ctx, metas []bsoncore.Value) rewrite.Plan {
	coll := rule.IDIndexCollection()
	lookups := [][]byte{bucket.IDIndexMarkerFind(coll, rule.DB)}
	for _, m := range metas {
		lookups = append(lookups, bucket.IDIndexFind(coll, rule.DB, bucket.SeriesEntryID(bucket.KeyOf(m, 0).Meta)))
	}
	return rewrite.Script(func(x *rewrite.Exec) (rewrite.Result, error) {
		replies, ok := x.Do(rewrite.StepOf(lookups))
		if !ok {
			return rewrite.Result{}, rewrite.ErrAborted
		}
		bounded := body
		if lo, hi, ok := seriesWindows(replies, rule.SpanMillis()); ok {
			bounded = withTimeBounds(body, rc.TimeField, lo, hi)
		}
		res, ok := x.Run(plan(bounded, rule, opts, newID))
		if !ok {
			return rewrite.Result{}, rewrite.ErrAborted
		}
		return res, nil
	})
}

// seriesWindows reads the replies to the marker's and the series
// entries' lookups: the time range [lo, hi) that holds every event of
// the series, or ok false when the index does not say (no marker, or
// one that does not vouch for the series entries, or a failed lookup).
// A series without an entry has no event: none at all is the empty
// range.
func seriesWindows(replies [][]byte, span int64) (lo, hi int64, ok bool) {
	marker, err := cursor.First(replies[0])
	if err != nil || marker == nil || !bucket.SeriesComplete(marker) {
		return 0, 0, false
	}
	lo, hi = math.MaxInt64, math.MinInt64
	for _, r := range replies[1:] {
		entry, err := cursor.First(r)
		if err != nil {
			return 0, 0, false
		}
		if entry == nil {
			continue // no event of this series
		}
		first, last, ok := bucket.SeriesBoundsOf(entry)
		if !ok || last > math.MaxInt64-span {
			return 0, 0, false
		}
		lo, hi = min(lo, first), max(hi, last+span)
	}
	if lo > hi {
		return 0, 0, true // no series has an event: an empty range
	}
	return lo, hi, true
}

// withTimeBounds is the find body with its filter ANDed with timeField
// in [lo, hi).
func withTimeBounds(body []byte, timeField string, lo, hi int64) []byte {
	nb := bsoncore.NewDocumentBuilder
	doc := bsoncore.Document(body)
	filter, _ := doc.Lookup("filter").DocumentOK()
	bounds := nb().AppendDocument(timeField, nb().AppendDateTime("$gte", lo).AppendDateTime("$lt", hi).Build()).Build()
	and := bsoncore.NewArrayBuilder().AppendDocument(filter).AppendDocument(bounds).Build()
	return bsonutil.ReplaceField(doc, "filter", func(dst []byte) []byte {
		return bsoncore.AppendDocumentElement(dst, "filter", nb().AppendArray("$and", and).Build())
	})
}
