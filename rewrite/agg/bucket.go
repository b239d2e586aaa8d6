package agg

import (
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/expr"
	"github.com/tsproxy/tsproxy/rewrite/expr/value"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// $bucket is MongoDB's own rewrite of it: a $group whose _id is the
// lower boundary of the value's bucket (or the default), then a $sort by
// _id.
type bucketOf struct {
	groupBy    expr.Expr
	boundaries []value.Value
	def        value.Value // Type 0: no default
}

func (b bucketOf) Eval(doc bsoncore.Document) (value.Value, error) {
	v, err := b.groupBy.Eval(doc)
	if err != nil {
		return value.Missing, err
	}
	if v.Type == 0 {
		v = value.Null
	}
	if value.Compare(v, b.boundaries[0]) >= 0 && value.Compare(v, b.boundaries[len(b.boundaries)-1]) < 0 {
		for i := len(b.boundaries) - 2; i >= 0; i-- {
			if value.Compare(v, b.boundaries[i]) >= 0 {
				return b.boundaries[i], nil
			}
		}
	}
	if b.def.Type != 0 {
		return b.def, nil
	}
	return value.Missing, mongoerr.Errorf(mongoerr.NoBucketBranch, "$switch could not find a matching branch for an input, and no default was specified.")
}

func compileBucket(v value.Value, next processor, opts Options) (processor, error) {
	d, ok := v.DocumentOK()
	if !ok {
		return nil, value.BadValue(40201, "Argument to $bucket stage must be an object, but found type: %s.", expr.TypeAlias(v))
	}
	var b bucketOf
	var output bsoncore.Document
	elems, _ := d.Elements()
	for _, e := range elems {
		switch e.Key() {
		case "groupBy":
			g, err := compileGroupBy("$bucket", e.Value(), 40202)
			if err != nil {
				return nil, err
			}
			b.groupBy = g
		case "boundaries":
			arr, ok := e.Value().ArrayOK()
			if !ok {
				return nil, value.BadValue(40200, "The $bucket 'boundaries' field must be an array, but found type: %s.", expr.TypeAlias(e.Value()))
			}
			vals, _ := arr.Values()
			for _, bv := range vals {
				b.boundaries = append(b.boundaries, value.Clone(bv))
			}
		case "default":
			b.def = value.Clone(e.Value())
		case "output":
			o, ok := e.Value().DocumentOK()
			if !ok {
				return nil, value.BadValue(40196, "The $bucket 'output' field must be an object, but found type: %s.", expr.TypeAlias(e.Value()))
			}
			output = o
		default:
			return nil, value.BadValue(40197, "Unrecognized option to $bucket: %s.", e.Key())
		}
	}
	if b.groupBy == nil || b.boundaries == nil {
		return nil, value.BadValue(40198, "$bucket requires 'groupBy' and 'boundaries' to be specified.")
	}
	if len(b.boundaries) < 2 {
		return nil, value.BadValue(40192, "The $bucket 'boundaries' field must have at least 2 values, but found %d value(s).", len(b.boundaries))
	}
	for i := 1; i < len(b.boundaries); i++ {
		prev, cur := b.boundaries[i-1], b.boundaries[i]
		if value.CanonicalRank(prev) != value.CanonicalRank(cur) {
			return nil, value.BadValue(40193, "All values in the the 'boundaries' option to $bucket must have the same type. Found conflicting types %s and %s.", expr.TypeAlias(prev), expr.TypeAlias(cur))
		}
		if value.Compare(prev, cur) >= 0 {
			return nil, value.BadValue(40194, "The 'boundaries' option to $bucket must be sorted in ascending order, but elements %d and %d are not in ascending order (%s is not less than %s).", i-1, i, prev, cur)
		}
	}
	if b.def.Type != 0 && value.CanonicalRank(b.def) == value.CanonicalRank(b.boundaries[0]) &&
		value.Compare(b.def, b.boundaries[0]) >= 0 && value.Compare(b.def, b.boundaries[len(b.boundaries)-1]) < 0 {
		return nil, value.BadValue(40199, "The $bucket 'default' field must be less than the lowest boundary or greater than or equal to the highest boundary.")
	}
	g := &groupStage{id: b, groups: map[string]int{}, max: opts.MaxMemory, name: "$bucket",
		next: &sortStage{keys: []sortKey{{path: []string{"_id"}}}, max: opts.MaxMemory, next: next, name: "$bucket"}}
	specs, err := bucketOutput(output)
	g.specs = specs
	return g, err
}

// compileGroupBy reads the groupBy of $bucket and $bucketAuto: a
// $-prefixed path or an expression object.
func compileGroupBy(stage string, v value.Value, code mongoerr.Code) (expr.Expr, error) {
	if s, ok := v.StringValueOK(); !(ok && len(s) > 1 && s[0] == '$') && v.Type != bsoncore.TypeEmbeddedDocument {
		return nil, value.BadValue(code, "The %s 'groupBy' field must be defined as a $-prefixed path or an expression, but found: %s.", stage, v)
	}
	return expr.CompileTop(v, 1)
}

// bucketOutput compiles the output of $bucket and $bucketAuto: its
// accumulators, or a count when there is none.
func bucketOutput(output bsoncore.Document) ([]expr.AccumulatorSpec, error) {
	if output == nil {
		return []expr.AccumulatorSpec{{Field: "count", Op: "$sum", Arg: expr.Literal{V: value.Int32Value(1)}}}, nil
	}
	var specs []expr.AccumulatorSpec
	oe, _ := output.Elements()
	for _, e := range oe {
		spec, err := expr.CompileAccumulator(e.Key(), e.Value())
		if err != nil {
			return nil, err
		}
		specs = append(specs, spec)
	}
	return specs, nil
}
