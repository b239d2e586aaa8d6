package expr

import (
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/expr/value"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// The array operators: $size, $arrayElemAt, $first, $last,
// $concatArrays, $in, $isArray, $reverseArray, $slice and $range, and
// $sum, $avg, $min, $max as expressions (of one array argument, or of a
// list of arguments).

func init() {
	operators["$size"] = unary(size)
	operators["$arrayElemAt"] = fixed(2, arrayElemAt)
	operators["$first"] = unary(func(name string, v value.Value) (value.Value, error) { return firstLast(name, v, true) })
	operators["$last"] = unary(func(name string, v value.Value) (value.Value, error) { return firstLast(name, v, false) })
	operators["$concatArrays"] = concatArrays
	operators["$in"] = fixed(2, inArray)
	operators["$isArray"] = unary(func(_ string, v value.Value) (value.Value, error) {
		return value.BoolValue(v.Type == bsoncore.TypeArray), nil
	})
	operators["$reverseArray"] = unary(reverseArray)
	operators["$slice"] = sliceOp
	operators["$range"] = rangeOp
	for _, n := range []string{"$sum", "$avg", "$min", "$max"} {
		operators[n] = accumulatorExpr
	}
}

// arrayOf reads v as an array's values (ok false when it is not one).
func arrayOf(v value.Value) ([]value.Value, bool) {
	arr, ok := v.ArrayOK()
	if !ok {
		return nil, false
	}
	vals, err := arr.Values()
	return vals, err == nil
}

func size(name string, v value.Value) (value.Value, error) {
	vals, ok := arrayOf(v)
	if !ok {
		return value.Missing, value.BadValue(17124, "The argument to %s must be an array. Type of argument: %s", name, TypeAlias(v))
	}
	return value.Int32Value(int32(len(vals))), nil
}

func arrayElemAt(name string, v []value.Value) (value.Value, error) {
	if value.IsNullish(v[0]) || value.IsNullish(v[1]) {
		return value.Null, nil
	}
	vals, ok := arrayOf(v[0])
	if !ok {
		return value.Missing, value.BadValue(28689, "%s's first argument must be an array, but is %s", name, TypeAlias(v[0]))
	}
	i, ok := bsonutil.WholeNumber(v[1])
	if !ok {
		return value.Missing, value.BadValue(28691, "%s's second argument must be a numeric value, but is %s", name, TypeAlias(v[1]))
	}
	if i < 0 {
		i += int64(len(vals))
	}
	if i < 0 || i >= int64(len(vals)) {
		return value.Missing, nil
	}
	return vals[i], nil
}

func firstLast(name string, v value.Value, first bool) (value.Value, error) {
	if value.IsNullish(v) {
		return value.Null, nil
	}
	vals, ok := arrayOf(v)
	if !ok {
		return value.Missing, value.BadValue(28689, "%s's argument must be an array, but is %s", name, TypeAlias(v))
	}
	switch {
	case len(vals) == 0:
		return value.Missing, nil
	case first:
		return vals[0], nil
	}
	return vals[len(vals)-1], nil
}

func concatArrays(name string, args []Expr) (Expr, error) {
	return opFunc{name: name, args: args, f: func(v []value.Value) (value.Value, error) {
		var out []value.Value
		for _, a := range v {
			if value.IsNullish(a) {
				return value.Null, nil
			}
			vals, ok := arrayOf(a)
			if !ok {
				return value.Missing, value.BadValue(28664, "%s only supports arrays, not %s", name, TypeAlias(a))
			}
			out = append(out, vals...)
		}
		return arrayValue(out), nil
	}}, nil
}

func inArray(name string, v []value.Value) (value.Value, error) {
	vals, ok := arrayOf(v[1])
	if !ok {
		return value.Missing, value.BadValue(40081, "%s requires an array as a second argument, found: %s", name, TypeAlias(v[1]))
	}
	for _, el := range vals {
		if value.Compare(el, v[0]) == 0 {
			return value.BoolValue(true), nil
		}
	}
	return value.BoolValue(false), nil
}

func reverseArray(name string, v value.Value) (value.Value, error) {
	if value.IsNullish(v) {
		return value.Null, nil
	}
	vals, ok := arrayOf(v)
	if !ok {
		return value.Missing, value.BadValue(34435, "The argument to %s must be an array, but was of type: %s", name, TypeAlias(v))
	}
	out := make([]value.Value, len(vals))
	for i, el := range vals {
		out[len(vals)-1-i] = el
	}
	return arrayValue(out), nil
}

// $slice: [array, n] (the first n, or the last -n) or [array, position, n].
func sliceOp(name string, args []Expr) (Expr, error) {
	if len(args) < 2 || len(args) > 3 {
		return nil, value.BadValue(28667, "Expression %s takes at least 2 arguments, and at most 3, but %d were passed in.", name, len(args))
	}
	return opFunc{name: name, args: args, f: func(v []value.Value) (value.Value, error) { return slice(name, v) }}, nil
}

func slice(name string, v []value.Value) (value.Value, error) {
	for _, a := range v {
		if value.IsNullish(a) {
			return value.Null, nil
		}
	}
	vals, ok := arrayOf(v[0])
	if !ok {
		return value.Missing, value.BadValue(28724, "First argument to %s must be an array, but is of type: %s", name, TypeAlias(v[0]))
	}
	n := int64(len(vals))
	a, ok := bsonutil.WholeNumber(v[1])
	if !ok {
		return value.Missing, value.BadValue(28725, "Second argument to %s must be a numeric value, but is of type: %s", name, TypeAlias(v[1]))
	}
	if len(v) == 2 {
		if a >= 0 {
			return arrayValue(vals[:min(a, n)]), nil
		}
		return arrayValue(vals[max(n+a, 0):]), nil
	}
	count, ok := bsonutil.WholeNumber(v[2])
	if !ok {
		return value.Missing, value.BadValue(28727, "Third argument to %s must be numeric, but is of type: %s", name, TypeAlias(v[2]))
	}
	if count <= 0 {
		return value.Missing, value.BadValue(28729, "Third argument to %s must be positive: %d", name, count)
	}
	start := a
	if start < 0 {
		start = max(n+start, 0)
	}
	start = min(start, n)
	return arrayValue(vals[start:clampEnd(start, count, n)]), nil
}

// maxRange bounds $range's output as MongoDB's memory limit would.
const maxRange = 1 << 24

func rangeOp(name string, args []Expr) (Expr, error) {
	if len(args) < 2 || len(args) > 3 {
		return nil, value.BadValue(28667, "Expression %s takes at least 2 arguments, and at most 3, but %d were passed in.", name, len(args))
	}
	return opFunc{name: name, args: args, f: func(v []value.Value) (value.Value, error) { return rangeOf(name, v) }}, nil
}

func rangeOf(name string, v []value.Value) (value.Value, error) {
	what := []string{"starting value", "ending value", "step value"}
	codes := []mongoerr.Code{34443, 34445, 34447}
	nums := []int64{0, 0, 1}
	for i, a := range v {
		n, ok := bsonutil.WholeNumber(a)
		if !ok || n < -1<<31 || n >= 1<<31 {
			return value.Missing, value.BadValue(codes[i], "%s requires a %s that can be represented as a 32-bit integer, found value: %s", name, what[i], value.Describe(a))
		}
		nums[i] = n
	}
	start, end, step := nums[0], nums[1], nums[2]
	if step == 0 {
		return value.Missing, value.BadValue(34449, "%s requires a non-zero step value", name)
	}
	var out []value.Value
	for i := start; (step > 0 && i < end) || (step < 0 && i > end); i += step {
		if len(out) >= maxRange {
			return value.Missing, value.BadValue(5736700, "%s would use too much memory", name)
		}
		out = append(out, value.Int32Value(int32(i)))
	}
	return arrayValue(out), nil
}

// accumulatorExpr is $sum, $avg, $min or $max in an expression: over
// the elements of its one array argument, or over its arguments.
func accumulatorExpr(name string, args []Expr) (Expr, error) {
	spec := AccumulatorSpec{Op: name}
	return opFunc{name: name, args: args, f: func(v []value.Value) (value.Value, error) {
		if len(v) == 1 {
			if vals, ok := arrayOf(v[0]); ok {
				v = vals
			}
		}
		acc := spec.Make()
		for _, x := range v {
			acc.Add(x)
		}
		return acc.Result()
	}}, nil
}
