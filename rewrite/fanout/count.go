package fanout

import (
	"slices"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/cursor"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/query"
	"github.com/tsproxy/tsproxy/rewrite/read"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// PartitionedCount is a count across partitions: each partition counts
// without skip and limit (Sub), the proxy sums and applies them.
type CountSum struct {
	Sub         []byte
	skip, limit int64
	n           int64
}

// PlanPartitionedCount plans a count across partitions.
func PlanCountSum(body []byte, rule *rules.Rule) (*CountSum, error) {
	rc, err := query.NewCtx(rule)
	if err != nil {
		return nil, err
	}
	doc := bsoncore.Document(body)
	c := &CountSum{}
	if c.skip, c.limit, err = rc.ReadCountPaging(doc); err != nil {
		return nil, err
	}
	c.Sub = withoutFields(doc, "skip", "limit")
	return c, nil
}

// Add sums one partition's count reply; an error reply is returned to
// answer with.
func (c *CountSum) Add(reply []byte) (errReply []byte) {
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
func (c *CountSum) Result() []byte {
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
type DistinctUnion struct {
	values []bsoncore.Value
}

// Add unites one partition's distinct reply; an error reply is returned
// to answer with.
func (p *DistinctUnion) Add(reply []byte) (errReply []byte) {
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
func (p *DistinctUnion) Result() []byte {
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

// PartitionedGroupCount is countDocuments across partitions: the
// aggregate [$match..., $skip?, $limit?, {$group: {_id: c, n: {$sum: 1}}}]
// counted as a count (Count), answered as the aggregate's cursor.
type GroupCountSum struct {
	Count *CountSum
	ns    string
	id    bsoncore.Value
	key   string
}

// PlanPartitionedGroupCount recognises countDocuments' pipeline; ok is
// false for any other aggregate.
func PlanGroupCountSum(body []byte, rule *rules.Rule) (*GroupCountSum, bool) {
	doc := bsoncore.Document(body)
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
			g := &GroupCountSum{ns: rule.Namespace, key: key}
			g.id = v.Document().Lookup("_id")
			cmd := countCommand(doc, rule, matches, skip, limit)
			if g.Count, err = PlanCountSum(cmd, rule); err != nil {
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
func (g *GroupCountSum) Result() []byte {
	n := bsoncore.Document(g.Count.Result()).Lookup("n")
	var batch []bsoncore.Document
	if cnt, _ := n.AsInt64OK(); cnt > 0 {
		batch = append(batch, bsoncore.NewDocumentBuilder().AppendValue("_id", g.id).AppendValue(g.key, n).Build())
	}
	return cursor.Reply{Key: "firstBatch", Batch: batch, NS: g.ns}.WithID(0)
}
