package query

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/tsproxy/tsproxy/rewrite/caps"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// This file splits an app's event filter into the two $match stages of a
// bucketed read:
//
//   - the bucket-level filter, run before $unwind: the filter's top-level
//     (and $and) predicates on the timeField, turned into predicates on the
//     bucket's "start", and those on the metaField, turned into predicates
//     on the bucket's "meta". It selects a superset of the buckets holding
//     matching events, using the {meta: 1, start: 1} index.
//   - the event-level filter, run after $unwind: the whole filter with each
//     event path f renamed events.f and each metaField path renamed meta...
//
// An event stored without its metaField sits in a bucket whose meta is null
// and has no marker key; one stored with it has the marker (a null under
// the metaField's name, see storedEvent). MongoDB matches a missing field
// and a null alike for every operator but $exists and $type, so those two
// are answered from the marker.

// Ctx is what the read rewrite needs to know of the rule.
type Ctx struct {
	Rule      *rules.Rule
	NS        string
	MetaField string
	TimeField string
	Span      int64
	Caps      caps.Upstream
	// fixedMeta is the meta every selected bucket has, when the filter
	// pins the metaField to one value at its top level (no lookup needed).
	FixedMeta *bsoncore.Value
	// usedMeta is set when a translation renames a path to the bucket's
	// meta (FerretDB's $unwind drops it: only the bucket-level filter may).
	UsedMeta bool
}

func NewCtx(rule *rules.Rule) (*Ctx, error) {
	if rule == nil {
		return nil, mongoerr.Errorf(mongoerr.InternalError, "no rule")
	}
	if rule.TimeField == "" || rule.BucketCollection == "" || rule.DB == "" {
		return nil, mongoerr.Errorf(mongoerr.InternalError, "tsproxy rule %s: incomplete rule (timeField, database and bucket collection are required)", rule.Namespace)
	}
	span := rule.SpanMillis()
	if span <= 0 {
		span = rules.DefaultSpan.Milliseconds()
	}
	return &Ctx{Rule: rule, NS: rule.Namespace, MetaField: rule.MetaField, TimeField: rule.TimeField, Span: span}, nil
}

// unsupported is a NotImplemented error naming the rule.
func (rc *Ctx) Unsupported(format string, args ...any) error {
	return mongoerr.Errorf(mongoerr.NotImplemented, "tsproxy rule %s: %s", rc.NS, fmt.Sprintf(format, args...))
}

// badValue is an error in the client's command, naming the rule.
func (rc *Ctx) BadValue(code mongoerr.Code, format string, args ...any) error {
	return mongoerr.Errorf(code, "tsproxy rule %s: %s", rc.NS, fmt.Sprintf(format, args...))
}

// metaPath reports whether path is the metaField or a path inside it, and
// returns the rest after the metaField ("" or ".sub").
func (rc *Ctx) MetaPath(path string) (rest string, ok bool) {
	if rc.MetaField == "" {
		return "", false
	}
	if path == rc.MetaField {
		return "", true
	}
	if strings.HasPrefix(path, rc.MetaField+".") {
		return path[len(rc.MetaField):], true
	}
	return "", false
}

// upstreamPath renames an event path to its path in an unwound bucket.
func (rc *Ctx) UpstreamPath(path string) string {
	if rest, ok := rc.MetaPath(path); ok {
		rc.UsedMeta = true
		return bucket.FieldMeta + rest
	}
	return bucket.FieldEvents + "." + path
}

// markerPath is where the metaField marker of an unwound event is.
func (rc *Ctx) MarkerPath() string { return bucket.FieldEvents + "." + rc.MetaField }

// refused top-level and field operators: they need more than a renaming
// (JavaScript, expressions over the whole document, text or geo indexes,
// schemas over the event).
var refusedOperators = map[string]string{
	"$where":         "JavaScript",
	"$expr":          "aggregation expressions",
	"$text":          "text search",
	"$jsonSchema":    "JSON Schema",
	"$near":          "geospatial queries",
	"$nearSphere":    "geospatial queries",
	"$geoWithin":     "geospatial queries",
	"$geoIntersects": "geospatial queries",
	"$within":        "geospatial queries",
	"$sampleRate":    "sampling",
	"$alwaysTrue":    "internal operators",
	"$alwaysFalse":   "internal operators",
}

// fieldOperators are the operators allowed under a field path; their
// operands do not name fields of the event, so renaming the path keeps
// their meaning ($elemMatch and $not are checked inside).
var fieldOperators = map[string]bool{
	"$eq": true, "$ne": true, "$gt": true, "$gte": true, "$lt": true, "$lte": true,
	"$in": true, "$nin": true, "$exists": true, "$not": true, "$regex": true, "$options": true,
	"$type": true, "$size": true, "$all": true, "$elemMatch": true, "$mod": true,
	"$bitsAllSet": true, "$bitsAllClear": true, "$bitsAnySet": true, "$bitsAnyClear": true,
}

// IsOperatorDoc reports whether v is a document whose first key is an
// operator ({$gt: 1}), which MongoDB reads as operators, not as a literal.
func IsOperatorDoc(v bsoncore.Value) (bsoncore.Document, bool) {
	d, ok := v.DocumentOK()
	if !ok {
		return nil, false
	}
	elems, err := d.Elements()
	if err != nil || len(elems) == 0 {
		return nil, false
	}
	return d, strings.HasPrefix(elems[0].Key(), "$")
}

// checkFieldOperators validates an operator document under a field path.
func (rc *Ctx) checkFieldOperators(ops bsoncore.Document, depth int) error {
	if depth > bsonutil.MaxDepth {
		return rc.BadValue(mongoerr.BadValue, "filter nested deeper than %d levels", bsonutil.MaxDepth)
	}
	elems, err := ops.Elements()
	if err != nil {
		return rc.BadValue(mongoerr.InvalidBSON, "filter is not valid BSON: %v", err)
	}
	for _, e := range elems {
		op := e.Key()
		if why, ok := refusedOperators[op]; ok {
			return rc.Unsupported("filter operator %q (%s) is not supported on a bucketed namespace", op, why)
		}
		if !fieldOperators[op] {
			return rc.Unsupported("filter operator %q is not supported on a bucketed namespace", op)
		}
		v := e.Value()
		switch op {
		case "$not":
			if d, ok := v.DocumentOK(); ok {
				if err := rc.checkFieldOperators(d, depth+1); err != nil {
					return err
				}
			} else if v.Type != bsoncore.TypeRegex {
				return rc.BadValue(mongoerr.BadValue, "$not needs a regex or a document")
			}
		case "$elemMatch":
			d, ok := v.DocumentOK()
			if !ok {
				return rc.BadValue(mongoerr.BadValue, "$elemMatch needs an Object")
			}
			// Its operand is either operators on the element or a filter
			// whose paths are relative to the element: neither is renamed.
			if _, isOps := IsOperatorDoc(v); isOps && !startsWithLogical(d) {
				if err := rc.checkFieldOperators(d, depth+1); err != nil {
					return err
				}
			} else if err := rc.checkRelativeFilter(d, depth+1); err != nil {
				return err
			}
		case "$all":
			if arr, ok := v.ArrayOK(); ok {
				vals, _ := arr.Values()
				for _, item := range vals {
					if d, ok := IsOperatorDoc(item); ok {
						if err := rc.checkFieldOperators(d, depth+1); err != nil {
							return err
						}
					}
				}
			}
		}
	}
	return nil
}

func startsWithLogical(d bsoncore.Document) bool {
	elems, err := d.Elements()
	if err != nil || len(elems) == 0 {
		return false
	}
	switch elems[0].Key() {
	case "$and", "$or", "$nor":
		return true
	}
	return false
}

// checkRelativeFilter validates a filter whose paths are not renamed (the
// operand of $elemMatch).
func (rc *Ctx) checkRelativeFilter(f bsoncore.Document, depth int) error {
	if depth > bsonutil.MaxDepth {
		return rc.BadValue(mongoerr.BadValue, "filter nested deeper than %d levels", bsonutil.MaxDepth)
	}
	elems, err := f.Elements()
	if err != nil {
		return rc.BadValue(mongoerr.InvalidBSON, "filter is not valid BSON: %v", err)
	}
	for _, e := range elems {
		k := e.Key()
		switch {
		case k == "$and" || k == "$or" || k == "$nor":
			docs, err := rc.logicalOperand(k, e.Value())
			if err != nil {
				return err
			}
			for _, d := range docs {
				if err := rc.checkRelativeFilter(d, depth+1); err != nil {
					return err
				}
			}
		case k == "$comment":
		case strings.HasPrefix(k, "$"):
			if why, ok := refusedOperators[k]; ok {
				return rc.Unsupported("filter operator %q (%s) is not supported on a bucketed namespace", k, why)
			}
			return rc.Unsupported("filter operator %q is not supported on a bucketed namespace", k)
		default:
			if d, ok := IsOperatorDoc(e.Value()); ok {
				if err := rc.checkFieldOperators(d, depth+1); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func (rc *Ctx) logicalOperand(op string, v bsoncore.Value) ([]bsoncore.Document, error) {
	arr, ok := v.ArrayOK()
	if !ok {
		return nil, rc.BadValue(mongoerr.BadValue, "%s must be an array", op)
	}
	vals, err := arr.Values()
	if err != nil {
		return nil, rc.BadValue(mongoerr.InvalidBSON, "%s is not valid BSON: %v", op, err)
	}
	if len(vals) == 0 {
		return nil, rc.BadValue(mongoerr.BadValue, "$and/$or/$nor must be a nonempty array")
	}
	out := make([]bsoncore.Document, 0, len(vals))
	for _, item := range vals {
		d, ok := item.DocumentOK()
		if !ok {
			return nil, rc.BadValue(mongoerr.BadValue, "$or/$and/$nor entries need to be full objects")
		}
		out = append(out, d)
	}
	return out, nil
}

// translateFilter renames every path of an event filter to its path in an
// unwound bucket. It returns the translated filter as a document.
func (rc *Ctx) TranslateFilter(f bsoncore.Document, depth int) (bsoncore.Document, error) {
	idx, dst := bsoncore.AppendDocumentStart(nil)
	dst, err := rc.appendTranslated(dst, f, depth)
	if err != nil {
		return nil, err
	}
	dst, _ = bsoncore.AppendDocumentEnd(dst, idx)
	return dst, nil
}

func (rc *Ctx) appendTranslated(dst []byte, f bsoncore.Document, depth int) ([]byte, error) {
	if depth > bsonutil.MaxDepth {
		return nil, rc.BadValue(mongoerr.BadValue, "filter nested deeper than %d levels", bsonutil.MaxDepth)
	}
	elems, err := f.Elements()
	if err != nil {
		return nil, rc.BadValue(mongoerr.InvalidBSON, "filter is not valid BSON: %v", err)
	}
	for _, e := range elems {
		dst, err = rc.appendTranslatedElem(dst, e, depth)
		if err != nil {
			return nil, err
		}
	}
	return dst, nil
}

func (rc *Ctx) appendTranslatedElem(dst []byte, e bsoncore.Element, depth int) ([]byte, error) {
	k := e.Key()
	switch {
	case k == "$and" || k == "$or" || k == "$nor":
		docs, err := rc.logicalOperand(k, e.Value())
		if err != nil {
			return nil, err
		}
		aidx, out := bsoncore.AppendArrayElementStart(dst, k)
		for i, d := range docs {
			t, err := rc.TranslateFilter(d, depth+1)
			if err != nil {
				return nil, err
			}
			out = bsoncore.AppendDocumentElement(out, strconv.Itoa(i), t)
		}
		out, _ = bsoncore.AppendArrayEnd(out, aidx)
		return out, nil
	case k == "$comment":
		return dst, nil
	case strings.HasPrefix(k, "$"):
		if why, ok := refusedOperators[k]; ok {
			return nil, rc.Unsupported("filter operator %q (%s) is not supported on a bucketed namespace", k, why)
		}
		return nil, rc.Unsupported("filter operator %q is not supported on a bucketed namespace", k)
	case k == "":
		return nil, rc.BadValue(mongoerr.BadValue, "empty field name in filter")
	}
	v := e.Value()
	ops, isOps := IsOperatorDoc(v)
	if isOps {
		if err := rc.checkFieldOperators(ops, depth+1); err != nil {
			return nil, err
		}
	}
	if rest, ok := rc.MetaPath(k); ok && rest == "" && isOps {
		return rc.appendMetaOperators(dst, ops)
	}
	return bsoncore.AppendValueElement(dst, rc.UpstreamPath(k), v), nil
}

// appendMetaOperators translates operators on the metaField itself:
// $exists is answered by the marker, $type also requires the marker (a
// missing meta is stored as a null one), the rest apply to meta.
func (rc *Ctx) appendMetaOperators(dst []byte, ops bsoncore.Document) ([]byte, error) {
	elems, _ := ops.Elements()
	var onMeta, onMarker []bsoncore.Element
	needMarker := false
	for _, e := range elems {
		switch e.Key() {
		case "$exists":
			onMarker = append(onMarker, e)
		case "$type":
			needMarker = true
			onMeta = append(onMeta, e)
		case "$not":
			inner, ok := e.Value().DocumentOK()
			if !ok {
				onMeta = append(onMeta, e)
				continue
			}
			_, hasExists := bsonutil.Lookup(inner, "$exists")
			_, hasType := bsonutil.Lookup(inner, "$type")
			innerElems, _ := inner.Elements()
			switch {
			case hasExists && len(innerElems) == 1:
				onMarker = append(onMarker, e)
			case hasExists || hasType:
				return nil, rc.Unsupported("$not with $type or $exists together with other operators on the metaField %q is not supported on a bucketed namespace", rc.MetaField)
			default:
				onMeta = append(onMeta, e)
			}
		default:
			onMeta = append(onMeta, e)
		}
	}
	if len(onMeta) > 0 {
		rc.UsedMeta = true
		idx, out := bsoncore.AppendDocumentElementStart(dst, bucket.FieldMeta)
		for _, e := range onMeta {
			out = append(out, e...)
		}
		dst, _ = bsoncore.AppendDocumentEnd(out, idx)
	}
	if len(onMarker) > 0 || needMarker {
		idx, out := bsoncore.AppendDocumentElementStart(dst, rc.MarkerPath())
		for _, e := range onMarker {
			out = append(out, e...)
		}
		if needMarker {
			out = bsoncore.AppendBooleanElement(out, "$exists", true)
		}
		dst, _ = bsoncore.AppendDocumentEnd(out, idx)
	}
	return dst, nil
}

// SplitFilter is the bucket-level and event-level filters of an event
// filter; either may be nil (no $match needed).
type SplitFilter struct {
	Bucket bsoncore.Document
	Event  bsoncore.Document
}

// TimeBounds collects the constraints on bucket "start" implied by the
// timeField predicates.
type TimeBounds struct {
	HasLo, HasHi, HiStrict bool
	Lo, Hi                 int64
	Eq                     [][]int64 // each conjunct: start must be one of
}

func (tb *TimeBounds) Lower(v int64) {
	if !tb.HasLo || v > tb.Lo {
		tb.Lo, tb.HasLo = v, true
	}
}

func (tb *TimeBounds) Upper(v int64, strict bool) {
	if !tb.HasHi || v < tb.Hi || (v == tb.Hi && strict) {
		tb.Hi, tb.HasHi, tb.HiStrict = v, true, strict
	}
}

func (tb *TimeBounds) Empty() bool { return !tb.HasLo && !tb.HasHi && len(tb.Eq) == 0 }

// floor is the window start of ms, or false when flooring overflows.
func (rc *Ctx) Floor(ms int64) (int64, bool) {
	f := rules.FloorMillis(ms, rc.Span)
	if f > ms {
		return 0, false
	}
	return f, true
}

// addTime reads one top-level predicate on the timeField.
func (rc *Ctx) AddTime(tb *TimeBounds, v bsoncore.Value) {
	if ms, ok := v.DateTimeOK(); ok {
		if f, ok := rc.Floor(ms); ok {
			tb.Eq = append(tb.Eq, []int64{f})
		}
		return
	}
	ops, ok := IsOperatorDoc(v)
	if !ok {
		return
	}
	elems, _ := ops.Elements()
	for _, e := range elems {
		ov := e.Value()
		switch e.Key() {
		case "$eq":
			rc.AddTime(tb, ov)
		case "$gt", "$gte":
			if ms, ok := ov.DateTimeOK(); ok {
				if f, ok := rc.Floor(ms); ok {
					tb.Lower(f)
				}
			}
		case "$lt":
			if ms, ok := ov.DateTimeOK(); ok {
				tb.Upper(ms, true)
			}
		case "$lte":
			if ms, ok := ov.DateTimeOK(); ok {
				tb.Upper(ms, false)
			}
		case "$in":
			arr, ok := ov.ArrayOK()
			if !ok {
				continue
			}
			vals, err := arr.Values()
			if err != nil || len(vals) == 0 {
				continue
			}
			var starts []int64
			seen := map[int64]bool{}
			all := true
			for _, item := range vals {
				ms, ok := item.DateTimeOK()
				if !ok {
					all = false // a regex or other type may match differently
					break
				}
				f, ok := rc.Floor(ms)
				if !ok {
					all = false
					break
				}
				if !seen[f] {
					seen[f] = true
					starts = append(starts, f)
				}
			}
			if all {
				tb.Eq = append(tb.Eq, starts)
			}
		}
	}
}

// conjuncts flattens the top level of a filter and its top-level $and
// into a list of one-predicate elements.
func (rc *Ctx) Conjuncts(f bsoncore.Document, depth int, out []bsoncore.Element) ([]bsoncore.Element, error) {
	if depth > bsonutil.MaxDepth {
		return nil, rc.BadValue(mongoerr.BadValue, "filter nested deeper than %d levels", bsonutil.MaxDepth)
	}
	elems, err := f.Elements()
	if err != nil {
		return nil, rc.BadValue(mongoerr.InvalidBSON, "filter is not valid BSON: %v", err)
	}
	for _, e := range elems {
		if e.Key() == "$and" {
			docs, err := rc.logicalOperand("$and", e.Value())
			if err != nil {
				return nil, err
			}
			for _, d := range docs {
				if out, err = rc.Conjuncts(d, depth+1, out); err != nil {
					return nil, err
				}
			}
			continue
		}
		out = append(out, e)
	}
	return out, nil
}

// split splits an event filter (nil or empty: match all).
func (rc *Ctx) Split(filter bsoncore.Document) (SplitFilter, error) {
	var sf SplitFilter
	if len(filter) == 0 {
		return sf, nil
	}
	if err := bsonutil.Validate(filter, 1); err != nil {
		return sf, rc.BadValue(mongoerr.InvalidBSON, "filter is not valid BSON: %v", err)
	}
	conj, err := rc.Conjuncts(filter, 0, nil)
	if err != nil {
		return sf, err
	}
	var tb TimeBounds
	var bucketDocs, eventDocs []bsoncore.Document
	for _, e := range conj {
		rc.UsedMeta = false
		idx, d := bsoncore.AppendDocumentStart(nil)
		d, err := rc.appendTranslatedElem(d, e, 1)
		if err != nil {
			return sf, err
		}
		d, _ = bsoncore.AppendDocumentEnd(d, idx)
		k := e.Key()
		if k == rc.TimeField {
			rc.AddTime(&tb, e.Value())
		}
		if rest, isMeta := rc.MetaPath(k); isMeta && rest == "" {
			v := e.Value()
			if eq, ok := IsOperatorDoc(v); ok {
				if ee, err := eq.Elements(); err == nil && len(ee) == 1 && ee[0].Key() == "$eq" {
					v = ee[0].Value()
				}
			}
			// Only types whose equality is byte equality: a number or a
			// document also matches other encodings of the same value.
			switch v.Type {
			case bsoncore.TypeString, bsoncore.TypeObjectID, bsoncore.TypeBoolean, bsoncore.TypeNull, bsoncore.TypeDateTime:
				// A copy: the cursor outlives the request's buffer.
				rc.FixedMeta = &bsoncore.Value{Type: v.Type, Data: append([]byte(nil), v.Data...)}
			}
		}
		if _, isMeta := rc.MetaPath(k); isMeta {
			// A predicate on the metaField holds for all events of a
			// bucket or none: its meta part is the bucket's filter, its
			// marker part ($exists, $type) the events'.
			onMeta, rest := splitMetaElems(d)
			if onMeta != nil {
				bucketDocs = append(bucketDocs, onMeta)
			}
			if rest != nil {
				eventDocs = append(eventDocs, rest)
			}
			continue
		}
		if rc.UsedMeta && !rc.Caps.UnwindKeepsFields {
			return sf, rc.Unsupported("a filter on the metaField %q inside %q is not supported on a bucketed namespace on this upstream (FerretDB): put metaField conditions at the top level of the filter", rc.MetaField, k)
		}
		if len(d) > 5 {
			eventDocs = append(eventDocs, d)
		}
	}
	if !tb.Empty() {
		bucketDocs = append(bucketDocs, StartFilter(&tb))
	}
	sf.Bucket = AndOf(bucketDocs)
	sf.Event = AndOf(eventDocs)
	return sf, nil
}

// splitMetaElems splits a translated predicate in its elements on the
// bucket's meta and the others; either may be nil.
func splitMetaElems(d bsoncore.Document) (onMeta, rest bsoncore.Document) {
	elems, _ := d.Elements()
	var m, r []bsoncore.Element
	for _, e := range elems {
		k := e.Key()
		if k == bucket.FieldMeta || strings.HasPrefix(k, bucket.FieldMeta+".") {
			m = append(m, e)
		} else {
			r = append(r, e)
		}
	}
	build := func(es []bsoncore.Element) bsoncore.Document {
		if len(es) == 0 {
			return nil
		}
		idx, out := bsoncore.AppendDocumentStart(nil)
		out = bsonutil.AppendElems(out, es)
		out, _ = bsoncore.AppendDocumentEnd(out, idx)
		return out
	}
	return build(m), build(r)
}

func StartFilter(tb *TimeBounds) bsoncore.Document {
	idx, d := bsoncore.AppendDocumentStart(nil)
	if tb.HasLo || tb.HasHi {
		sidx, s := bsoncore.AppendDocumentElementStart(d, bucket.FieldStart)
		if tb.HasLo {
			s = bsoncore.AppendDateTimeElement(s, "$gte", tb.Lo)
		}
		if tb.HasHi {
			op := "$lte"
			if tb.HiStrict {
				op = "$lt"
			}
			s = bsoncore.AppendDateTimeElement(s, op, tb.Hi)
		}
		d, _ = bsoncore.AppendDocumentEnd(s, sidx)
	}
	for _, set := range tb.Eq {
		if len(set) == 1 && !tb.HasLo && !tb.HasHi && len(tb.Eq) == 1 {
			d = bsoncore.AppendDateTimeElement(d, bucket.FieldStart, set[0])
			continue
		}
		// Several conjuncts on start: each its own $in under an $and would
		// need nesting; an intersection keeps it one predicate.
		set = intersectStarts(tb.Eq)
		aidx, a := bsoncore.AppendArrayElementStart(d, "$and")
		cidx, c := bsoncore.AppendDocumentElementStart(a, "0")
		iidx, in := bsoncore.AppendDocumentElementStart(c, bucket.FieldStart)
		arrIdx, arr := bsoncore.AppendArrayElementStart(in, "$in")
		for i, s := range set {
			arr = bsoncore.AppendDateTimeElement(arr, strconv.Itoa(i), s)
		}
		arr, _ = bsoncore.AppendArrayEnd(arr, arrIdx)
		in, _ = bsoncore.AppendDocumentEnd(arr, iidx)
		c, _ = bsoncore.AppendDocumentEnd(in, cidx)
		d, _ = bsoncore.AppendArrayEnd(c, aidx)
		break
	}
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

// intersectStarts is the starts present in every set, in the first set's
// order.
func intersectStarts(sets [][]int64) []int64 {
	out := append([]int64(nil), sets[0]...)
	for _, s := range sets[1:] {
		in := map[int64]bool{}
		for _, v := range s {
			in[v] = true
		}
		kept := out[:0]
		for _, v := range out {
			if in[v] {
				kept = append(kept, v)
			}
		}
		out = kept
	}
	return out
}

// AndOf is one filter from several: nil for none, the filter itself for
// one, {$and: [...]} otherwise (never merged into one document, so no key
// can repeat).
func AndOf(docs []bsoncore.Document) bsoncore.Document {
	switch len(docs) {
	case 0:
		return nil
	case 1:
		return docs[0]
	}
	idx, d := bsoncore.AppendDocumentStart(nil)
	aidx, a := bsoncore.AppendArrayElementStart(d, "$and")
	for i, x := range docs {
		a = bsoncore.AppendDocumentElement(a, strconv.Itoa(i), x)
	}
	d, _ = bsoncore.AppendArrayEnd(a, aidx)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

// parseProjection reads a projection document; nil (no error) means no
// projection at all ({} or absent). what names it in errors ("find option
// \"projection\"" or "$project").
func (rc *Ctx) ParseProjection(spec bsoncore.Document, what string) (*Projection, error) {
	if len(spec) == 0 {
		return nil, nil
	}
	type entry struct {
		path    string
		include bool
	}
	var entries []entry
	var walk func(prefix string, d bsoncore.Document, depth int) error
	walk = func(prefix string, d bsoncore.Document, depth int) error {
		if depth > bsonutil.MaxDepth {
			return rc.BadValue(mongoerr.BadValue, "%s nested too deep", what)
		}
		elems, err := d.Elements()
		if err != nil {
			return rc.BadValue(mongoerr.InvalidBSON, "%s is not valid BSON: %v", what, err)
		}
		for _, e := range elems {
			k := e.Key()
			path := k
			if prefix != "" {
				path = prefix + "." + k
			}
			if strings.HasPrefix(k, "$") || strings.Contains(k, ".$") || k == "" || strings.HasPrefix(k, ".") || strings.HasSuffix(k, ".") || strings.Contains(k, "..") {
				return rc.Unsupported("%s path %q (positional or $-prefixed paths) is not supported on a bucketed namespace", what, path)
			}
			v := e.Value()
			switch v.Type {
			case bsoncore.TypeBoolean:
				entries = append(entries, entry{path, v.Boolean()})
			case bsoncore.TypeInt32, bsoncore.TypeInt64, bsoncore.TypeDouble, bsoncore.TypeDecimal128:
				f, ok := v.AsFloat64OK()
				if v.Type == bsoncore.TypeDecimal128 {
					f, ok = 1, true
					if h, l, okD := v.Decimal128OK(); okD {
						if d, _, err := bson.NewDecimal128(h, l).BigInt(); err == nil && d.Sign() == 0 {
							f = 0
						}
					}
				}
				entries = append(entries, entry{path, !ok || f != 0})
			case bsoncore.TypeEmbeddedDocument:
				sub := bsoncore.Document(v.Data)
				if se, err := sub.Elements(); err == nil && len(se) > 0 && strings.HasPrefix(se[0].Key(), "$") {
					return rc.Unsupported("%s operator %q on %q is not supported on a bucketed namespace", what, se[0].Key(), path)
				}
				if err := walk(path, sub, depth+1); err != nil {
					return err
				}
			default:
				return rc.Unsupported("%s: computed field %q (a %s value) is not supported on a bucketed namespace; use 1/true or 0/false", what, path, bsonutil.TypeName(v.Type))
			}
		}
		return nil
	}
	if err := walk("", spec, 0); err != nil {
		return nil, err
	}
	if len(entries) == 0 {
		if what == "$project" {
			return nil, rc.BadValue(mongoerr.BadValue, "$project specification must have at least one field")
		}
		return nil, nil
	}
	p := &Projection{root: &projNode{children: map[string]*projNode{}}}
	mode := 0 // 0 unknown, 1 inclusion, -1 exclusion
	idIncluded, idGiven := true, false
	for _, en := range entries {
		if en.path == "_id" {
			idGiven, idIncluded = true, en.include
			continue
		}
		m := -1
		if en.include {
			m = 1
		}
		if mode != 0 && m != mode {
			kind := "exclusion"
			where := "inclusion"
			if m == 1 {
				kind, where = "inclusion", "exclusion"
			}
			return nil, rc.BadValue(mongoerr.ProjectionMixed, "Cannot do %s on field %s in %s projection", kind, en.path, where)
		}
		mode = m
	}
	if mode == 0 { // only _id
		if idIncluded {
			mode = 1
		} else {
			mode = -1
		}
	}
	p.Inclusion = mode == 1
	for _, en := range entries {
		if en.path == "_id" {
			continue
		}
		if err := rc.insertPath(p.root, en.path); err != nil {
			return nil, err
		}
	}
	if p.Inclusion {
		p.ExcludeID = idGiven && !idIncluded
		if idGiven && idIncluded && p.root.children["_id"] == nil {
			p.root.children["_id"] = &projNode{leaf: true}
		}
	} else if idGiven && !idIncluded {
		if err := rc.insertPath(p.root, "_id"); err != nil {
			return nil, err
		}
	}
	return p, nil
}

func (rc *Ctx) insertPath(root *projNode, path string) error {
	parts := strings.Split(path, ".")
	n := root
	for i, part := range parts {
		if n.leaf {
			return rc.BadValue(mongoerr.ProjectionCollide, "Path collision at %s remaining portion %s", path, strings.Join(parts[i:], "."))
		}
		if n.children == nil {
			n.children = map[string]*projNode{}
		}
		c := n.children[part]
		if c == nil {
			c = &projNode{}
			n.children[part] = c
		}
		n = c
	}
	if n.leaf || len(n.children) > 0 {
		return rc.BadValue(mongoerr.ProjectionCollide, "Path collision at %s", path)
	}
	n.leaf = true
	return nil
}

// checkOptions refuses every field of body not in known (nor carried).
func (rc *Ctx) CheckOptions(body bsoncore.Document, cmd string, known ...string) error {
	elems, _ := body.Elements()
	for i, e := range elems {
		k := e.Key()
		if i == 0 || CarriedSet[k] {
			continue
		}
		ok := false
		for _, kn := range known {
			if kn == k {
				ok = true
				break
			}
		}
		if ok {
			continue
		}
		if boolFalseOK[k] {
			if b, isBool := e.Value().BooleanOK(); isBool && !b {
				continue
			}
		}
		if why, found := refusedReadOptions[k]; found {
			return rc.Unsupported("%s option %q is not supported on a bucketed namespace (%s)", cmd, k, why)
		}
		return rc.Unsupported("%s option %q is not supported on a bucketed namespace", cmd, k)
	}
	return nil
}

// readInt reads a whole number argument (int32, int64 or an integral
// double), as the server accepts them.
func (rc *Ctx) ReadInt(body bsoncore.Document, key, cmd string) (int64, bool, error) {
	v, ok := bsonutil.Lookup(body, key)
	if !ok || v.Type == bsoncore.TypeNull {
		return 0, false, nil
	}
	switch v.Type {
	case bsoncore.TypeInt32:
		return int64(v.Int32()), true, nil
	case bsoncore.TypeInt64:
		return v.Int64(), true, nil
	case bsoncore.TypeDouble:
		f := v.Double()
		if f == math.Trunc(f) && f >= -9.2e18 && f <= 9.2e18 {
			return int64(f), true, nil
		}
	}
	return 0, false, rc.BadValue(mongoerr.TypeMismatch, "%s option %q must be a whole number, got %s", cmd, key, bsonutil.TypeName(v.Type))
}

func (rc *Ctx) ReadFindPaging(body bsoncore.Document) (Paging, error) {
	const cmd = "find"
	var pg Paging
	var err error
	if pg.Skip, _, err = rc.ReadInt(body, "skip", cmd); err != nil {
		return pg, err
	}
	if pg.Skip < 0 {
		return pg, rc.BadValue(mongoerr.BadValue, "find option \"skip\" must be non-negative")
	}
	if pg.Limit, _, err = rc.ReadInt(body, "limit", cmd); err != nil {
		return pg, err
	}
	if pg.Single, err = bsonutil.Bool(body, "singleBatch", false); err != nil {
		return pg, rc.BadValue(mongoerr.TypeMismatch, "find option \"singleBatch\" must be a boolean")
	}
	if pg.Limit < 0 {
		if pg.Limit == math.MinInt64 {
			return pg, rc.BadValue(mongoerr.BadValue, "find option \"limit\" is out of range")
		}
		pg.Limit, pg.Single = -pg.Limit, true
	}
	bs, hasBatch, err := rc.ReadInt(body, "batchSize", cmd)
	if err != nil {
		return pg, err
	}
	if bs < 0 {
		return pg, rc.BadValue(mongoerr.BadValue, "find option \"batchSize\" must be non-negative")
	}
	pg.BatchSize = -1
	if hasBatch {
		pg.BatchSize = bs
	}
	return pg, nil
}

// readCountPaging reads a count's skip and limit; a negative limit counts
// as its absolute value, as on MongoDB.
func (rc *Ctx) ReadCountPaging(body bsoncore.Document) (skip, limit int64, err error) {
	const cmd = "count"
	if skip, _, err = rc.ReadInt(body, "skip", cmd); err != nil {
		return 0, 0, err
	}
	if skip < 0 {
		return 0, 0, rc.BadValue(mongoerr.BadValue, "count option \"skip\" must be non-negative")
	}
	if limit, _, err = rc.ReadInt(body, "limit", cmd); err != nil {
		return 0, 0, err
	}
	if limit < 0 && limit != math.MinInt64 {
		limit = -limit
	}
	return skip, limit, nil
}

func (rc *Ctx) ReadDoc(body bsoncore.Document, key, cmd string) (bsoncore.Document, error) {
	v, ok := bsonutil.Lookup(body, key)
	if !ok || v.Type == bsoncore.TypeNull {
		return nil, nil
	}
	d, ok := v.DocumentOK()
	if !ok {
		return nil, rc.BadValue(mongoerr.TypeMismatch, "%s option %q must be a document, got %s", cmd, key, bsonutil.TypeName(v.Type))
	}
	return d, nil
}

// translateSort renames sort keys as filter paths are renamed.
func (rc *Ctx) TranslateSort(sort bsoncore.Document, cmd string) (bsoncore.Document, error) {
	elems, err := sort.Elements()
	if err != nil {
		return nil, rc.BadValue(mongoerr.InvalidBSON, "sort is not valid BSON: %v", err)
	}
	if len(elems) == 0 {
		return nil, nil
	}
	idx, d := bsoncore.AppendDocumentStart(nil)
	for _, e := range elems {
		k := e.Key()
		if k == "" || strings.HasPrefix(k, "$") {
			return nil, rc.BadValue(mongoerr.BadValue, "%s sort key %q is not a field path", cmd, k)
		}
		v := e.Value()
		f, ok := v.AsFloat64OK()
		if !ok || (f != 1 && f != -1) {
			if v.Type == bsoncore.TypeEmbeddedDocument {
				return nil, rc.Unsupported("%s sort on %q by %s is not supported on a bucketed namespace", cmd, k, v.String())
			}
			return nil, rc.BadValue(mongoerr.BadValue, "%s sort direction of %q must be 1 or -1", cmd, k)
		}
		if _, isMeta := rc.MetaPath(k); isMeta && !rc.Caps.UnwindKeepsFields {
			return nil, rc.Unsupported("%s on the metaField %q is not supported on a bucketed namespace on this upstream (FerretDB's $unwind drops the bucket's meta)", cmd+" sort", k)
		}
		d = bsoncore.AppendInt32Element(d, rc.UpstreamPath(k), int32(f))
	}
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d, nil
}

// aggregateCommand builds the upstream aggregate on the bucket
// collection. batchSize < 0: none given. forExplain leaves out $db and the
// generic arguments (the explain wrapper carries them).
func (rc *Ctx) AggregateCommand(pipeline []bsoncore.Document, batchSize int64, body bsoncore.Document, extra []bsoncore.Element, forExplain bool) bsoncore.Document {
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendStringElement(d, "aggregate", rc.Rule.BucketCollection)
	aidx, a := bsoncore.AppendArrayElementStart(d, "pipeline")
	for i, s := range pipeline {
		a = bsoncore.AppendDocumentElement(a, strconv.Itoa(i), s)
	}
	d, _ = bsoncore.AppendArrayEnd(a, aidx)
	cidx, c := bsoncore.AppendDocumentElementStart(d, "cursor")
	if batchSize >= 0 {
		c = bsoncore.AppendInt64Element(c, "batchSize", batchSize)
	}
	d, _ = bsoncore.AppendDocumentEnd(c, cidx)
	for _, e := range extra {
		d = append(d, e...)
	}
	if !forExplain {
		for _, e := range bsonutil.Pick(body, Carried) {
			d = append(d, e...)
		}
		d = bsoncore.AppendStringElement(d, "$db", rc.Rule.DB)
	}
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

func (rc *Ctx) String() string { return fmt.Sprintf("read %s", rc.NS) }
