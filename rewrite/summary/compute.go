package summary

import (
	"sort"

	"math"
	"math/big"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/cursor"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/read"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// Feed learns one reply to Command (or to a getMore) and returns the
// getMore to send next, or nil when the buckets are all read. An upstream
// error reply comes back as a *mongoerr.Error with the upstream's code.
func (p *SummaryPlan) Feed(reply []byte) ([]byte, error) {
	docs, id, err := cursor.Docs(reply)
	if err != nil {
		return nil, err
	}
	for _, d := range docs {
		b, err := p.readBucket(d)
		if err != nil {
			return nil, err
		}
		p.buckets = append(p.buckets, b)
	}
	if id == 0 {
		return nil, nil
	}
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendInt64Element(d, "getMore", id)
	d = bsoncore.AppendStringElement(d, "collection", p.rule.BucketCollection)
	d = bsoncore.AppendStringElement(d, "$db", p.rule.DB)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d, nil
}

func (p *SummaryPlan) readBucket(d bsoncore.Document) (bucketSummary, error) {
	var b bucketSummary
	st, ok := bsonutil.Lookup(d, bucket.FieldStart)
	if !ok || st.Type != bsoncore.TypeDateTime {
		return b, mongoerr.Errorf(mongoerr.InternalError, "tsproxy rule %s: a bucket in %s has no date \"start\"", p.rule.Namespace, p.rule.BucketCollection)
	}
	b.start = st.DateTime()
	b.count = rawCount(d)
	b.meta = bsoncore.Value{Type: bsoncore.TypeNull}
	if m, ok := bsonutil.Lookup(d, bucket.FieldMeta); ok {
		b.meta = copyValue(m)
	}
	b.min = subDoc(d, bucket.FieldMin)
	b.max = subDoc(d, bucket.FieldMax)
	b.sum = subDoc(d, bucket.FieldSum)
	b.counted = -1
	if v, ok := bsonutil.Lookup(d, bucket.FieldCounted); ok {
		if n, ok := read.WholeNumber(v); ok {
			b.counted = n
		}
	}
	b.counts = subDoc(d, bucket.FieldCounts)
	b.lowBit = subDoc(d, bucket.FieldLowBit)
	return b, nil
}

// Result computes the answer. ok is false when the summaries found
// cannot give the exact answer (a null meta under a named _id part, sums
// whose type the buckets do not pin down, group keys equal across types):
// the proxy then plans the read with PlanRead instead.
func (p *SummaryPlan) Result() (reply bsoncore.Document, ok bool, err error) {
	groups, ok, err := p.groups()
	if err != nil || !ok {
		return nil, false, err
	}
	docs := make([]bsoncore.Document, 0, len(groups))
	for _, g := range groups {
		d, ok := p.output(g)
		if !ok {
			return nil, false, nil
		}
		docs = append(docs, d)
	}
	docs = p.applyAfter(docs)
	return p.reply(docs)
}

// groups folds the buckets into groups, sorted by _id. The error is
// MongoDB's for events outside a $bucket's boundaries without a default.
func (p *SummaryPlan) groups() ([]*groupState, bool, error) {
	byKey := map[string]*groupState{}
	var list []*groupState
	for i := range p.buckets {
		b := &p.buckets[i]
		if b.count <= 0 {
			continue // an emptied bucket holds no event
		}
		if k := p.group.keys[0]; k.kind == keyBucket {
			if _, ok := k.bdoc.rangeOf(b.start); !ok {
				return nil, false, mongoerr.Errorf(mongoerr.NoBucketBranch, "PlanExecutor error during aggregation :: caused by :: $switch could not find a matching branch for an input, and no default was specified.")
			}
		}
		id, ok := p.groupID(b)
		if !ok {
			return nil, false, nil
		}
		k := string(rune(id.Type)) + string(id.Data)
		g := byKey[k]
		if g == nil {
			g = p.newGroup(id)
			byKey[k] = g
			list = append(list, g)
		}
		if !p.addBucket(g, b) {
			return nil, false, nil
		}
	}
	sort.SliceStable(list, func(i, j int) bool { return bsonutil.Compare(list[i].id, list[j].id) < 0 })
	for i := 1; i < len(list); i++ {
		// Keys equal in MongoDB's order but stored differently (1 and
		// 1.0) are one group there, under whichever came first.
		if bsonutil.Compare(list[i-1].id, list[i].id) == 0 {
			return nil, false, nil
		}
	}
	return list, true, nil
}

func (p *SummaryPlan) newGroup(id bsoncore.Value) *groupState {
	g := &groupState{id: id, sums: make([]sumState, len(p.group.accs)), ext: make([]bsoncore.Value, len(p.group.accs))}
	for i := range g.sums {
		g.sums[i].low = bucket.LowBitZero
	}
	return g
}

func (p *SummaryPlan) groupID(b *bucketSummary) (bsoncore.Value, bool) {
	part := func(k summaryKey) (bsoncore.Value, bool) {
		switch k.kind {
		case keyMeta:
			return b.meta, true
		case keyBucket:
			return k.bdoc.rangeOf(b.start)
		case keyTrunc:
			w := k.trunc.window(b.start)
			if k.trunc.window(b.start+p.span-1) != w {
				return bsoncore.Value{}, false
			}
			return bsoncore.Value{Type: bsoncore.TypeDateTime, Data: bsoncore.AppendDateTime(nil, w)}, true
		}
		return bsoncore.Value{Type: bsoncore.TypeNull}, true
	}
	if len(p.group.keys) == 1 && p.group.keys[0].name == "" {
		return part(p.group.keys[0])
	}
	bld := bsoncore.NewDocumentBuilder()
	for _, k := range p.group.keys {
		// A null meta stands for both a missing and a null metaField,
		// which a named _id part tells apart (missing leaves it out).
		if k.kind == keyMeta && b.meta.Type == bsoncore.TypeNull {
			return bsoncore.Value{}, false
		}
		v, ok := part(k)
		if !ok {
			return bsoncore.Value{}, false
		}
		bld.AppendValue(k.name, v)
	}
	return bsoncore.Value{Type: bsoncore.TypeEmbeddedDocument, Data: bld.Build()}, true
}

func (p *SummaryPlan) addBucket(g *groupState, b *bucketSummary) bool {
	g.count += b.count
	for i, a := range p.group.accs {
		switch a.kind {
		case accSum, accAvg:
			if !g.sums[i].add(b, a.field) {
				return false
			}
		case accMin, accMax:
			src := b.min
			if a.kind == accMax {
				src = b.max
			}
			v, ok := bsonutil.Lookup(src, a.field)
			if !ok || v.Type == bsoncore.TypeNull {
				continue
			}
			c := bsonutil.Compare(v, g.ext[i])
			if g.ext[i].Type == 0 || (a.kind == accMin && c < 0) || (a.kind == accMax && c > 0) {
				g.ext[i] = v
			}
		}
	}
	return true
}

func (p *SummaryPlan) output(g *groupState) (bsoncore.Document, bool) {
	b := bsoncore.NewDocumentBuilder().AppendValue("_id", g.id)
	for i, a := range p.group.accs {
		switch a.kind {
		case accCount:
			b.AppendValue(a.out, countValue(g.count, a.one))
		case accSum:
			v, ok := g.sums[i].value()
			if !ok {
				return nil, false
			}
			b.AppendValue(a.out, v)
		case accAvg:
			v, ok := g.sums[i].avg()
			if !ok {
				return nil, false
			}
			b.AppendValue(a.out, v)
		default:
			if g.ext[i].Type == 0 {
				b.AppendNull(a.out)
			} else {
				b.AppendValue(a.out, g.ext[i])
			}
		}
	}
	return b.Build(), true
}

// applyAfter runs the $sort, $skip and $limit stages after the $group.
func (p *SummaryPlan) applyAfter(docs []bsoncore.Document) []bsoncore.Document {
	for _, st := range p.after {
		switch st.name {
		case "$sort":
			sort.SliceStable(docs, func(i, j int) bool { return lessByKeys(docs[i], docs[j], st.sort) })
		case "$skip":
			if st.n >= int64(len(docs)) {
				docs = docs[:0]
			} else {
				docs = docs[st.n:]
			}
		case "$limit":
			if st.n < int64(len(docs)) {
				docs = docs[:st.n]
			}
		}
	}
	return docs
}

func (p *SummaryPlan) reply(docs []bsoncore.Document) (bsoncore.Document, bool, error) {
	size := 0
	for _, d := range docs {
		size += len(d)
	}
	if size > maxSummaryReply {
		return nil, true, mongoerr.Errorf(mongoerr.BadValue, "tsproxy rule %s: the aggregate answered from bucket summaries has %d groups (%d bytes), more than one reply holds; narrow the $match or add a $limit", p.rule.Namespace, len(docs), size)
	}
	arr := bsoncore.NewArrayBuilder()
	for _, d := range docs {
		arr.AppendDocument(d)
	}
	cur := bsoncore.NewDocumentBuilder().
		AppendArray("firstBatch", arr.Build()).
		AppendInt64("id", 0).
		AppendString("ns", p.rule.Namespace).
		Build()
	return bsoncore.NewDocumentBuilder().AppendDocument("cursor", cur).AppendDouble("ok", 1).Build(), true, nil
}

// maxSummaryReply bounds the reply: the groups are answered in one batch.
const maxSummaryReply = 16 << 20

// bucketSummary is what the summary find reads of one bucket.
type bucketSummary struct {
	meta          bsoncore.Value
	start, count  int64
	min, max, sum bsoncore.Document
	// counted equals count when counts and lowBit cover every event (see
	// BucketCounted); -1 when the bucket predates them.
	counted        int64
	counts, lowBit bsoncore.Document
}

// complete reports whether counts and lowBit cover every event.
func (b *bucketSummary) complete() bool { return b.counted == b.count }

func rawCount(d bsoncore.Document) int64 {
	v, ok := bsonutil.Lookup(d, bucket.FieldCount)
	if !ok {
		return 0
	}
	n, _ := read.WholeNumber(v)
	return n
}

func subDoc(d bsoncore.Document, key string) bsoncore.Document {
	v, ok := bsonutil.Lookup(d, key)
	if !ok || v.Type != bsoncore.TypeEmbeddedDocument {
		return nil
	}
	return append(bsoncore.Document(nil), v.Document()...)
}

func copyValue(v bsoncore.Value) bsoncore.Value {
	return bsoncore.Value{Type: v.Type, Data: append([]byte(nil), v.Data...)}
}

// groupState accumulates one group over its buckets.
type groupState struct {
	id    bsoncore.Value
	count int64
	sums  []sumState       // per accumulator (used by accSum)
	ext   []bsoncore.Value // per accumulator (used by accMin, accMax)
}

// sumState adds bucket sums as MongoDB's $sum adds events: integers
// exactly, doubles with compensation, and the result's type from the
// widest input type. It also gathers what proves a sum of doubles exact
// (see exact) and what $avg divides by.
type sumState struct {
	ints            big.Int
	dbl, comp       float64
	hasLong, hasDbl bool
	longSeen        bool // an int64 event is certain

	n         int64   // values summed (when nKnown)
	nUnknown  bool    // a bucket without counts for every event
	low       int32   // lowest set bit of any value summed
	lowUnsure bool    // a bucket whose values' low bit is not known
	bound     float64 // no partial sum of the values exceeds it in magnitude
}

func (s *sumState) add(b *bucketSummary, field string) bool {
	v, ok := bsonutil.Lookup(b.sum, field)
	if !ok {
		// No event of the bucket has the field, if counts says so too.
		_, counted := bsonutil.Lookup(b.counts, field)
		s.nUnknown = s.nUnknown || !b.complete() || counted
		return true
	}
	if !sumTrusted(b, field, v.Type) {
		return false
	}
	s.addCounts(b, field, v.Type)
	switch v.Type {
	case bsoncore.TypeInt32:
		s.ints.Add(&s.ints, big.NewInt(int64(v.Int32())))
	case bsoncore.TypeInt64:
		s.ints.Add(&s.ints, big.NewInt(v.Int64()))
		s.hasLong = true
		for _, d := range []bsoncore.Document{b.min, b.max} {
			if x, ok := bsonutil.Lookup(d, field); ok && x.Type == bsoncore.TypeInt64 {
				s.longSeen = true
			}
		}
	case bsoncore.TypeDouble:
		s.hasDbl = true
		s.addDouble(v.Double())
	default:
		return false
	}
	return true
}

// sumTrusted reports whether a bucket's integer sum cannot have wrapped:
// FerretDB's $inc wraps an int32 (and int64) sum on overflow instead of
// widening it (verified: 2e9 + 2e9 stored as -294967296). With every
// event's value within [min, max] and at most count of them, no partial
// sum leaves ±max(|min|, |max|)·count, so a bound inside the type's range
// proves the stored sum exact. A double sum may have been an int32 sum
// that wrapped before a double event joined it: it gets the int32 bound.
func sumTrusted(b *bucketSummary, field string, t bsoncore.Type) bool {
	limit := 0.0
	switch t {
	case bsoncore.TypeInt32, bsoncore.TypeDouble:
		limit = math.MaxInt32
	case bsoncore.TypeInt64:
		limit = math.MaxInt64 / 2 // float rounding margin
	default:
		return true
	}
	bound := 0.0
	for _, d := range []bsoncore.Document{b.min, b.max} {
		x, ok := bsonutil.Lookup(d, field)
		if !ok {
			return false
		}
		f, ok := x.AsFloat64OK()
		if !ok {
			return false
		}
		bound = math.Max(bound, math.Abs(f))
	}
	return bound*float64(b.count) <= limit
}

// addCounts learns the bucket's count of values, their lowest set bit and
// a bound of their magnitude. Without counts, integers still have a low
// bit of at least 2^0; doubles have none known.
func (s *sumState) addCounts(b *bucketSummary, field string, t bsoncore.Type) {
	n := b.count
	nv, okN := bsonutil.Lookup(b.counts, field)
	lv, okL := bsonutil.Lookup(b.lowBit, field)
	if b.complete() && okN && okL {
		n, _ = read.WholeNumber(nv)
		low, _ := read.WholeNumber(lv)
		s.low = min(s.low, int32(max(min(low, bucket.LowBitZero), bucket.LowBitSpecial)))
	} else {
		s.nUnknown = true
		if t == bsoncore.TypeDouble {
			s.lowUnsure = true
		} else {
			s.low = min(s.low, 0)
		}
	}
	s.n += n
	s.bound += float64(n) * maxAbs(b, field)
}

// maxAbs is the largest magnitude of a bucket's values of field (+Inf
// when min or max is missing or not a number).
func maxAbs(b *bucketSummary, field string) float64 {
	m := 0.0
	for _, d := range []bsoncore.Document{b.min, b.max} {
		x, ok := bsonutil.Lookup(d, field)
		if !ok {
			return math.Inf(1)
		}
		f, ok := x.AsFloat64OK()
		if !ok {
			return math.Inf(1)
		}
		m = math.Max(m, math.Abs(f))
	}
	return m
}

// exact reports whether the values' sum is the same in every order of
// addition, in plain doubles ($inc of the bucket sums) and in MongoDB's
// double-double summation alike: every value is a multiple of 2^low and
// no partial sum reaches 2^(low+53), so every partial sum is a double and
// no addition rounds. MongoDB returns the double-double's high part,
// which depends on the order of the events otherwise (and bucket sums
// kept by $inc lose the low parts), so a sum not proven exact declines.
func (s *sumState) exact() bool {
	if s.lowUnsure {
		return false
	}
	if s.low >= bucket.LowBitZero {
		return true // only zeros
	}
	// The margin covers the rounding of bound itself.
	return s.bound*(1+1e-9) < math.Ldexp(1, int(s.low)+53)
}

// avg is MongoDB's $avg: the double-double sum (here exact) divided by the
// number of numeric values, a double; null when there were none.
func (s *sumState) avg() (bsoncore.Value, bool) {
	if s.nUnknown {
		return bsoncore.Value{}, false
	}
	if s.n == 0 {
		return bsoncore.Value{Type: bsoncore.TypeNull}, true
	}
	if !s.exact() {
		return bsoncore.Value{}, false
	}
	return doubleValue(s.total() / float64(s.n)), true
}

// total is the exact sum as a double (exact() holds).
func (s *sumState) total() float64 {
	f, _ := new(big.Float).SetInt(&s.ints).Float64()
	return f + (s.dbl + s.comp)
}

// addDouble is Neumaier's compensated summation.
func (s *sumState) addDouble(x float64) {
	t := s.dbl + x
	if math.Abs(s.dbl) >= math.Abs(x) {
		s.comp += (s.dbl - t) + x
	} else {
		s.comp += (x - t) + s.dbl
	}
	s.dbl = t
}

// value is the $sum MongoDB returns: a double when any input was a double
// or the integer total leaves int64; an int64 when any input was; else an
// int32 when the total fits. A bucket's int64 sum may come from int32
// events that overflowed an int32 partial sum, so an int64 sum with a
// total that fits an int32 is only answered when an int64 event is
// certain (a bucket's min or max is one).
func (s *sumState) value() (bsoncore.Value, bool) {
	if s.hasDbl {
		if !s.exact() {
			return bsoncore.Value{}, false
		}
		return doubleValue(s.total()), true
	}
	if !s.ints.IsInt64() {
		f, _ := new(big.Float).SetInt(&s.ints).Float64()
		return doubleValue(f), true
	}
	n := s.ints.Int64()
	fits32 := n >= math.MinInt32 && n <= math.MaxInt32
	switch {
	case s.hasLong && fits32 && !s.longSeen:
		return bsoncore.Value{}, false
	case s.hasLong || !fits32:
		return bsonutil.Int64Value(n), true
	}
	return bsoncore.Value{Type: bsoncore.TypeInt32, Data: bsoncore.AppendInt32(nil, int32(n))}, true
}

func doubleValue(f float64) bsoncore.Value {
	return bsoncore.Value{Type: bsoncore.TypeDouble, Data: bsoncore.AppendDouble(nil, f)}
}

// countValue is $sum of a constant 1 (or $count) over n events.
func countValue(n int64, one bsoncore.Type) bsoncore.Value {
	switch {
	case one == bsoncore.TypeDouble:
		return doubleValue(float64(n))
	case one == bsoncore.TypeInt64 || n > math.MaxInt32:
		return bsonutil.Int64Value(n)
	}
	return bsoncore.Value{Type: bsoncore.TypeInt32, Data: bsoncore.AppendInt32(nil, int32(n))}
}

func lessByKeys(a, b bsoncore.Document, keys []summarySortKey) bool {
	for _, k := range keys {
		c := bsonutil.Compare(pathValue(a, k.path), pathValue(b, k.path))
		if k.desc {
			c = -c
		}
		if c != 0 {
			return c < 0
		}
	}
	return false
}

// pathValue is the value at path, null when missing (as $sort orders it).
func pathValue(d bsoncore.Document, path []string) bsoncore.Value {
	v, err := d.LookupErr(path...)
	if err != nil {
		return bsoncore.Value{Type: bsoncore.TypeNull}
	}
	return v
}
