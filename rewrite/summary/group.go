package summary

import (
	"sort"
	"strings"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

func (p *Aggregation) parseGroup(v bsoncore.Value) (summaryGroup, bool) {
	var g summaryGroup
	elems, ok := docElems(v)
	if !ok || len(elems) < 2 || elems[0].Key() != "_id" {
		return g, false
	}
	if g.keys, ok = p.parseGroupID(elems[0].Value()); !ok {
		return g, false
	}
	g.accs, ok = p.parseAccs(elems[1:])
	return g, ok
}

// parseAccs parses the output fields of a $group or $bucket.
func (p *Aggregation) parseAccs(elems []bsoncore.Element) ([]summaryAcc, bool) {
	accs := make([]summaryAcc, 0, len(elems))
	seen := map[string]bool{}
	for _, e := range elems {
		out := e.Key()
		if !plainName(out) || out == "_id" || seen[out] {
			return nil, false
		}
		seen[out] = true
		acc, ok := p.parseAcc(out, e.Value())
		if !ok {
			return nil, false
		}
		accs = append(accs, acc)
	}
	return accs, true
}

// plainName: an output or _id part name that is not a path or operator.
func plainName(s string) bool {
	return s != "" && !strings.HasPrefix(s, "$") && !strings.Contains(s, ".")
}

// parseBucket accepts {groupBy: "$<timeField>", boundaries: [dates on
// window edges], default?: <constant outside them>, output?: {...}}: every
// bucket then falls in one range (or none), as a whole. Without output,
// MongoDB outputs {count: {$sum: 1}}.
func (p *Aggregation) parseBucket(v bsoncore.Value) (summaryGroup, bool) {
	var g summaryGroup
	elems, ok := docElems(v)
	if !ok {
		return g, false
	}
	var r bucketRanges
	sawGroupBy, sawOutput := false, false
	for _, e := range elems {
		switch e.Key() {
		case "groupBy":
			s, isString := e.Value().StringValueOK()
			sawGroupBy = isString && s == "$"+p.rule.TimeField
		case "boundaries":
			if r.edges, ok = p.bucketEdges(e.Value()); !ok {
				return g, false
			}
		case "default":
			r.def = e.Value()
		case "output":
			sawOutput = true
			out, ok := docElems(e.Value())
			if !ok {
				return g, false
			}
			if g.accs, ok = p.parseAccs(out); !ok {
				return g, false
			}
		default:
			return g, false
		}
	}
	if !sawGroupBy || r.edges == nil || (r.def.Type != 0 && !r.defaultOutside()) {
		return g, false
	}
	if !sawOutput {
		g.accs = []summaryAcc{{out: "count", kind: accCount, one: bsoncore.TypeInt32}}
	}
	g.keys = []summaryKey{{kind: keyBucket, bdoc: r}}
	return g, true
}

// bucketEdges accepts at least two ascending dates, each a window edge.
func (p *Aggregation) bucketEdges(v bsoncore.Value) ([]int64, bool) {
	arr, ok := v.ArrayOK()
	if !ok {
		return nil, false
	}
	vals, err := arr.Values()
	if err != nil || len(vals) < 2 {
		return nil, false
	}
	edges := make([]int64, 0, len(vals))
	for i, x := range vals {
		ms, ok := x.DateTimeOK()
		if !ok || floorMod(ms, p.span) != 0 || (i > 0 && ms <= edges[i-1]) {
			return nil, false
		}
		edges = append(edges, ms)
	}
	return edges, true
}

// defaultOutside: the default is a constant that MongoDB accepts, one
// that is not a date inside the boundaries (an error there) nor an
// expression or field path (not a constant _id).
func (r bucketRanges) defaultOutside() bool {
	switch r.def.Type {
	case bsoncore.TypeDateTime:
		ms := r.def.DateTime()
		return ms < r.edges[0] || ms >= r.edges[len(r.edges)-1]
	case bsoncore.TypeString:
		return !strings.HasPrefix(r.def.StringValue(), "$")
	case bsoncore.TypeNull, bsoncore.TypeInt32, bsoncore.TypeInt64, bsoncore.TypeDouble, bsoncore.TypeBoolean:
		return true
	}
	return false
}

// rangeOf is the _id of the range holding a bucket that starts at start
// (the ranges are unions of whole windows), or false when none does.
func (r bucketRanges) rangeOf(start int64) (bsoncore.Value, bool) {
	i := sort.Search(len(r.edges), func(i int) bool { return r.edges[i] > start })
	if i == 0 || i == len(r.edges) {
		return r.def, r.def.Type != 0
	}
	return bsoncore.Value{Type: bsoncore.TypeDateTime, Data: bsoncore.AppendDateTime(nil, r.edges[i-1])}, true
}

// parseGroupID accepts null, "$<metaField>", {$dateTrunc: ...}, or a
// document of named "$<metaField>" and $dateTrunc parts.
func (p *Aggregation) parseGroupID(v bsoncore.Value) ([]summaryKey, bool) {
	if v.Type == bsoncore.TypeNull {
		return []summaryKey{{kind: keyNull}}, true
	}
	if k, ok := p.parseKeyPart(v); ok {
		return []summaryKey{k}, true
	}
	elems, ok := docElems(v)
	if !ok {
		return nil, false
	}
	keys := make([]summaryKey, 0, len(elems))
	for _, e := range elems {
		name := e.Key()
		if !plainName(name) {
			return nil, false
		}
		k, ok := p.parseKeyPart(e.Value())
		if !ok {
			return nil, false
		}
		k.name = name
		keys = append(keys, k)
	}
	return keys, true
}

func (p *Aggregation) parseKeyPart(v bsoncore.Value) (summaryKey, bool) {
	if s, ok := v.StringValueOK(); ok {
		return summaryKey{kind: keyMeta}, p.rule.MetaField != "" && s == "$"+p.rule.MetaField
	}
	e, ok := singleElem(v)
	if !ok || e.Key() != "$dateTrunc" {
		return summaryKey{}, false
	}
	dt, ok := parseDateTrunc(e.Value(), p.rule.TimeField)
	if !ok || !dt.wholeBuckets(p.span) {
		return summaryKey{}, false
	}
	return summaryKey{kind: keyTrunc, trunc: dt}, true
}

func (p *Aggregation) parseAcc(out string, v bsoncore.Value) (summaryAcc, bool) {
	acc := summaryAcc{out: out}
	e, ok := singleElem(v)
	if !ok {
		return acc, false
	}
	op, arg := e.Key(), e.Value()
	switch op {
	case "$count":
		ad, ok := arg.DocumentOK()
		if !ok || len(ad) != 5 {
			return acc, false
		}
		acc.kind, acc.one = accCount, bsoncore.TypeInt32
		return acc, true
	case "$sum":
		if n, ok := arg.AsFloat64OK(); ok {
			acc.kind, acc.one = accCount, arg.Type
			return acc, n == 1 && arg.Type != bsoncore.TypeDecimal128
		}
		acc.kind = accSum
		acc.field, ok = p.fieldRef(arg, false)
		return acc, ok
	case "$avg":
		// Answered from sum and counts; decimals are never summed (the
		// insert path takes only int, long and double aggregates).
		acc.kind = accAvg
		acc.field, ok = p.fieldRef(arg, false)
		return acc, ok
	case "$min", "$max":
		acc.kind = accMin
		if op == "$max" {
			acc.kind = accMax
		}
		acc.field, ok = p.fieldRef(arg, true)
		return acc, ok
	}
	return acc, false
}

// fieldRef accepts "$<aggregate field>" (undotted, as the bucket keeps
// it under sum/min/max), and "$<timeField>" when withTime (min/max keep it).
func (p *Aggregation) fieldRef(v bsoncore.Value, withTime bool) (string, bool) {
	s, ok := v.StringValueOK()
	if !ok || !strings.HasPrefix(s, "$") || strings.HasPrefix(s, "$$") {
		return "", false
	}
	f := s[1:]
	if strings.Contains(f, ".") {
		return "", false
	}
	if withTime && f == p.rule.TimeField {
		return f, true
	}
	for _, a := range p.rule.Aggregates {
		if a == f {
			return f, true
		}
	}
	return "", false
}
