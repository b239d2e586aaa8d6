package rewrite

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/tsproxy/tsproxy/rewrite/bucket"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
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

// readCtx is what the read rewrite needs to know of the rule.
type readCtx struct {
	rule      *rules.Rule
	ns        string
	metaField string
	timeField string
	span      int64
	caps      Caps
	// fixedMeta is the meta every selected bucket has, when the filter
	// pins the metaField to one value at its top level (no lookup needed).
	fixedMeta *bsoncore.Value
	// usedMeta is set when a translation renames a path to the bucket's
	// meta (FerretDB's $unwind drops it: only the bucket-level filter may).
	usedMeta bool
}

func newReadCtx(rule *rules.Rule) (*readCtx, error) {
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
	return &readCtx{rule: rule, ns: rule.Namespace, metaField: rule.MetaField, timeField: rule.TimeField, span: span}, nil
}

// unsupported is a NotImplemented error naming the rule.
func (rc *readCtx) unsupported(format string, args ...any) error {
	return mongoerr.Errorf(mongoerr.NotImplemented, "tsproxy rule %s: %s", rc.ns, fmt.Sprintf(format, args...))
}

// badValue is an error in the client's command, naming the rule.
func (rc *readCtx) badValue(code mongoerr.Code, format string, args ...any) error {
	return mongoerr.Errorf(code, "tsproxy rule %s: %s", rc.ns, fmt.Sprintf(format, args...))
}

// metaPath reports whether path is the metaField or a path inside it, and
// returns the rest after the metaField ("" or ".sub").
func (rc *readCtx) metaPath(path string) (rest string, ok bool) {
	if rc.metaField == "" {
		return "", false
	}
	if path == rc.metaField {
		return "", true
	}
	if strings.HasPrefix(path, rc.metaField+".") {
		return path[len(rc.metaField):], true
	}
	return "", false
}

// upstreamPath renames an event path to its path in an unwound bucket.
func (rc *readCtx) upstreamPath(path string) string {
	if rest, ok := rc.metaPath(path); ok {
		rc.usedMeta = true
		return bucket.FieldMeta + rest
	}
	return bucket.FieldEvents + "." + path
}

// markerPath is where the metaField marker of an unwound event is.
func (rc *readCtx) markerPath() string { return bucket.FieldEvents + "." + rc.metaField }

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

// isOperatorDoc reports whether v is a document whose first key is an
// operator ({$gt: 1}), which MongoDB reads as operators, not as a literal.
func isOperatorDoc(v bsoncore.Value) (bsoncore.Document, bool) {
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
func (rc *readCtx) checkFieldOperators(ops bsoncore.Document, depth int) error {
	if depth > bsonutil.MaxDepth {
		return rc.badValue(mongoerr.BadValue, "filter nested deeper than %d levels", bsonutil.MaxDepth)
	}
	elems, err := ops.Elements()
	if err != nil {
		return rc.badValue(mongoerr.InvalidBSON, "filter is not valid BSON: %v", err)
	}
	for _, e := range elems {
		op := e.Key()
		if why, ok := refusedOperators[op]; ok {
			return rc.unsupported("filter operator %q (%s) is not supported on a bucketed namespace", op, why)
		}
		if !fieldOperators[op] {
			return rc.unsupported("filter operator %q is not supported on a bucketed namespace", op)
		}
		v := e.Value()
		switch op {
		case "$not":
			if d, ok := v.DocumentOK(); ok {
				if err := rc.checkFieldOperators(d, depth+1); err != nil {
					return err
				}
			} else if v.Type != bsoncore.TypeRegex {
				return rc.badValue(mongoerr.BadValue, "$not needs a regex or a document")
			}
		case "$elemMatch":
			d, ok := v.DocumentOK()
			if !ok {
				return rc.badValue(mongoerr.BadValue, "$elemMatch needs an Object")
			}
			// Its operand is either operators on the element or a filter
			// whose paths are relative to the element: neither is renamed.
			if _, isOps := isOperatorDoc(v); isOps && !startsWithLogical(d) {
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
					if d, ok := isOperatorDoc(item); ok {
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
func (rc *readCtx) checkRelativeFilter(f bsoncore.Document, depth int) error {
	if depth > bsonutil.MaxDepth {
		return rc.badValue(mongoerr.BadValue, "filter nested deeper than %d levels", bsonutil.MaxDepth)
	}
	elems, err := f.Elements()
	if err != nil {
		return rc.badValue(mongoerr.InvalidBSON, "filter is not valid BSON: %v", err)
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
				return rc.unsupported("filter operator %q (%s) is not supported on a bucketed namespace", k, why)
			}
			return rc.unsupported("filter operator %q is not supported on a bucketed namespace", k)
		default:
			if d, ok := isOperatorDoc(e.Value()); ok {
				if err := rc.checkFieldOperators(d, depth+1); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func (rc *readCtx) logicalOperand(op string, v bsoncore.Value) ([]bsoncore.Document, error) {
	arr, ok := v.ArrayOK()
	if !ok {
		return nil, rc.badValue(mongoerr.BadValue, "%s must be an array", op)
	}
	vals, err := arr.Values()
	if err != nil {
		return nil, rc.badValue(mongoerr.InvalidBSON, "%s is not valid BSON: %v", op, err)
	}
	if len(vals) == 0 {
		return nil, rc.badValue(mongoerr.BadValue, "$and/$or/$nor must be a nonempty array")
	}
	out := make([]bsoncore.Document, 0, len(vals))
	for _, item := range vals {
		d, ok := item.DocumentOK()
		if !ok {
			return nil, rc.badValue(mongoerr.BadValue, "$or/$and/$nor entries need to be full objects")
		}
		out = append(out, d)
	}
	return out, nil
}

// translateFilter renames every path of an event filter to its path in an
// unwound bucket. It returns the translated filter as a document.
func (rc *readCtx) translateFilter(f bsoncore.Document, depth int) (bsoncore.Document, error) {
	idx, dst := bsoncore.AppendDocumentStart(nil)
	dst, err := rc.appendTranslated(dst, f, depth)
	if err != nil {
		return nil, err
	}
	dst, _ = bsoncore.AppendDocumentEnd(dst, idx)
	return dst, nil
}

func (rc *readCtx) appendTranslated(dst []byte, f bsoncore.Document, depth int) ([]byte, error) {
	if depth > bsonutil.MaxDepth {
		return nil, rc.badValue(mongoerr.BadValue, "filter nested deeper than %d levels", bsonutil.MaxDepth)
	}
	elems, err := f.Elements()
	if err != nil {
		return nil, rc.badValue(mongoerr.InvalidBSON, "filter is not valid BSON: %v", err)
	}
	for _, e := range elems {
		dst, err = rc.appendTranslatedElem(dst, e, depth)
		if err != nil {
			return nil, err
		}
	}
	return dst, nil
}

func (rc *readCtx) appendTranslatedElem(dst []byte, e bsoncore.Element, depth int) ([]byte, error) {
	k := e.Key()
	switch {
	case k == "$and" || k == "$or" || k == "$nor":
		docs, err := rc.logicalOperand(k, e.Value())
		if err != nil {
			return nil, err
		}
		aidx, out := bsoncore.AppendArrayElementStart(dst, k)
		for i, d := range docs {
			t, err := rc.translateFilter(d, depth+1)
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
			return nil, rc.unsupported("filter operator %q (%s) is not supported on a bucketed namespace", k, why)
		}
		return nil, rc.unsupported("filter operator %q is not supported on a bucketed namespace", k)
	case k == "":
		return nil, rc.badValue(mongoerr.BadValue, "empty field name in filter")
	}
	v := e.Value()
	ops, isOps := isOperatorDoc(v)
	if isOps {
		if err := rc.checkFieldOperators(ops, depth+1); err != nil {
			return nil, err
		}
	}
	if rest, ok := rc.metaPath(k); ok && rest == "" && isOps {
		return rc.appendMetaOperators(dst, ops)
	}
	return bsoncore.AppendValueElement(dst, rc.upstreamPath(k), v), nil
}

// appendMetaOperators translates operators on the metaField itself:
// $exists is answered by the marker, $type also requires the marker (a
// missing meta is stored as a null one), the rest apply to meta.
func (rc *readCtx) appendMetaOperators(dst []byte, ops bsoncore.Document) ([]byte, error) {
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
				return nil, rc.unsupported("$not with $type or $exists together with other operators on the metaField %q is not supported on a bucketed namespace", rc.metaField)
			default:
				onMeta = append(onMeta, e)
			}
		default:
			onMeta = append(onMeta, e)
		}
	}
	if len(onMeta) > 0 {
		rc.usedMeta = true
		idx, out := bsoncore.AppendDocumentElementStart(dst, bucket.FieldMeta)
		for _, e := range onMeta {
			out = append(out, e...)
		}
		dst, _ = bsoncore.AppendDocumentEnd(out, idx)
	}
	if len(onMarker) > 0 || needMarker {
		idx, out := bsoncore.AppendDocumentElementStart(dst, rc.markerPath())
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

// splitFilter is the bucket-level and event-level filters of an event
// filter; either may be nil (no $match needed).
type splitFilter struct {
	bdoc  bsoncore.Document
	event bsoncore.Document
}

// timeBounds collects the constraints on bucket "start" implied by the
// timeField predicates.
type timeBounds struct {
	hasLo, hasHi, hiStrict bool
	lo, hi                 int64
	eq                     [][]int64 // each conjunct: start must be one of
}

func (tb *timeBounds) lower(v int64) {
	if !tb.hasLo || v > tb.lo {
		tb.lo, tb.hasLo = v, true
	}
}

func (tb *timeBounds) upper(v int64, strict bool) {
	if !tb.hasHi || v < tb.hi || (v == tb.hi && strict) {
		tb.hi, tb.hasHi, tb.hiStrict = v, true, strict
	}
}

func (tb *timeBounds) empty() bool { return !tb.hasLo && !tb.hasHi && len(tb.eq) == 0 }

// floor is the window start of ms, or false when flooring overflows.
func (rc *readCtx) floor(ms int64) (int64, bool) {
	f := rules.FloorMillis(ms, rc.span)
	if f > ms {
		return 0, false
	}
	return f, true
}

// addTime reads one top-level predicate on the timeField.
func (rc *readCtx) addTime(tb *timeBounds, v bsoncore.Value) {
	if ms, ok := v.DateTimeOK(); ok {
		if f, ok := rc.floor(ms); ok {
			tb.eq = append(tb.eq, []int64{f})
		}
		return
	}
	ops, ok := isOperatorDoc(v)
	if !ok {
		return
	}
	elems, _ := ops.Elements()
	for _, e := range elems {
		ov := e.Value()
		switch e.Key() {
		case "$eq":
			rc.addTime(tb, ov)
		case "$gt", "$gte":
			if ms, ok := ov.DateTimeOK(); ok {
				if f, ok := rc.floor(ms); ok {
					tb.lower(f)
				}
			}
		case "$lt":
			if ms, ok := ov.DateTimeOK(); ok {
				tb.upper(ms, true)
			}
		case "$lte":
			if ms, ok := ov.DateTimeOK(); ok {
				tb.upper(ms, false)
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
				f, ok := rc.floor(ms)
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
				tb.eq = append(tb.eq, starts)
			}
		}
	}
}

// conjuncts flattens the top level of a filter and its top-level $and
// into a list of one-predicate elements.
func (rc *readCtx) conjuncts(f bsoncore.Document, depth int, out []bsoncore.Element) ([]bsoncore.Element, error) {
	if depth > bsonutil.MaxDepth {
		return nil, rc.badValue(mongoerr.BadValue, "filter nested deeper than %d levels", bsonutil.MaxDepth)
	}
	elems, err := f.Elements()
	if err != nil {
		return nil, rc.badValue(mongoerr.InvalidBSON, "filter is not valid BSON: %v", err)
	}
	for _, e := range elems {
		if e.Key() == "$and" {
			docs, err := rc.logicalOperand("$and", e.Value())
			if err != nil {
				return nil, err
			}
			for _, d := range docs {
				if out, err = rc.conjuncts(d, depth+1, out); err != nil {
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
func (rc *readCtx) split(filter bsoncore.Document) (splitFilter, error) {
	var sf splitFilter
	if len(filter) == 0 {
		return sf, nil
	}
	if err := bsonutil.Validate(filter, 1); err != nil {
		return sf, rc.badValue(mongoerr.InvalidBSON, "filter is not valid BSON: %v", err)
	}
	conj, err := rc.conjuncts(filter, 0, nil)
	if err != nil {
		return sf, err
	}
	var tb timeBounds
	var bucketDocs, eventDocs []bsoncore.Document
	for _, e := range conj {
		rc.usedMeta = false
		idx, d := bsoncore.AppendDocumentStart(nil)
		d, err := rc.appendTranslatedElem(d, e, 1)
		if err != nil {
			return sf, err
		}
		d, _ = bsoncore.AppendDocumentEnd(d, idx)
		k := e.Key()
		if k == rc.timeField {
			rc.addTime(&tb, e.Value())
		}
		if rest, isMeta := rc.metaPath(k); isMeta && rest == "" {
			v := e.Value()
			if eq, ok := isOperatorDoc(v); ok {
				if ee, err := eq.Elements(); err == nil && len(ee) == 1 && ee[0].Key() == "$eq" {
					v = ee[0].Value()
				}
			}
			// Only types whose equality is byte equality: a number or a
			// document also matches other encodings of the same value.
			switch v.Type {
			case bsoncore.TypeString, bsoncore.TypeObjectID, bsoncore.TypeBoolean, bsoncore.TypeNull, bsoncore.TypeDateTime:
				// A copy: the cursor outlives the request's buffer.
				rc.fixedMeta = &bsoncore.Value{Type: v.Type, Data: append([]byte(nil), v.Data...)}
			}
		}
		if _, isMeta := rc.metaPath(k); isMeta {
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
		if rc.usedMeta && !rc.caps.UnwindKeepsFields {
			return sf, rc.unsupported("a filter on the metaField %q inside %q is not supported on a bucketed namespace on this upstream (FerretDB): put metaField conditions at the top level of the filter", rc.metaField, k)
		}
		if len(d) > 5 {
			eventDocs = append(eventDocs, d)
		}
	}
	if !tb.empty() {
		bucketDocs = append(bucketDocs, startFilter(&tb))
	}
	sf.bdoc = andOf(bucketDocs)
	sf.event = andOf(eventDocs)
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

// onlyMeta reports whether a translated predicate reads only the bucket's
// meta (so it holds for every event of a bucket it holds for).
func onlyMeta(d bsoncore.Document) bool {
	elems, err := d.Elements()
	if err != nil || len(elems) == 0 {
		return false
	}
	for _, e := range elems {
		k := e.Key()
		if k != bucket.FieldMeta && !strings.HasPrefix(k, bucket.FieldMeta+".") {
			return false
		}
	}
	return true
}

func startFilter(tb *timeBounds) bsoncore.Document {
	idx, d := bsoncore.AppendDocumentStart(nil)
	if tb.hasLo || tb.hasHi {
		sidx, s := bsoncore.AppendDocumentElementStart(d, bucket.FieldStart)
		if tb.hasLo {
			s = bsoncore.AppendDateTimeElement(s, "$gte", tb.lo)
		}
		if tb.hasHi {
			op := "$lte"
			if tb.hiStrict {
				op = "$lt"
			}
			s = bsoncore.AppendDateTimeElement(s, op, tb.hi)
		}
		d, _ = bsoncore.AppendDocumentEnd(s, sidx)
	}
	for _, set := range tb.eq {
		if len(set) == 1 && !tb.hasLo && !tb.hasHi && len(tb.eq) == 1 {
			d = bsoncore.AppendDateTimeElement(d, bucket.FieldStart, set[0])
			continue
		}
		// Several conjuncts on start: each its own $in under an $and would
		// need nesting; an intersection keeps it one predicate.
		set = intersectStarts(tb.eq)
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

// andOf is one filter from several: nil for none, the filter itself for
// one, {$and: [...]} otherwise (never merged into one document, so no key
// can repeat).
func andOf(docs []bsoncore.Document) bsoncore.Document {
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
