package point

import (
	"fmt"
	"math"
	"strings"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/match"
	"github.com/tsproxy/tsproxy/rewrite/query"
	"github.com/tsproxy/tsproxy/rules"
)

// PointSpec is what a point read needs from the find: the keys it names,
// the time bounds of the events and the order.
type PointSpec struct {
	Metas              []bsoncore.Value
	Windows            []int64 // window starts, in output order
	lo, hi             int64   // event time bounds (ms)
	loStrict, hiStrict bool
	sortDir            int // 0: no sort; 1 or -1 on the timeField
	idDir              int // 0, or a tie-break on _id

	// An event scan's: the app's filter, the field paths
	// it names, and the sort, applied by the proxy to events with their
	// meta restored.
	pred  match.DocPred
	Order eventOrder
	// prune skips the buckets whose summaries say they hold no match
	// (query.Prune), before their events are unpacked.
	prune *query.Prune
}

// Keys is the number of (meta, window) keys.
func (s *PointSpec) Keys() int { return len(s.Metas) * len(s.Windows) }

// inRange reports whether an event time is inside the bounds.
func (s *PointSpec) inRange(ms int64) bool {
	if ms < s.lo || (s.loStrict && ms == s.lo) {
		return false
	}
	return ms < s.hi || (!s.hiStrict && ms == s.hi)
}

// PlanPoint returns the point spec of a find, or why it has none (then the
// aggregate path serves it).
func PlanPoint(rc *query.Ctx, filter, sortDoc bsoncore.Document) (*PointSpec, string) {
	s, hasLo, hasHi, why := parsePoint(rc, filter)
	switch {
	case why != "":
		return nil, why
	case !hasLo || !hasHi:
		return nil, "the time range is not bounded on both sides"
	}
	if why := s.setSort(sortDoc, rc.TimeField); why != "" {
		return nil, why
	}
	if len(s.Metas) > maxPointMetas {
		return nil, fmt.Sprintf("more than %d metas", maxPointMetas)
	}
	if why := s.setWindows(rc.Span, len(s.Metas)); why != "" {
		return nil, why
	}
	return s, ""
}

// SeriesToBound says whether a find of filter and sortDoc is one
// PlanPoint would serve but for a time bound it lacks (the latest events
// of a series: {meta: X} sorted by time): the metas it fixes, in their
// stored form, or nil. Bounded by the windows of those series, it is
// (see rewrite/read's seriesBounded).
func SeriesToBound(rc *query.Ctx, filter, sortDoc bsoncore.Document) []bsoncore.Value {
	s, hasLo, hasHi, why := parsePoint(rc, filter)
	// Not with conditions on measurements (s.pred): the latest matching
	// event may be in any window, so bounding the read saves nothing.
	if why != "" || s.pred != nil || (hasLo && hasHi) || s.setSort(sortDoc, rc.TimeField) != "" || len(s.Metas) > maxPointMetas {
		return nil
	}
	return s.Metas
}

// parsePoint reads a filter of the metaField's values and the
// timeField's bounds, or says why it is not one.
func parsePoint(rc *query.Ctx, filter bsoncore.Document) (s *PointSpec, hasLo, hasHi bool, why string) {
	if rc.MetaField == "" {
		return nil, false, false, "the rule has no metaField"
	}
	if len(filter) == 0 {
		return nil, false, false, "no filter"
	}
	conj, err := rc.Conjuncts(filter, 0, nil)
	if err != nil {
		return nil, false, false, err.Error()
	}
	s = &PointSpec{}
	hasMeta, others := false, false
	for _, e := range conj {
		switch e.Key() {
		case rc.MetaField:
			if hasMeta {
				return nil, false, false, "more than one condition on the metaField"
			}
			metas, why := pointMetas(e.Value())
			if why != "" {
				return nil, false, false, why
			}
			s.Metas, hasMeta = metas, true
		case rc.TimeField:
			if why := s.addTimeBounds(e.Value(), &hasLo, &hasHi); why != "" {
				return nil, false, false, why
			}
		default:
			others = true
		}
	}
	if !hasMeta {
		return nil, false, false, "the metaField is not fixed"
	}
	if others {
		// Conditions on measurements: the proxy applies the whole filter
		// to the events of the buckets it looks up, and skips the buckets
		// whose summaries rule them out.
		pred, err := compileFilter(filter)
		if err != nil {
			return nil, false, false, err.Error()
		}
		s.pred, s.prune = pred, rc.PlanPrune(filter)
	}
	return s, hasLo, hasHi, ""
}

// equalityValues reads a condition on a field (what names it) that is an
// equality, one $eq or one $in: the values it names, or why it is none of
// those.
func equalityValues(v bsoncore.Value, what string) ([]bsoncore.Value, string) {
	ops, ok := match.IsOperatorDoc(v)
	if !ok {
		return []bsoncore.Value{v}, ""
	}
	elems, _ := ops.Elements()
	if len(elems) != 1 {
		return nil, what + " operators other than one $eq or $in"
	}
	switch elems[0].Key() {
	case "$eq":
		return []bsoncore.Value{elems[0].Value()}, ""
	case "$in":
		arr, ok := elems[0].Value().ArrayOK()
		if !ok {
			return nil, "$in on the " + what + " is not an array"
		}
		vals, _ := arr.Values()
		return vals, ""
	}
	return nil, fmt.Sprintf("%s operator %s", what, elems[0].Key())
}

// pointMetas reads an equality or $in on the metaField: the metas it
// matches exactly, or why they cannot be named.
func pointMetas(v bsoncore.Value) ([]bsoncore.Value, string) {
	vals, why := equalityValues(v, "metaField")
	if why != "" {
		return nil, why
	}
	var out []bsoncore.Value
	seen := map[string]bool{}
	for _, m := range vals {
		if !byteEqualValue(m, 0) {
			return nil, fmt.Sprintf("a metaField value of type %s (equal values of other encodings exist)", bsonutil.TypeName(m.Type))
		}
		k := idKey(m)
		if seen[k] {
			continue
		}
		seen[k] = true
		// In the stored form (escaped names), as bucket ids and the
		// buckets' meta are.
		out = append(out, bucket.EscapeMeta(bsoncore.Value{Type: m.Type, Data: append([]byte(nil), m.Data...)}))
	}
	return out, ""
}

// byteEqualValue reports whether every value MongoDB's equality matches to
// v has v's exact bytes, so that the bucket id hashed from v is the only
// one. Numbers are not (1, 1L and 1.0 are equal), nor regexes (they match
// strings), nor a top-level array (it would match array metas, which the
// insert path refuses anyway); strings compare bytewise (no collation).
func byteEqualValue(v bsoncore.Value, depth int) bool {
	if depth > bsonutil.MaxDepth {
		return false
	}
	switch v.Type {
	case bsoncore.TypeString, bsoncore.TypeObjectID, bsoncore.TypeBoolean, bsoncore.TypeNull, bsoncore.TypeDateTime:
		return true
	case bsoncore.TypeEmbeddedDocument, bsoncore.TypeArray:
		if v.Type == bsoncore.TypeArray && depth == 0 {
			return false
		}
		d := bsoncore.Document(v.Data)
		elems, err := d.Elements()
		if err != nil {
			return false
		}
		if depth == 0 && len(elems) > 0 && strings.HasPrefix(elems[0].Key(), "$") {
			return false
		}
		for _, e := range elems {
			if !byteEqualValue(e.Value(), depth+1) {
				return false
			}
		}
		return true
	}
	return false
}

// addTimeBounds reads one predicate on the timeField.
func (s *PointSpec) addTimeBounds(v bsoncore.Value, hasLo, hasHi *bool) string {
	if ms, ok := v.DateTimeOK(); ok {
		s.lower(ms, false, hasLo)
		s.upper(ms, false, hasHi)
		return ""
	}
	ops, ok := match.IsOperatorDoc(v)
	if !ok {
		return fmt.Sprintf("timeField equality to a %s", bsonutil.TypeName(v.Type))
	}
	elems, _ := ops.Elements()
	for _, e := range elems {
		ms, ok := e.Value().DateTimeOK()
		if !ok {
			return fmt.Sprintf("timeField %s with a %s", e.Key(), bsonutil.TypeName(e.Value().Type))
		}
		switch e.Key() {
		case "$eq":
			s.lower(ms, false, hasLo)
			s.upper(ms, false, hasHi)
		case "$gt", "$gte":
			s.lower(ms, e.Key() == "$gt", hasLo)
		case "$lt", "$lte":
			s.upper(ms, e.Key() == "$lt", hasHi)
		default:
			return fmt.Sprintf("timeField operator %s", e.Key())
		}
	}
	return ""
}

func (s *PointSpec) lower(ms int64, strict bool, has *bool) {
	if !*has || ms > s.lo || (ms == s.lo && strict) {
		s.lo, s.loStrict = ms, strict
	}
	*has = true
}

func (s *PointSpec) upper(ms int64, strict bool, has *bool) {
	if !*has || ms < s.hi || (ms == s.hi && strict) {
		s.hi, s.hiStrict = ms, strict
	}
	*has = true
}

// setSort accepts no sort, {time: ±1} or {time: ±1, _id: ±1}.
func (s *PointSpec) setSort(sortDoc bsoncore.Document, timeField string) string {
	if len(sortDoc) == 0 {
		return ""
	}
	elems, err := sortDoc.Elements()
	if err != nil {
		return "sort is not valid BSON"
	}
	dirs := make([]int, len(elems))
	for i, e := range elems {
		f, ok := e.Value().AsFloat64OK()
		if !ok || (f != 1 && f != -1) {
			return fmt.Sprintf("sort on %q by %s", e.Key(), e.Value().String())
		}
		dirs[i] = int(f)
	}
	switch {
	case len(elems) == 0:
	case elems[0].Key() != timeField:
		return fmt.Sprintf("a sort on %q", elems[0].Key())
	case len(elems) > 2 || (len(elems) == 2 && elems[1].Key() != "_id"):
		return "a sort on more than the timeField and _id"
	default:
		s.sortDir = dirs[0]
		if len(elems) == 2 {
			s.idDir = dirs[1]
		}
	}
	return ""
}

// setWindows lists the window starts the bounds cover, in output order.
func (s *PointSpec) setWindows(span int64, metas int) string {
	if s.lo > s.hi || (s.lo == s.hi && (s.loStrict || s.hiStrict)) {
		return "" // an empty range: no keys
	}
	// The first window of the dates starts at or after the smallest date
	// (an insert refuses a date whose window would start before it): a
	// lower bound before it floored to a window far in the future, and
	// the plan read nothing. Windows are counted, not stepped through:
	// the step after the last window of the dates wrapped, and never
	// ended.
	first := rules.FloorMillis(max(s.lo, math.MinInt64+span-1), span)
	last := rules.FloorMillis(s.hi, span)
	if s.hiStrict && last == s.hi {
		last -= span
	}
	if first > last {
		return ""
	}
	// Unsigned: from near the smallest date to near the largest, the
	// signed difference wraps.
	n := uint64(last-first)/uint64(span) + 1
	if n > uint64(maxPointKeys/max(metas, 1)) {
		return fmt.Sprintf("more than %d (meta, window) keys", maxPointKeys)
	}
	s.Windows = make([]int64, 0, n)
	for i := range int64(n) {
		s.Windows = append(s.Windows, first+i*span)
	}
	if s.sortDir < 0 {
		for i, j := 0, len(s.Windows)-1; i < j; i, j = i+1, j-1 {
			s.Windows[i], s.Windows[j] = s.Windows[j], s.Windows[i]
		}
	}
	return ""
}

// Limits of a point plan: beyond them the aggregate path is used.
const (
	// maxPointMetas bounds the metas of one plan: a window's buckets of
	// every meta are held together to sort them, so this bounds memory
	// with the rule's maxBytes per bucket.
	maxPointMetas = 100
	// maxPointKeys bounds the (meta, window) keys, each at least one
	// lookup: past it a scan of the buckets is likely cheaper.
	maxPointKeys = 20_000
)
