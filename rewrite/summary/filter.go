package summary

import (
	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// bucketFilter translates a $match that selects whole buckets: the
// timeField bounded by $gte and $lt on window edges (a multiple of the
// span), and the metaField equal to, or $in, plain values. Every event of
// a selected bucket matches and no event of another bucket does, so the
// summaries of the selected buckets are exactly the matched events'.
func (p *Aggregation) bucketFilter(match bsoncore.Document) (bsoncore.Document, bool) {
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

func (p *Aggregation) timeRange(v bsoncore.Value) (bsoncore.Document, bool) {
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

// findCommand reads the summaries of the selected buckets, never their
// events: a plain inclusion projection, which FerretDB supports.
func (p *Aggregation) findCommand(filter bsoncore.Document, carried []bsoncore.Element) []byte {
	proj := bsoncore.NewDocumentBuilder().
		AppendInt32(bucket.FieldMeta, 1).
		AppendInt32(bucket.FieldStart, 1).
		AppendInt32(bucket.FieldCount, 1).
		AppendInt32(bucket.FieldMin, 1).
		AppendInt32(bucket.FieldMax, 1).
		AppendInt32(bucket.FieldSum, 1).
		AppendInt32(bucket.FieldCounted, 1).
		AppendInt32(bucket.FieldMixed, 1).
		AppendInt32(bucket.FieldSummed, 1).
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
