package fanout

import (
	"math"
	"slices"
	"strings"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/cursor"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/query"
	"github.com/tsproxy/tsproxy/rewrite/read"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// MaxPartitionedReadBytes bounds what a find across partitions collects
// before answering: the partitions' results are held by the proxy.
const MaxPartitionedReadBytes = 64 << 20

// PartitionedFind is a find across partitions.
type PartitionedFind struct {
	// Sub is the find each partition runs: the client's, without skip,
	// limit, batchSize, singleBatch and projection, and limit = skip +
	// limit when limited.
	Sub []byte

	ns     string
	sort   []mergeKey
	proj   *query.Projection
	skip   int64
	limit  int64
	single bool
	first  int64 // first batch size, -1 for as many as fit
	out    []bsoncore.Document
	bytes  int
	begun  bool
}

type mergeKey struct {
	path []string
	desc bool
}

// PlanPartitionedFind plans a find across partitions.
func PlanPartitionedFind(body []byte, rule *rules.Rule) (*PartitionedFind, error) {
	rc, err := query.NewCtx(rule)
	if err != nil {
		return nil, err
	}
	doc := bsoncore.Document(body)
	if err := bsonutil.Validate(doc, 0); err != nil {
		return nil, mongoerr.Errorf(mongoerr.InvalidBSON, "tsproxy rule %s: command is not valid BSON: %v", rc.NS, err)
	}
	pg, err := rc.ReadFindPaging(doc)
	if err != nil {
		return nil, err
	}
	f := &PartitionedFind{ns: rc.NS, skip: pg.Skip, limit: pg.Limit, single: pg.Single, first: pg.FirstBatch()}
	projDoc, err := rc.ReadDoc(doc, "projection", "find")
	if err != nil {
		return nil, err
	}
	if f.proj, err = rc.ParseProjection(projDoc, "find option \"projection\""); err != nil {
		return nil, err
	}
	sortDoc, err := rc.ReadDoc(doc, "sort", "find")
	if err != nil {
		return nil, err
	}
	if f.sort, err = parseMergeSort(rc, sortDoc); err != nil {
		return nil, err
	}
	idx, sub := bsoncore.AppendDocumentStart(nil)
	elems, _ := doc.Elements()
	for _, e := range elems {
		switch e.Key() {
		case "skip", "limit", "batchSize", "singleBatch", "projection":
		default:
			sub = append(sub, e...)
		}
	}
	if f.limit > 0 {
		sub = bsoncore.AppendInt64Element(sub, "limit", f.skip+f.limit)
	}
	f.Sub, _ = bsoncore.AppendDocumentEnd(sub, idx)
	return f, nil
}

// parseMergeSort reads the sort the proxy merges by: fields ascending or
// descending; other sort specs are refused across partitions.
func parseMergeSort(rc *query.Ctx, sortDoc bsoncore.Document) ([]mergeKey, error) {
	if sortDoc == nil {
		return nil, nil
	}
	elems, err := sortDoc.Elements()
	if err != nil {
		return nil, rc.BadValue(mongoerr.BadValue, "find option \"sort\" is not valid BSON")
	}
	var keys []mergeKey
	for _, e := range elems {
		n, ok := e.Value().AsInt64OK()
		if !ok {
			if fl, isF := e.Value().DoubleOK(); isF {
				n, ok = int64(fl), fl == 1 || fl == -1
			}
		}
		if !ok || (n != 1 && n != -1) {
			return nil, rc.Unsupported("sort %q: only 1 and -1 are supported on a read spanning partitions", e.Key())
		}
		keys = append(keys, mergeKey{path: strings.Split(e.Key(), "."), desc: n < 0})
	}
	return keys, nil
}

// Add collects the documents of one partition, in partition time order;
// it fails when the whole read would exceed MaxPartitionedReadBytes.
func (f *PartitionedFind) Add(docs []bsoncore.Document) error {
	for _, d := range docs {
		f.bytes += len(d)
		if f.bytes > MaxPartitionedReadBytes {
			return mongoerr.Errorf(mongoerr.NotImplemented, "tsproxy %s: the find spans several partitions and returns more than %d MiB, which the proxy would hold; bound it in time (within one partition) or add a limit", f.ns, MaxPartitionedReadBytes>>20)
		}
		f.out = append(f.out, slices.Clone(d))
	}
	return nil
}

// Finish merges what was added by the sort (stable, so ties keep
// partition order), then skips, limits and projects.
func (f *PartitionedFind) Finish() error {
	if len(f.sort) > 0 {
		var bad error
		slices.SortStableFunc(f.out, func(a, b bsoncore.Document) int {
			c, err := f.compare(a, b)
			if err != nil && bad == nil {
				bad = err
			}
			return c
		})
		if bad != nil {
			return bad
		}
	}
	if f.skip >= int64(len(f.out)) {
		f.out = nil
	} else {
		f.out = f.out[f.skip:]
	}
	if f.limit > 0 && int64(len(f.out)) > f.limit {
		f.out = f.out[:f.limit]
	}
	if f.proj != nil {
		for i, d := range f.out {
			p, err := f.proj.Apply(d)
			if err != nil {
				return err
			}
			f.out[i] = p
		}
	}
	return nil
}

func (f *PartitionedFind) compare(a, b bsoncore.Document) (int, error) {
	for _, k := range f.sort {
		va, err := f.sortValue(a, k.path)
		if err != nil {
			return 0, err
		}
		vb, err := f.sortValue(b, k.path)
		if err != nil {
			return 0, err
		}
		c := bsonutil.Compare(va, vb)
		if k.desc {
			c = -c
		}
		if c != 0 {
			return c, nil
		}
	}
	return 0, nil
}

// sortValue is the value a sort compares: null when missing; an array on
// the path is refused (its sort key is an element, chosen by direction).
func (f *PartitionedFind) sortValue(d bsoncore.Document, path []string) (bsoncore.Value, error) {
	null := bsoncore.Value{Type: bsoncore.TypeNull}
	cur := d
	for i, p := range path {
		v, err := cur.LookupErr(p)
		if err != nil {
			return null, nil
		}
		if v.Type == bsoncore.TypeArray {
			return null, mongoerr.Errorf(mongoerr.NotImplemented, "tsproxy %s: sort on %q meets an array, which a read spanning partitions cannot merge", f.ns, strings.Join(path, "."))
		}
		if i == len(path)-1 {
			return v, nil
		}
		sub, ok := v.DocumentOK()
		if !ok {
			return null, nil
		}
		cur = sub
	}
	return null, nil
}

// Batch answers the next batch of the merged cursor (first batch on the
// first call); want < 0 takes as many as fit. more is false when the
// cursor is done (id is then answered as 0).
func (f *PartitionedFind) Batch(id, want int64) (reply []byte, more bool) {
	key := "nextBatch"
	if !f.begun {
		key, want = "firstBatch", f.first
	}
	f.begun = true
	n, _ := cursor.BatchLen(f.out, want)
	batch := f.out[:n]
	f.out = f.out[n:]
	more = !f.single && len(f.out) > 0
	if !more {
		id = 0
	}
	d := cursor.Reply{Key: key, Batch: batch, NS: f.ns}.WithID(id)
	return d, more
}

// PartitionedCount is a count across partitions: each partition counts
// without skip and limit (Sub), the proxy sums and applies them.
type PartitionedCount struct {
	Sub         []byte
	skip, limit int64
	n           int64
}

// PlanPartitionedCount plans a count across partitions.
func PlanPartitionedCount(body []byte, rule *rules.Rule) (*PartitionedCount, error) {
	rc, err := query.NewCtx(rule)
	if err != nil {
		return nil, err
	}
	doc := bsoncore.Document(body)
	if err := bsonutil.Validate(doc, 0); err != nil {
		return nil, mongoerr.Errorf(mongoerr.InvalidBSON, "tsproxy rule %s: command is not valid BSON: %v", rc.NS, err)
	}
	c := &PartitionedCount{}
	if c.skip, c.limit, err = rc.ReadCountPaging(doc); err != nil {
		return nil, err
	}
	c.Sub = withoutFields(doc, "skip", "limit")
	return c, nil
}

// Add sums one partition's count reply; an error reply is returned to
// answer with.
func (c *PartitionedCount) Add(reply []byte) (errReply []byte) {
	doc := bsoncore.Document(reply)
	if doc.Validate() != nil || !mongoerr.IsOK(doc) {
		return reply
	}
	v, _ := bsonutil.Lookup(doc, "n")
	n, _ := v.AsInt64OK()
	c.n += n
	return nil
}

// Result is the count reply.
func (c *PartitionedCount) Result() []byte {
	n := max(c.n-c.skip, 0)
	if c.limit > 0 && n > c.limit {
		n = c.limit
	}
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = query.AppendCount(d, "n", n)
	d = bsoncore.AppendDoubleElement(d, "ok", 1)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

// PartitionedDistinct unites the distinct values of the partitions.
type PartitionedDistinct struct {
	values []bsoncore.Value
}

// Add unites one partition's distinct reply; an error reply is returned
// to answer with.
func (p *PartitionedDistinct) Add(reply []byte) (errReply []byte) {
	doc := bsoncore.Document(reply)
	if doc.Validate() != nil || !mongoerr.IsOK(doc) {
		return reply
	}
	arr, ok := bsonutil.Lookup(doc, "values")
	if !ok {
		return nil
	}
	vals, _ := bsoncore.Document(arr.Data).Values()
	for _, v := range vals {
		if !slices.ContainsFunc(p.values, func(have bsoncore.Value) bool {
			return bsonutil.Compare(have, v) == 0 && have.Type == v.Type || sameNumber(have, v)
		}) {
			p.values = append(p.values, bsoncore.Value{Type: v.Type, Data: slices.Clone(v.Data)})
		}
	}
	return nil
}

// sameNumber: distinct treats 1 and 1.0 as one value.
func sameNumber(a, b bsoncore.Value) bool {
	return bsonutil.IsNumber(a.Type) && bsonutil.IsNumber(b.Type) && bsonutil.Compare(a, b) == 0
}

// Result is the distinct reply.
func (p *PartitionedDistinct) Result() []byte {
	idx, d := bsoncore.AppendDocumentStart(nil)
	aidx, a := bsoncore.AppendArrayElementStart(d, "values")
	for i, v := range p.values {
		a = bsoncore.AppendValueElement(a, bsonutil.Itoa(i), v)
	}
	d, _ = bsoncore.AppendArrayEnd(a, aidx)
	d = bsoncore.AppendDoubleElement(d, "ok", 1)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

// withoutFields copies doc without the top-level fields keys.
func withoutFields(doc bsoncore.Document, keys ...string) bsoncore.Document {
	elems, _ := doc.Elements()
	idx, out := bsoncore.AppendDocumentStart(nil)
	for _, e := range elems {
		if !slices.Contains(keys, e.Key()) {
			out = append(out, e...)
		}
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return out
}

// PartitionReadRefusal is the error for a read the proxy cannot answer
// across the partitions it spans.
func PartitionReadRefusal(rule *rules.Rule, what string, n int) error {
	return query.RuleErrorf(rule, mongoerr.NotImplemented, "%s is not supported on a read spanning %d partitions (partitionBy %s); bound it in time within one partition", what, n, rule.PartitionBy)
}

// PartitionTimeRange reads the time bounds of a read's event filter (find
// filter, count and distinct query, an aggregate's leading $match): the
// instants [from, to] (ms, inclusive) its events can have, from the
// timeField's date comparisons at the top level or in a top-level $and.
// Without bounds it is [MinInt64, MaxInt64]; a partition that holds no
// window overlapping it need not be read.
func PartitionTimeRange(body []byte, rule *rules.Rule) (from, to int64) {
	from, to = math.MinInt64, math.MaxInt64
	doc := bsoncore.Document(body)
	elems, err := doc.Elements()
	if err != nil || len(elems) == 0 {
		return from, to
	}
	var filter bsoncore.Document
	switch elems[0].Key() {
	case "find":
		filter, _ = doc.Lookup("filter").DocumentOK()
	case "count", "distinct":
		filter, _ = doc.Lookup("query").DocumentOK()
	case "aggregate":
		if arr, ok := doc.Lookup("pipeline").ArrayOK(); ok {
			if v, err := arr.IndexErr(0); err == nil {
				if first, ok := v.DocumentOK(); ok {
					filter, _ = first.Lookup("$match").DocumentOK()
				}
			}
		}
	}
	narrowTime(filter, rule.TimeField, &from, &to)
	return from, to
}

func narrowTime(filter bsoncore.Document, timeField string, from, to *int64) {
	elems, err := filter.Elements()
	if err != nil {
		return
	}
	for _, e := range elems {
		switch e.Key() {
		case "$and":
			arr, _ := e.Value().ArrayOK()
			vals, _ := arr.Values()
			for _, v := range vals {
				if d, ok := v.DocumentOK(); ok {
					narrowTime(d, timeField, from, to)
				}
			}
		case timeField:
			if ms, ok := e.Value().DateTimeOK(); ok {
				*from, *to = max(*from, ms), min(*to, ms)
				continue
			}
			ops, ok := e.Value().DocumentOK()
			if !ok {
				continue
			}
			oe, _ := ops.Elements()
			for _, op := range oe {
				ms, ok := op.Value().DateTimeOK()
				if !ok {
					continue
				}
				switch op.Key() {
				case "$eq":
					*from, *to = max(*from, ms), min(*to, ms)
				case "$gte", "$gt":
					*from = max(*from, ms)
				case "$lte", "$lt":
					*to = min(*to, ms)
				}
			}
		}
	}
}

// PartitionOverlaps reports whether the partition starting at start (ms)
// can hold events in [from, to] (PartitionTimeRange): its windows start
// within the period, so hold events from the period start to the last
// window's end.
func PartitionOverlaps(rule *rules.Rule, start, from, to int64) bool {
	if start > to {
		return false
	}
	end := rules.PartitionEnd(rule.PartitionBy, start)
	last := rule.WindowStartMillis(end-1) + rule.SpanMillis() // exclusive
	return from < last
}

// PartitionCommandRefusal is the error for a command the proxy does not
// support on a partitioned rule.
func PartitionCommandRefusal(rule *rules.Rule, what string) error {
	return query.RuleErrorf(rule, mongoerr.NotImplemented, "%s is not supported with partitionBy %s (buckets are in one collection per period)", what, rule.PartitionBy)
}

// PartitionedGroupCount is countDocuments across partitions: the
// aggregate [$match..., $skip?, $limit?, {$group: {_id: c, n: {$sum: 1}}}]
// counted as a count (Count), answered as the aggregate's cursor.
type PartitionedGroupCount struct {
	Count *PartitionedCount
	ns    string
	id    bsoncore.Value
	key   string
}

// PlanPartitionedGroupCount recognises countDocuments' pipeline; ok is
// false for any other aggregate.
func PlanPartitionedGroupCount(body []byte, rule *rules.Rule) (*PartitionedGroupCount, bool) {
	doc := bsoncore.Document(body)
	if bsonutil.Validate(doc, 0) != nil {
		return nil, false
	}
	arr, ok := doc.Lookup("pipeline").ArrayOK()
	if !ok {
		return nil, false
	}
	stages, err := arr.Values()
	if err != nil || len(stages) == 0 {
		return nil, false
	}
	var matches []bsoncore.Document
	var skip, limit bsoncore.Value
	for i, sv := range stages {
		st, ok := sv.DocumentOK()
		if !ok {
			return nil, false
		}
		se, err := st.Elements()
		if err != nil || len(se) != 1 {
			return nil, false
		}
		name, v := se[0].Key(), se[0].Value()
		switch {
		case name == "$match" && skip.Type == 0 && limit.Type == 0:
			m, ok := v.DocumentOK()
			if !ok {
				return nil, false
			}
			matches = append(matches, m)
		case name == "$skip" && skip.Type == 0 && limit.Type == 0:
			skip = v
		case name == "$limit" && limit.Type == 0:
			limit = v
		case name == "$group" && i == len(stages)-1:
			key, ok := read.CountGroup(v)
			if !ok {
				return nil, false
			}
			g := &PartitionedGroupCount{ns: rule.Namespace, key: key}
			g.id = v.Document().Lookup("_id")
			cmd := countCommand(doc, rule, matches, skip, limit)
			if g.Count, err = PlanPartitionedCount(cmd, rule); err != nil {
				return nil, false
			}
			return g, true
		default:
			return nil, false
		}
	}
	return nil, false
}

// countCommand is the count of an aggregate's matches, skip and limit.
func countCommand(agg bsoncore.Document, rule *rules.Rule, matches []bsoncore.Document, skip, limit bsoncore.Value) []byte {
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendStringElement(d, "count", rule.Collection)
	switch len(matches) {
	case 0:
	case 1:
		d = bsoncore.AppendDocumentElement(d, "query", matches[0])
	default:
		qidx, q := bsoncore.AppendDocumentElementStart(d, "query")
		aidx, a := bsoncore.AppendArrayElementStart(q, "$and")
		for i, m := range matches {
			a = bsoncore.AppendDocumentElement(a, bsonutil.Itoa(i), m)
		}
		q, _ = bsoncore.AppendArrayEnd(a, aidx)
		d, _ = bsoncore.AppendDocumentEnd(q, qidx)
	}
	if skip.Type != 0 {
		d = bsoncore.AppendValueElement(d, "skip", skip)
	}
	if limit.Type != 0 {
		d = bsoncore.AppendValueElement(d, "limit", limit)
	}
	elems, _ := agg.Elements()
	for _, e := range elems {
		if query.CarriedSet[e.Key()] {
			d = append(d, e...)
		}
	}
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

// Result is the aggregate's reply: one group document, or none when no
// event counted.
func (g *PartitionedGroupCount) Result() []byte {
	n := bsoncore.Document(g.Count.Result()).Lookup("n")
	var batch []bsoncore.Document
	if cnt, _ := n.AsInt64OK(); cnt > 0 {
		batch = append(batch, bsoncore.NewDocumentBuilder().AppendValue("_id", g.id).AppendValue(g.key, n).Build())
	}
	return cursor.Reply{Key: "firstBatch", Batch: batch, NS: g.ns}.WithID(0)
}

// TimeLed reports the direction of a sort led by the timeField with a
// limit: the partitions are then read in that time order (desc: newest
// first) until Enough says the rest cannot reach the result.
func (f *PartitionedFind) TimeLed(rule *rules.Rule) (led, desc bool) {
	if f.limit <= 0 || len(f.sort) == 0 || len(f.sort[0].path) != 1 || f.sort[0].path[0] != rule.TimeField {
		return false, false
	}
	return true, f.sort[0].desc
}

// Enough reports, for a TimeLed find, whether the partitions not read yet
// cannot change the result: their events all have times at or after
// bound (ascending: the next partition's start) or before it
// (descending: the end of the next partition's last window), and the
// skip+limit-th document read so far sorts strictly before them.
func (f *PartitionedFind) Enough(rule *rules.Rule, bound int64) bool {
	k := f.skip + f.limit
	if int64(len(f.out)) < k {
		return false
	}
	sorted := slices.Clone(f.out)
	var bad error
	slices.SortStableFunc(sorted, func(a, b bsoncore.Document) int {
		c, err := f.compare(a, b)
		if err != nil && bad == nil {
			bad = err
		}
		return c
	})
	if bad != nil {
		return false // Finish reports it
	}
	v, err := sorted[k-1].LookupErr(rule.TimeField)
	if err != nil {
		return false
	}
	ms, ok := v.DateTimeOK()
	if !ok {
		return false
	}
	if f.sort[0].desc {
		return ms >= bound
	}
	return ms < bound
}
