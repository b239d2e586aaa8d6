package summary

import (
	"sort"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/cursor"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// Feed learns one reply to Command (or to a getMore) and returns the
// getMore to send next, or nil when the buckets are all read. An upstream
// error reply comes back as a *mongoerr.Error with the upstream's code.
func (p *Aggregation) Feed(reply []byte) ([]byte, error) {
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

func (p *Aggregation) readBucket(d bsoncore.Document) (bucketSummary, error) {
	var b bucketSummary
	st, ok := bsonutil.Lookup(d, bucket.FieldStart)
	if !ok || st.Type != bsoncore.TypeDateTime {
		return b, mongoerr.Errorf(mongoerr.InternalError, "tsproxy rule %s: a bucket in %s has no date \"start\"", p.rule.Namespace, p.rule.BucketCollection)
	}
	b.start = st.DateTime()
	b.count = rawCount(d)
	b.meta = bsoncore.Value{Type: bsoncore.TypeNull}
	if m, ok := bsonutil.Lookup(d, bucket.FieldMeta); ok {
		b.meta = bucket.UserMeta(copyValue(m))
	}
	b.min = subDoc(d, bucket.FieldMin)
	b.max = subDoc(d, bucket.FieldMax)
	b.sum = subDoc(d, bucket.FieldSum)
	b.counted = -1
	if v, ok := bsonutil.Lookup(d, bucket.FieldCounted); ok {
		if n, ok := bsonutil.WholeNumber(v); ok {
			b.counted = n
		}
	}
	b.counts = subDoc(d, bucket.FieldCounts)
	b.lowBit = subDoc(d, bucket.FieldLowBit)
	b.mixed = subDoc(d, bucket.FieldMixed)
	b.summed = subDoc(d, bucket.FieldSummed)
	return b, nil
}

// Result computes the answer. ok is false when the summaries found
// cannot give the exact answer (a null meta under a named _id part, sums
// whose type the buckets do not pin down, group keys equal across types):
// the proxy then plans the read with PlanRead instead.
func (p *Aggregation) Result() (reply bsoncore.Document, ok bool, err error) {
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
func (p *Aggregation) groups() ([]*groupState, bool, error) {
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

func (p *Aggregation) newGroup(id bsoncore.Value) *groupState {
	g := &groupState{id: id, sums: make([]sumState, len(p.group.accs)), ext: make([]bsoncore.Value, len(p.group.accs))}
	for i := range g.sums {
		g.sums[i].low = bucket.LowBitZero
	}
	return g
}

func (p *Aggregation) groupID(b *bucketSummary) (bsoncore.Value, bool) {
	part := func(k summaryKey) (bsoncore.Value, bool) {
		switch k.kind {
		case keyMeta:
			return b.meta, true
		case keyBucket:
			return k.bdoc.rangeOf(b.start)
		case keyTrunc:
			w, ok := k.trunc.window(b.start)
			if w2, ok2 := k.trunc.window(b.start + p.span - 1); !ok || !ok2 || w2 != w {
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

func (p *Aggregation) addBucket(g *groupState, b *bucketSummary) bool {
	g.count += b.count
	for i, a := range p.group.accs {
		if _, mixed := bsonutil.Lookup(b.mixed, a.field); mixed && a.field != "" {
			return false // the summaries leave the field's non-numbers out
		}
		if a.field != "" && !p.summedWhole(b, a.field) {
			return false
		}
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

// summedWhole reports whether b's summaries of field cover all its
// events (bucket.FieldSummed): a bucket that names the rule's aggregates
// must name the field; one from before they were named is trusted for a
// config rule's, whose aggregates were there from its start, and not
// for a created collection's, which get theirs from an index made later.
func (p *Aggregation) summedWhole(b *bucketSummary, field string) bool {
	if b.summed == nil {
		return p.rule.Declared == nil
	}
	v, ok := bsonutil.Lookup(b.summed, field)
	return ok && v.Type == bsoncore.TypeBoolean && v.Boolean()
}

func (p *Aggregation) output(g *groupState) (bsoncore.Document, bool) {
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
func (p *Aggregation) applyAfter(docs []bsoncore.Document) []bsoncore.Document {
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

func (p *Aggregation) reply(docs []bsoncore.Document) (bsoncore.Document, bool, error) {
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
	// mixed names the aggregate fields some event holds a non-number in,
	// which the summaries leave out (bucket.FieldMixed).
	mixed bsoncore.Document
	// summed names the fields whose summaries cover every event; nil in
	// buckets from before it was written (bucket.FieldSummed).
	summed bsoncore.Document
}

// complete reports whether counts and lowBit cover every event.
func (b *bucketSummary) complete() bool { return b.counted == b.count }

func rawCount(d bsoncore.Document) int64 {
	v, ok := bsonutil.Lookup(d, bucket.FieldCount)
	if !ok {
		return 0
	}
	n, _ := bsonutil.WholeNumber(v)
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
