package query

import (
	"strconv"
	"strings"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/match"
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
// the metaField's name, see bucket.AppendStoredEvent). MongoDB matches a missing field
// and a null alike for every operator but $exists and $type, so those two
// are answered from the marker.

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
	ops, ok := match.IsOperatorDoc(v)
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
			if eq, ok := match.IsOperatorDoc(v); ok {
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
	bucketDocs = append(bucketDocs, rc.PlanPrune(filter).BucketFilters()...)
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
