package expr

import (
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/expr/value"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// AccumulatorSpec is a compiled {<field>: {$op: <expr>}} of $group.
type AccumulatorSpec struct {
	Field string
	Op    string
	Arg   Expr
}

func (s AccumulatorSpec) Make() value.Accumulator { return value.NewAccumulator(s.Op) }

func CompileAccumulator(field string, v value.Value) (AccumulatorSpec, error) {
	d, ok := v.DocumentOK()
	if !ok {
		return AccumulatorSpec{}, value.BadValue(40234, "The field '%s' must be an accumulator object", field)
	}
	elems, _ := d.Elements()
	if len(elems) != 1 {
		return AccumulatorSpec{}, value.BadValue(40238, "The field '%s' must specify one accumulator", field)
	}
	op, arg := elems[0].Key(), elems[0].Value()
	spec := AccumulatorSpec{Field: field, Op: op}
	switch op {
	case "$sum", "$avg", "$min", "$max", "$first", "$last", "$push", "$addToSet":
	case "$count":
		if ad, ok := arg.DocumentOK(); !ok || len(ad) != 5 {
			return spec, value.BadValue(mongoerr.TypeMismatch, "$count takes no arguments, i.e. $count:{}")
		}
		spec.Arg = Literal{V: value.Int32Value(1)}
		return spec, nil
	default:
		return spec, value.Unsupported("the $group accumulator %q", op)
	}
	if arg.Type == bsoncore.TypeArray {
		return spec, value.BadValue(40237, "The %s accumulator is a unary operator", op)
	}
	e, err := CompileTop(arg, 1)
	if err != nil {
		return spec, err
	}
	spec.Arg = e
	return spec, nil
}
