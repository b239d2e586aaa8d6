package query

import (
	"math"
	"slices"
	"strings"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/match"
)

// Prune is what a filter's top-level numeric comparisons on a rule's
// aggregate fields say about the buckets that can hold a match: MongoDB
// keeps control.min/max of every field for its time-series indexes, the
// proxy keeps min/max of the rule's aggregates (rewrite/bucket), and a
// bucket whose [min, max] of a field misses a comparison's range holds
// no event that matches it.
//
// It is exact because a numeric comparison ($eq, $gt, $gte, $lt, $lte,
// $in of numbers) matches only numbers (MongoDB's type bracketing) or
// arrays holding one, and a bucket's summaries leave out nothing that
// could: a non-number in the field (an array, NaN, an infinity, ...)
// marks the bucket mixed for it, and one whose summaries do not cover
// every event (a field added to the rule's aggregates later) lacks the
// field in "summed". Both keep the bucket. Bounds are compared
// inclusively even where the filter's are strict, so an upstream that
// compares an int64 and a double through a rounding keeps every bucket
// it must.
type Prune struct {
	Fields []PruneRange
}

// PruneRange bounds one aggregate field: Lo and Hi are numbers, or
// absent (Type 0).
type PruneRange struct {
	Field  string
	Lo, Hi bsoncore.Value
}

// Empty reports whether p prunes nothing.
func (p *Prune) Empty() bool { return p == nil || len(p.Fields) == 0 }

// PlanPrune reads the prune of filter's top-level (and $and) conjuncts;
// nil when none bounds an aggregate field. Only top-level field names
// are used: an aggregate inside an array of documents is not summarized
// element by element.
func (rc *Ctx) PlanPrune(filter bsoncore.Document) *Prune {
	if rc.Rule == nil || len(rc.Rule.Aggregates) == 0 || len(filter) == 0 {
		return nil
	}
	// A copy: the prune outlives the request's buffer (a cursor's
	// getMores apply it after the buffer is reused).
	conj, err := rc.Conjuncts(slices.Clone(filter), 0, nil)
	if err != nil {
		return nil
	}
	var p Prune
	for _, e := range conj {
		f := e.Key()
		if strings.ContainsRune(f, '.') || strings.HasPrefix(f, "$") || !slices.Contains(rc.Rule.Aggregates, f) {
			continue
		}
		lo, hi := comparisonBounds(e.Value())
		if lo.Type == 0 && hi.Type == 0 {
			continue
		}
		p.add(f, lo, hi)
	}
	if len(p.Fields) == 0 {
		return nil
	}
	return &p
}

// add narrows f's range by [lo, hi].
func (p *Prune) add(f string, lo, hi bsoncore.Value) {
	i := slices.IndexFunc(p.Fields, func(r PruneRange) bool { return r.Field == f })
	if i < 0 {
		p.Fields = append(p.Fields, PruneRange{Field: f})
		i = len(p.Fields) - 1
	}
	r := &p.Fields[i]
	narrow(&r.Lo, &r.Hi, lo, hi)
}

// narrow narrows the range [*lo, *hi] by [l, h]; an absent bound (Type
// 0) bounds nothing.
func narrow(lo, hi *bsoncore.Value, l, h bsoncore.Value) {
	if l.Type != 0 && (lo.Type == 0 || bsonutil.Compare(l, *lo) > 0) {
		*lo = l
	}
	if h.Type != 0 && (hi.Type == 0 || bsonutil.Compare(h, *hi) < 0) {
		*hi = h
	}
}

// comparisonBounds are the numeric bounds one predicate on a field puts
// on the values that match it (either absent when it puts none).
func comparisonBounds(v bsoncore.Value) (lo, hi bsoncore.Value) {
	if pruneNumber(v) {
		return v, v // {f: 5}
	}
	ops, ok := match.IsOperatorDoc(v)
	if !ok {
		return
	}
	elems, _ := ops.Elements()
	none := bsoncore.Value{}
	for _, op := range elems {
		x := op.Value()
		switch op.Key() {
		case "$eq":
			if pruneNumber(x) {
				narrow(&lo, &hi, x, x)
			}
		case "$gt", "$gte":
			if pruneNumber(x) {
				narrow(&lo, &hi, x, none)
			}
		case "$lt", "$lte":
			if pruneNumber(x) {
				narrow(&lo, &hi, none, x)
			}
		case "$in":
			if l, h, ok := inBounds(x); ok {
				narrow(&lo, &hi, l, h)
			}
		}
	}
	return lo, hi
}

// inBounds are the least and greatest of an $in list of numbers; not ok
// when the list is empty or holds anything else (a null, a regex, an
// array), which matches other than numbers.
func inBounds(v bsoncore.Value) (lo, hi bsoncore.Value, ok bool) {
	arr, isArr := v.ArrayOK()
	if !isArr {
		return lo, hi, false
	}
	vals, err := arr.Values()
	if err != nil || len(vals) == 0 {
		return lo, hi, false
	}
	for _, x := range vals {
		if !pruneNumber(x) {
			return lo, hi, false
		}
		if lo.Type == 0 || bsonutil.Compare(x, lo) < 0 {
			lo = x
		}
		if hi.Type == 0 || bsonutil.Compare(x, hi) > 0 {
			hi = x
		}
	}
	return lo, hi, true
}

// pruneNumber reports whether v is a number a bucket's summaries can be
// compared with: an int32, an int64 or a finite double (the types the
// summaries hold, bucket.IsAggregatable).
func pruneNumber(v bsoncore.Value) bool {
	switch v.Type {
	case bsoncore.TypeInt32, bsoncore.TypeInt64:
		return true
	case bsoncore.TypeDouble:
		f := v.Double()
		return !math.IsNaN(f) && !math.IsInf(f, 0)
	}
	return false
}

// BucketFilters are the upstream conjuncts of p on bucket documents, one
// per field: {$or: [{mixed.f: true}, {summed.f: {$exists: false}},
// {min.f: {$lte: hi}, max.f: {$gte: lo}}]}.
func (p *Prune) BucketFilters() []bsoncore.Document {
	if p.Empty() {
		return nil
	}
	out := make([]bsoncore.Document, 0, len(p.Fields))
	for _, r := range p.Fields {
		idx, d := bsoncore.AppendDocumentStart(nil)
		aidx, a := bsoncore.AppendArrayElementStart(d, "$or")
		a = bsoncore.AppendDocumentElement(a, "0", bsoncore.NewDocumentBuilder().AppendBoolean(bucket.FieldMixed+"."+r.Field, true).Build())
		exists := bsoncore.NewDocumentBuilder().AppendBoolean("$exists", false).Build()
		a = bsoncore.AppendDocumentElement(a, "1", bsoncore.NewDocumentBuilder().AppendDocument(bucket.FieldSummed+"."+r.Field, exists).Build())
		ridx, rd := bsoncore.AppendDocumentElementStart(a, "2")
		if r.Hi.Type != 0 {
			rd = bsoncore.AppendDocumentElement(rd, bucket.FieldMin+"."+r.Field, bsoncore.NewDocumentBuilder().AppendValue("$lte", r.Hi).Build())
		}
		if r.Lo.Type != 0 {
			rd = bsoncore.AppendDocumentElement(rd, bucket.FieldMax+"."+r.Field, bsoncore.NewDocumentBuilder().AppendValue("$gte", r.Lo).Build())
		}
		a, _ = bsoncore.AppendDocumentEnd(rd, ridx)
		d, _ = bsoncore.AppendArrayEnd(a, aidx)
		d, _ = bsoncore.AppendDocumentEnd(d, idx)
		out = append(out, d)
	}
	return out
}

// MayMatch reports whether bucket b may hold an event that p's
// comparisons match: false only when b's summaries of a field cover all
// its events and miss the field's range. A document without summaries
// (a staged one) may always match.
func (p *Prune) MayMatch(b bsoncore.Document) bool {
	if p.Empty() {
		return true
	}
	for _, r := range p.Fields {
		if summed, _ := b.Lookup(bucket.FieldSummed, r.Field).BooleanOK(); !summed {
			continue
		}
		if mixed, _ := b.Lookup(bucket.FieldMixed, r.Field).BooleanOK(); mixed {
			continue
		}
		lo, hasMin := lookupNumber(b, bucket.FieldMin, r.Field)
		hi, hasMax := lookupNumber(b, bucket.FieldMax, r.Field)
		if !hasMin || !hasMax {
			return false // no event holds a number there
		}
		if r.Hi.Type != 0 && bsonutil.Compare(lo, r.Hi) > 0 {
			return false
		}
		if r.Lo.Type != 0 && bsonutil.Compare(hi, r.Lo) < 0 {
			return false
		}
	}
	return true
}

func lookupNumber(b bsoncore.Document, sub, field string) (bsoncore.Value, bool) {
	v, err := b.LookupErr(sub, field)
	if err != nil || !pruneNumber(v) {
		return v, false
	}
	return v, true
}
