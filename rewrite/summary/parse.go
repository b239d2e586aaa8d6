package summary

import (
	"sort"
	"strings"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/query"
	"github.com/tsproxy/tsproxy/rewrite/read"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// SummaryPlan answers one aggregate from bucket summaries. The proxy sends
// Command, feeds every reply to Feed (sending the getMore it returns until
// nil) and then answers with Result; when Result says the summaries are not
// exact for the data found, the proxy plans the read with PlanRead instead.
type SummaryPlan struct {
	Command []byte

	rule      *rules.Rule
	span      int64
	group     summaryGroup
	after     []summaryStage
	buckets   []bucketSummary
	batchSize int64
}

// summaryKeyKind is what one part of the group _id is computed from.
type summaryKeyKind int

const (
	keyTrunc  summaryKeyKind = iota // $dateTrunc of the timeField
	keyMeta                         // "$<metaField>"
	keyNull                         // _id: null, one group
	keyBucket                       // $bucket by the timeField
)

type summaryKey struct {
	name  string // "" when the _id is this part alone
	kind  summaryKeyKind
	trunc dateTrunc
	bdoc  bucketRanges
}

// bucketRanges is a $bucket's boundaries (window edges, ascending) and
// its default _id (Type 0 when there is none).
type bucketRanges struct {
	edges []int64
	def   bsoncore.Value
}

type summaryAccKind int

const (
	accSum summaryAccKind = iota
	accCount
	accMin
	accMax
	accAvg
)

type summaryAcc struct {
	out   string
	kind  summaryAccKind
	field string        // accSum with a field, accAvg, accMin, accMax
	one   bsoncore.Type // accCount: the type of the constant 1 summed
}

type summaryGroup struct {
	keys []summaryKey
	accs []summaryAcc
}

// summaryStage is a $sort, $skip or $limit after the $group.
type summaryStage struct {
	name string
	sort []summarySortKey
	n    int64
}

type summarySortKey struct {
	path []string
	desc bool
}

// PlanSummary returns the plan that answers body from bucket summaries,
// or false when body is not an aggregate of a shape they answer exactly.
func PlanSummary(body []byte, rule *rules.Rule, opts read.ReadOptions) (*SummaryPlan, bool) {
	if rule == nil || (rule.Layout != "" && rule.Layout != rules.LayoutEvents) || rule.SpanMillis() <= 0 {
		return nil, false
	}
	doc := bsoncore.Document(body)
	// Every read passes here: refuse other commands before validating.
	elems, err := doc.Elements()
	if err != nil || len(elems) == 0 || elems[0].Key() != "aggregate" || bsonutil.Validate(doc, 0) != nil {
		return nil, false
	}
	batchSize, ok := summaryOptions(elems[1:])
	if !ok {
		return nil, false
	}
	pv, _ := bsonutil.Lookup(doc, "pipeline")
	stages, ok := summaryStages(pv)
	if !ok || len(stages) == 0 {
		return nil, false
	}
	p := &SummaryPlan{rule: rule, span: rule.SpanMillis(), batchSize: batchSize}
	var filter bsoncore.Document
	if stages[0].Name == "$match" {
		d, ok := stages[0].Value.DocumentOK()
		if !ok {
			return nil, false
		}
		if filter, ok = p.bucketFilter(d); !ok {
			return nil, false
		}
		stages = stages[1:]
	}
	if len(stages) == 0 {
		return nil, false
	}
	switch stages[0].Name {
	case "$group":
		p.group, ok = p.parseGroup(stages[0].Value)
	case "$bucket":
		p.group, ok = p.parseBucket(stages[0].Value)
	default:
		ok = false
	}
	if !ok {
		return nil, false
	}
	if p.after, ok = p.parseAfter(stages[1:]); !ok {
		return nil, false
	}
	p.Command = p.findCommand(filter, bsonutil.Pick(doc, query.Carried))
	return p, true
}

// summaryOptions accepts the aggregate options that do not change the
// answer and returns the cursor batchSize (-1 when not given).
func summaryOptions(elems []bsoncore.Element) (int64, bool) {
	batchSize := int64(-1)
	sawCursor := false
	for _, e := range elems {
		switch k := e.Key(); {
		case k == "pipeline", query.CarriedSet[k]:
		case k == "allowDiskUse":
			if e.Value().Type != bsoncore.TypeBoolean {
				return 0, false
			}
		case k == "cursor":
			sawCursor = true
			cur, ok := e.Value().DocumentOK()
			if !ok {
				return 0, false
			}
			ce, _ := cur.Elements()
			for _, c := range ce {
				n, ok := read.WholeNumber(c.Value())
				if c.Key() != "batchSize" || !ok || n < 0 {
					return 0, false
				}
				batchSize = n
			}
		default: // explain, hint, collation, let...: PlanRead decides
			return 0, false
		}
	}
	return batchSize, sawCursor
}

func summaryStages(pv bsoncore.Value) ([]read.PipelineStage, bool) {
	arr, ok := pv.ArrayOK()
	if !ok {
		return nil, false
	}
	vals, err := arr.Values()
	if err != nil {
		return nil, false
	}
	out := make([]read.PipelineStage, 0, len(vals))
	for _, v := range vals {
		e, ok := singleElem(v)
		if !ok {
			return nil, false
		}
		out = append(out, read.PipelineStage{Name: e.Key(), Value: e.Value(), Doc: v.Document()})
	}
	return out, true
}

// docElems returns the elements of v when it is a valid document with at
// least one.
func docElems(v bsoncore.Value) ([]bsoncore.Element, bool) {
	d, ok := v.DocumentOK()
	if !ok {
		return nil, false
	}
	elems, err := d.Elements()
	return elems, err == nil && len(elems) > 0
}

// singleElem returns the one element of v, a document of one key such as
// {$op: arg}.
func singleElem(v bsoncore.Value) (bsoncore.Element, bool) {
	elems, ok := docElems(v)
	if !ok || len(elems) != 1 {
		return nil, false
	}
	return elems[0], true
}

// bucketFilter translates a $match that selects whole buckets: the
// timeField bounded by $gte and $lt on window edges (a multiple of the
// span), and the metaField equal to, or $in, plain values. Every event of
// a selected bucket matches and no event of another bucket does, so the
// summaries of the selected buckets are exactly the matched events'.
func (p *SummaryPlan) bucketFilter(match bsoncore.Document) (bsoncore.Document, bool) {
	elems, err := match.Elements()
	if err != nil {
		return nil, false
	}
	b := bsoncore.NewDocumentBuilder()
	for _, e := range elems {
		switch e.Key() {
		case p.rule.TimeField:
			d, ok := p.timeRange(e.Value())
			if !ok {
				return nil, false
			}
			b.AppendDocument(bucket.FieldStart, d)
		case p.rule.MetaField:
			if p.rule.MetaField == "" {
				return nil, false
			}
			v, ok := metaPredicate(e.Value())
			if !ok {
				return nil, false
			}
			b.AppendValue(bucket.FieldMeta, v)
		default:
			return nil, false
		}
	}
	return b.Build(), true
}

func (p *SummaryPlan) timeRange(v bsoncore.Value) (bsoncore.Document, bool) {
	elems, ok := docElems(v)
	if !ok {
		return nil, false
	}
	b := bsoncore.NewDocumentBuilder()
	for _, e := range elems {
		ms, ok := e.Value().DateTimeOK()
		if !ok || (e.Key() != "$gte" && e.Key() != "$lt") || floorMod(ms, p.span) != 0 {
			return nil, false
		}
		b.AppendDateTime(e.Key(), ms)
	}
	return b.Build(), true
}

// metaPredicate accepts a plain value, {$eq: v} or {$in: [v...]} with
// scalar values, which match the bucket's meta as they match the event's.
func metaPredicate(v bsoncore.Value) (bsoncore.Value, bool) {
	if plainScalar(v.Type) {
		return v, true
	}
	e, ok := singleElem(v)
	if !ok {
		return v, false
	}
	switch e.Key() {
	case "$eq":
		return v, plainScalar(e.Value().Type)
	case "$in":
		arr, ok := e.Value().ArrayOK()
		if !ok {
			return v, false
		}
		vals, err := arr.Values()
		if err != nil {
			return v, false
		}
		for _, x := range vals {
			if !plainScalar(x.Type) {
				return v, false
			}
		}
		return v, true
	}
	return v, false
}

func plainScalar(t bsoncore.Type) bool {
	switch t {
	case bsoncore.TypeString, bsoncore.TypeInt32, bsoncore.TypeInt64, bsoncore.TypeDouble,
		bsoncore.TypeObjectID, bsoncore.TypeBoolean, bsoncore.TypeDateTime:
		return true
	}
	return false
}

func (p *SummaryPlan) parseGroup(v bsoncore.Value) (summaryGroup, bool) {
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
func (p *SummaryPlan) parseAccs(elems []bsoncore.Element) ([]summaryAcc, bool) {
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
func (p *SummaryPlan) parseBucket(v bsoncore.Value) (summaryGroup, bool) {
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
func (p *SummaryPlan) bucketEdges(v bsoncore.Value) ([]int64, bool) {
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
func (p *SummaryPlan) parseGroupID(v bsoncore.Value) ([]summaryKey, bool) {
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

func (p *SummaryPlan) parseKeyPart(v bsoncore.Value) (summaryKey, bool) {
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

func (p *SummaryPlan) parseAcc(out string, v bsoncore.Value) (summaryAcc, bool) {
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
func (p *SummaryPlan) fieldRef(v bsoncore.Value, withTime bool) (string, bool) {
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

// parseAfter accepts $sort on the output's fields, $skip and $limit.
func (p *SummaryPlan) parseAfter(stages []read.PipelineStage) ([]summaryStage, bool) {
	var out []summaryStage
	for _, st := range stages {
		switch st.Name {
		case "$skip", "$limit":
			n, ok := read.WholeNumber(st.Value)
			if !ok || n < 0 || (st.Name == "$limit" && n == 0) {
				return nil, false
			}
			out = append(out, summaryStage{name: st.Name, n: n})
		case "$sort":
			keys, ok := p.parseSort(st.Value)
			if !ok {
				return nil, false
			}
			out = append(out, summaryStage{name: st.Name, sort: keys})
		default:
			return nil, false
		}
	}
	return out, true
}

func (p *SummaryPlan) parseSort(v bsoncore.Value) ([]summarySortKey, bool) {
	elems, ok := docElems(v)
	if !ok {
		return nil, false
	}
	keys := make([]summarySortKey, 0, len(elems))
	for _, e := range elems {
		dir, ok := e.Value().AsFloat64OK()
		if !ok || (dir != 1 && dir != -1) || e.Value().Type == bsoncore.TypeDecimal128 {
			return nil, false
		}
		path := strings.Split(e.Key(), ".")
		if !p.outputPath(path) {
			return nil, false
		}
		keys = append(keys, summarySortKey{path: path, desc: dir < 0})
	}
	return keys, true
}

// outputPath reports whether path names a field the group outputs.
func (p *SummaryPlan) outputPath(path []string) bool {
	if path[0] == "_id" {
		if len(path) == 1 {
			return true
		}
		for _, k := range p.group.keys {
			if len(path) == 2 && k.name != "" && k.name == path[1] {
				return true
			}
		}
		return false
	}
	if len(path) != 1 {
		return false
	}
	for _, a := range p.group.accs {
		if a.out == path[0] {
			return true
		}
	}
	return false
}

// findCommand reads the summaries of the selected buckets, never their
// events: a plain inclusion projection, which FerretDB supports.
func (p *SummaryPlan) findCommand(filter bsoncore.Document, carried []bsoncore.Element) []byte {
	proj := bsoncore.NewDocumentBuilder().
		AppendInt32(bucket.FieldMeta, 1).
		AppendInt32(bucket.FieldStart, 1).
		AppendInt32(bucket.FieldCount, 1).
		AppendInt32(bucket.FieldMin, 1).
		AppendInt32(bucket.FieldMax, 1).
		AppendInt32(bucket.FieldSum, 1).
		AppendInt32(bucket.FieldCounted, 1).
		AppendInt32(bucket.FieldCounts, 1).
		AppendInt32(bucket.FieldLowBit, 1).
		Build()
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendStringElement(d, "find", p.rule.BucketCollection)
	if filter != nil {
		d = bsoncore.AppendDocumentElement(d, "filter", filter)
	}
	d = bsoncore.AppendDocumentElement(d, "projection", proj)
	d = bsonutil.AppendElems(d, carried)
	d = bsoncore.AppendStringElement(d, "$db", p.rule.DB)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

func floorMod(a, m int64) int64 {
	r := a % m
	if r < 0 {
		r += m
	}
	return r
}
