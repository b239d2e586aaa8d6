package agg

import (
	"math"
	"slices"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/expr"
	"github.com/tsproxy/tsproxy/rewrite/expr/value"
)

// $bucketAuto: the documents in groupBy order, cut into at most
// `buckets` buckets of about equal counts (documents with equal values
// stay together), each {_id: {min, max}, <output>...}, max being the
// next bucket's min (the last one's greatest value), as MongoDB cuts
// them. A granularity (preferred number series) is not supported.
type bucketAutoStage struct {
	groupBy expr.Expr
	buckets int
	specs   []expr.AccumulatorSpec
	items   []autoItem
	in      buffer
	next    processor
}

type autoItem struct {
	key value.Value
	doc bsoncore.Document
}

func compileBucketAuto(v value.Value, next processor, opts Options) (processor, error) {
	d, ok := v.DocumentOK()
	if !ok {
		return nil, value.BadValue(40240, "The argument to $bucketAuto must be an object, but found type: %s.", expr.TypeAlias(v))
	}
	b := &bucketAutoStage{in: buffer{stage: "$bucketAuto", max: opts.MaxMemory}, next: next}
	var output bsoncore.Document
	elems, _ := d.Elements()
	for _, e := range elems {
		switch e.Key() {
		case "groupBy":
			g, err := compileGroupBy("$bucketAuto", e.Value(), 40239)
			if err != nil {
				return nil, err
			}
			b.groupBy = g
		case "buckets":
			i, ok := bsonutil.WholeNumber(e.Value())
			if !ok {
				return nil, value.BadValue(40241, "The $bucketAuto 'buckets' field must be a numeric value, but found type: %s.", expr.TypeAlias(e.Value()))
			}
			if i <= 0 || i > math.MaxInt32 {
				return nil, value.BadValue(40243, "The $bucketAuto 'buckets' field must be greater than 0, but found: %d.", i)
			}
			b.buckets = int(i)
		case "output":
			o, ok := e.Value().DocumentOK()
			if !ok {
				return nil, value.BadValue(40244, "The $bucketAuto 'output' field must be an object, but found type: %s.", expr.TypeAlias(e.Value()))
			}
			output = o
		case "granularity":
			return nil, value.Unsupported("$bucketAuto with a granularity")
		default:
			return nil, value.BadValue(40245, "Unrecognized option to $bucketAuto: %s.", e.Key())
		}
	}
	if b.groupBy == nil || b.buckets == 0 {
		return nil, value.BadValue(40246, "$bucketAuto requires 'groupBy' and 'buckets' to be specified")
	}
	specs, err := bucketOutput(output)
	b.specs = specs
	return b, err
}

func (b *bucketAutoStage) push(doc bsoncore.Document) error {
	key, err := b.groupBy.Eval(doc)
	if err != nil {
		return err
	}
	if key.Type == 0 {
		key = value.Null
	}
	if err := b.in.Add(doc); err != nil {
		return err
	}
	b.items = append(b.items, autoItem{key: value.Clone(key), doc: b.in.docs[len(b.in.docs)-1]})
	return nil
}

func (b *bucketAutoStage) flush() error {
	items := b.items
	b.items, b.in.docs = nil, nil
	slices.SortStableFunc(items, func(x, y autoItem) int { return value.Compare(x.key, y.key) })
	n := len(items)
	size := int(math.Round(float64(n) / float64(b.buckets)))
	if size < 1 {
		size = 1
	}
	for start, made := 0, 0; start < n; made++ {
		end := min(start+size, n)
		// Equal values stay in one bucket; the last bucket takes the rest.
		for end < n && value.Compare(items[end].key, items[end-1].key) == 0 {
			end++
		}
		if made == b.buckets-1 {
			end = n
		}
		max := items[end-1].key
		if end < n {
			max = items[end].key
		}
		accs := make([]value.Accumulator, len(b.specs))
		for i, s := range b.specs {
			accs[i] = s.Make()
		}
		for _, it := range items[start:end] {
			for i, s := range b.specs {
				v, err := s.Arg.Eval(it.doc)
				if err != nil {
					return err
				}
				accs[i].Add(v)
			}
		}
		idx, out := bsoncore.AppendDocumentStart(nil)
		out = bsoncore.AppendDocumentElement(out, "_id", bsoncore.NewDocumentBuilder().
			AppendValue("min", items[start].key).AppendValue("max", max).Build())
		for i, s := range b.specs {
			v, err := accs[i].Result()
			if err != nil {
				return err
			}
			out = bsoncore.AppendValueElement(out, s.Field, v)
		}
		out, _ = bsoncore.AppendDocumentEnd(out, idx)
		if err := b.next.push(out); err != nil {
			return err
		}
		start = end
	}
	return b.next.flush()
}
