package point

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/match"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/query"
)

// An event scan serves a find the upstream cannot run on the unwound
// events: where FerretDB's $unwind drops the bucket's meta, a sort that
// names the metaField (or a subfield of it), or a filter with the
// metaField inside $or or $nor, has no upstream form. The proxy reads
// whole buckets with one sorted find, so that their events come in runs
// it can sort one at a time:
//   - a sort led by the timeField (or none): runs are windows (buckets of
//     one start), which are disjoint in time;
//   - a sort led by metaField keys: the buckets are sorted on those keys
//     (then on start), and a run is the buckets of equal keys (and of one
//     start, when the timeField comes next);
//   - any other sort: one run, the whole result.
//
// Each run's events, with their meta restored, are filtered with the
// app's filter and sorted on the whole sort. A run is bounded as MongoDB
// bounds a blocking sort. The proxy checks the order the upstream returns
// the runs in, so a server that orders metas otherwise gets an error,
// never a wrongly ordered answer.

// maxRunBytes bounds the buckets of one run held to be sorted: MongoDB's
// limit of a blocking sort without allowDiskUse.
const maxRunBytes = 100 << 20

// sortKey is one key of a find's sort.
type sortKey struct {
	field string // as the app names it
	path  []string
	dir   int
	// bucketPath, for a key on the metaField or a subfield of it, is the
	// key's path in a bucket ("meta" or "meta.<subfield>").
	bucketPath []string
}

// eventOrder is a sort the proxy applies to events with their meta
// restored.
type eventOrder []sortKey

func (o eventOrder) compare(a, b bsoncore.Document) int {
	for _, k := range o {
		if c := bsonutil.Compare(SortValue(a, k.path), SortValue(b, k.path)); c != 0 {
			return c * k.dir
		}
	}
	return 0
}

// SortValue is a document's value at path as a sort sees it: a missing
// field sorts as null.
func SortValue(doc bsoncore.Document, path []string) bsoncore.Value {
	v, err := doc.LookupErr(path...)
	if err != nil {
		return bsoncore.Value{Type: bsoncore.TypeNull}
	}
	return v
}

// PlanEventScan returns the spec and the upstream side of an event scan
// of a find, or why the find has none: a *mongoerr.Error for a malformed
// filter (the server's code and message), another error for what the
// proxy does not evaluate.
func PlanEventScan(rc *query.Ctx, filter, sortDoc bsoncore.Document) (*PointSpec, *BucketScan, error) {
	if rc.Caps.UnwindKeepsFields {
		return nil, nil, errors.New("the upstream's $unwind keeps the meta")
	}
	s := &PointSpec{lo: math.MinInt64, hi: math.MaxInt64}
	sc := &BucketScan{dir: 1}
	if len(filter) > 0 {
		// The compiled filter outlives the command: the cursor's getMores
		// evaluate it after the request's buffer is reused.
		pred, err := compileFilter(filter)
		if err != nil {
			return nil, nil, err
		}
		s.pred = pred
		s.prune = rc.PlanPrune(filter)
		sc.prune = s.prune
		pushDown(rc, filter, s, sc)
	}
	order, why := parseOrder(rc, sortDoc)
	if why != "" {
		return nil, nil, errors.New(why)
	}
	s.Order = order
	sc.setRuns(order, rc.TimeField)
	if s.lo > s.hi || (s.lo == s.hi && (s.loStrict || s.hiStrict)) {
		sc.done = true // an empty range: nothing to read
	}
	return s, sc, nil
}

// compileFilter is filter as the proxy applies it to events. The
// compiled filter outlives the command (a cursor's getMores evaluate it
// after the request's buffer is reused), so it compiles a copy.
func compileFilter(filter bsoncore.Document) (match.DocPred, error) {
	fc := &match.Compiler{Unsupported: func(format string, args ...any) error { return fmt.Errorf(format, args...) }}
	return fc.Compile(slices.Clone(filter), 0)
}

// EventScanRead is the read of an event scan of filter and sortDoc with
// the given projection and paging, or nil when the scan cannot serve
// them: the fallback of the reads the upstream cannot run on unwound
// events.
func EventScanRead(rc *query.Ctx, filter, sortDoc bsoncore.Document, proj *query.Projection, pg query.Paging) *PointRead {
	spec, sc, _ := PlanEventScan(rc, filter, sortDoc)
	if spec == nil {
		return nil
	}
	return NewScanRead(rc, spec, sc, proj, pg.Skip, pg.Limit, pg.Single)
}

// StagedScanRead is the read of a find on a staged rule where the
// upstream's $unwind keeps the meta (FerretDB 2.x), by the proxy's own
// event scan rather than the upstream's aggregate, or nil. Measured on
// FerretDB 2.7 over DocumentDB 0.107 (tsbench range, 20 series of
// 1-minute data over 3 days): a whole day of every series 466 ms by the
// aggregate ($match, $unwind, $match, $sort), 187 ms by the scan, whose
// find uses the {meta, start} index and whose events the proxy unpacks;
// the plain collection's 265 ms. Only for an unsorted find or one
// sorted by time (with the metaField first or not), whose buckets are
// read in runs of a window: a sort on measurements would hold every
// bucket (up to 100 MB) where the upstream's aggregate sorts its own
// way. Not on MongoDB's default direct rules (not staged), whose
// aggregate is MongoDB's own.
func StagedScanRead(rc *query.Ctx, filter, sortDoc bsoncore.Document, proj *query.Projection, pg query.Paging) *PointRead {
	if !rc.Caps.UnwindKeepsFields || rc.Rule.Partitioned() || !rc.Rule.Staged(rc.Caps.StagesEvents()) {
		return nil
	}
	scanRC := *rc
	scanRC.Caps.UnwindKeepsFields = false
	spec, sc, _ := PlanEventScan(&scanRC, filter, sortDoc)
	if spec == nil || sc.oneRun {
		return nil
	}
	return NewScanRead(&scanRC, spec, sc, proj, pg.Skip, pg.Limit, pg.Single)
}

// pushDown narrows the upstream find by the filter's top-level conditions
// that name buckets exactly: time bounds (on start) and an equality or
// $in on the metaField. The proxy applies the whole filter all the same.
func pushDown(rc *query.Ctx, filter bsoncore.Document, s *PointSpec, sc *BucketScan) {
	conj, err := rc.Conjuncts(filter, 0, nil)
	if err != nil {
		return
	}
	bounds := PointSpec{}
	var hasLo, hasHi, timeOK = false, false, true
	for _, e := range conj {
		switch e.Key() {
		case rc.TimeField:
			if why := bounds.addTimeBounds(e.Value(), &hasLo, &hasHi); why != "" {
				timeOK = false
			}
		case rc.MetaField:
			if metas, why := pointMetas(e.Value()); why == "" && sc.MetaIn == nil {
				sc.MetaIn = metas
			}
		}
	}
	if !timeOK {
		return
	}
	if hasLo {
		s.lo, s.loStrict = bounds.lo, bounds.loStrict
		if f, ok := rc.Floor(bounds.lo); ok {
			sc.startLo, sc.hasStartLo = f, true
		}
	}
	if hasHi {
		s.hi, s.hiStrict = bounds.hi, bounds.hiStrict
		sc.startHi, sc.hasStartHi, sc.startHiStrict = bounds.hi, true, bounds.hiStrict
	}
}

// parseOrder reads a find's sort for the proxy to apply.
func parseOrder(rc *query.Ctx, sortDoc bsoncore.Document) (eventOrder, string) {
	if len(sortDoc) == 0 {
		return nil, ""
	}
	elems, err := sortDoc.Elements()
	if err != nil {
		return nil, "sort is not valid BSON"
	}
	order := make(eventOrder, 0, len(elems))
	for _, e := range elems {
		f, ok := e.Value().AsFloat64OK()
		if !ok || (f != 1 && f != -1) {
			return nil, fmt.Sprintf("sort on %q by %s", e.Key(), e.Value().String())
		}
		key := e.Key()
		if key == "" || strings.HasPrefix(key, "$") {
			return nil, fmt.Sprintf("sort key %q", key)
		}
		k := sortKey{field: key, path: strings.Split(key, "."), dir: int(f)}
		if rc.MetaField != "" && (key == rc.MetaField || strings.HasPrefix(key, rc.MetaField+".")) {
			k.bucketPath = strings.Split(bucket.FieldMeta+strings.TrimPrefix(key, rc.MetaField), ".")
		}
		order = append(order, k)
	}
	return order, ""
}

// setRuns picks how the buckets are sorted upstream and cut into runs.
func (sc *BucketScan) setRuns(order eventOrder, timeField string) {
	m := 0
	for m < len(order) && order[m].bucketPath != nil {
		m++
	}
	sc.metaKeys = order[:m]
	switch {
	case m == 0 && (len(order) == 0 || order[0].field == timeField):
		sc.byStart = true
		if len(order) > 0 {
			sc.dir = order[0].dir
		}
	case m == 0:
		sc.oneRun = true
	case m < len(order) && order[m].field == timeField:
		sc.byStart, sc.dir = true, order[m].dir
	}
}

// runKey is where a bucket belongs in the scan's order.
type runKey struct {
	metas []bsoncore.Value
	start int64
}

// runKeyOf reads a bucket's run key.
func (sc *BucketScan) runKeyOf(b bsoncore.Document, ns string) (runKey, error) {
	start, ok := b.Lookup(bucket.FieldStart).DateTimeOK()
	if !ok {
		return runKey{}, mongoerr.Errorf(mongoerr.InternalError, "tsproxy rule %s: bucket %s has no date start", ns, b.Lookup(bucket.FieldID).String())
	}
	k := runKey{start: start}
	for _, mk := range sc.metaKeys {
		if match.ArrayOnPath(b, mk.bucketPath) {
			return runKey{}, mongoerr.Errorf(mongoerr.NotImplemented, "tsproxy rule %s: sort on %q: a series holds an array there, which MongoDB sorts element-wise; the proxy does not", ns, mk.field)
		}
		k.metas = append(k.metas, SortValue(b, mk.bucketPath))
	}
	return k, nil
}

// step compares a bucket's run key with the current run's: 0 the same
// run, 1 a later one, -1 out of the scan's order.
func (sc *BucketScan) step(k runKey) int {
	for i, mk := range sc.metaKeys {
		if c := bsonutil.Compare(k.metas[i], sc.run.metas[i]) * mk.dir; c != 0 {
			return min(max(c, -1), 1)
		}
	}
	switch {
	case !sc.byStart || k.start == sc.run.start:
		return 0
	case (k.start > sc.run.start) == (sc.dir > 0):
		return 1
	}
	return -1
}

// upstreamSort is the sort of the scan's find.
func (sc *BucketScan) upstreamSort() bsoncore.Document {
	b := bsoncore.NewDocumentBuilder()
	for _, mk := range sc.metaKeys {
		b.AppendInt32(strings.Join(mk.bucketPath, "."), int32(mk.dir))
	}
	return b.AppendInt32(bucket.FieldStart, int32(sc.dir)).Build()
}

// eventsOfBuckets are the events of buckets that the spec's bounds and
// filter select, with their meta restored, sorted on the spec's order.
func (p *PointRead) eventsOfBuckets(buckets []bsoncore.Document) ([]bsoncore.Document, error) {
	evs, err := p.eventsInRange(buckets)
	if err != nil {
		return nil, err
	}
	if len(p.Spec.Order) == 0 && p.Spec.sortDir != 0 {
		slices.SortStableFunc(evs, p.compare) // a point read's sort on time
	}
	var docs []bsoncore.Document
	for _, e := range evs {
		doc, err := bucket.RestoreMeta(e.ev, p.metaField, func() (bsoncore.Value, error) { return e.meta, nil })
		if err != nil {
			return nil, err
		}
		if err := p.checkArrays(doc); err != nil {
			return nil, err
		}
		if p.Spec.pred == nil || p.Spec.pred(doc) {
			docs = append(docs, doc)
		}
	}
	if len(p.Spec.Order) > 0 {
		slices.SortStableFunc(docs, p.Spec.Order.compare)
	}
	return docs, nil
}

// checkArrays refuses an event whose sorted fields hold an array (see
// match.ArrayOnPath); the filter matches arrays element-wise as MongoDB
// does.
func (p *PointRead) checkArrays(doc bsoncore.Document) error {
	for _, k := range p.Spec.Order {
		if match.ArrayOnPath(doc, k.path) {
			return mongoerr.Errorf(mongoerr.NotImplemented, "tsproxy rule %s: the sort names %q, which holds an array in a stored event: MongoDB sorts arrays by their least or greatest element, and the proxy, which sorts this find itself, does not", p.ns, k.field)
		}
	}
	return nil
}

// bucketEvents are a bucket's stored events (bucket.EventValues).
func bucketEvents(b bsoncore.Document, ns string) ([]bsoncore.Value, error) {
	vals, err := bucket.EventValues(b)
	if err != nil {
		return nil, mongoerr.Errorf(mongoerr.InternalError, "tsproxy rule %s: bucket %s: %v", ns, b.Lookup(bucket.FieldID).String(), err)
	}
	return vals, nil
}

// runTooLarge is the error of a run past maxRunBytes.
func runTooLarge(ns string, sc *BucketScan) error {
	what := "the whole result (the sort is led by neither the timeField nor the metaField)"
	switch {
	case len(sc.metaKeys) > 0 && sc.byStart:
		what = "the buckets of one series and window"
	case len(sc.metaKeys) > 0:
		what = "the buckets of one series"
	case sc.byStart:
		what = "the buckets of one window"
	}
	return mongoerr.Errorf(mongoerr.QueryExceededMemoryLimit, "tsproxy rule %s: sort exceeded memory limit of %d bytes: the proxy sorts %s at once; narrow the filter, or sort on the timeField first", ns, maxRunBytes, what)
}

// filterExplain says how a scan filters events.
func (s *PointSpec) filterExplain() string {
	if s.pred != nil {
		return "the find's filter, applied by the proxy to each event with its meta"
	}
	return "time range, applied by the proxy"
}

// OrderExplain says how a scan orders events.
func (sc *BucketScan) OrderExplain() string {
	switch {
	case sc.oneRun:
		return "all matching events, sorted by the proxy"
	case len(sc.metaKeys) > 0 && sc.byStart:
		return "buckets by meta keys then start, each series' window sorted by the proxy"
	case len(sc.metaKeys) > 0:
		return "buckets by meta keys, each series' events sorted by the proxy"
	}
	return "buckets by start, each window's events sorted by the proxy"
}

// BucketPushDown is the filter of the buckets that may hold events
// matching filter, built only of what selects buckets exactly on every
// upstream (pushDown: bounds on start, an equality or $in of byte-equal
// values on the metaField; {} for none), and whether it selects exactly
// the matching events (whole: filter is one such metaField condition,
// or empty). FerretDB evaluates other operators on the bucket's meta
// unlike MongoDB (regexes, $ne, $all and $elemMatch through arrays, $type
// lists, null through arrays): a delete that let it choose the buckets
// deleted events MongoDB keeps, and kept others.
func BucketPushDown(rc *query.Ctx, filter bsoncore.Document) (bsoncore.Document, bool) {
	var s PointSpec
	sc := &BucketScan{dir: 1}
	pushDown(rc, filter, &s, sc)
	conj, err := rc.Conjuncts(filter, 0, nil)
	whole := err == nil && len(conj) <= 1
	for _, e := range conj {
		if _, why := pointMetas(e.Value()); e.Key() != rc.MetaField || rc.MetaField == "" || why != "" {
			whole = false
		}
	}
	return sc.scanFilter(rc.Span), whole
}
