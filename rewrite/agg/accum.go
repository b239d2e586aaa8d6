package agg

import (
	"math"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// accumulator is one $group field's state for one group.
type accumulator interface {
	add(v Value)
	result() (Value, error)
	// size is about how many bytes it holds, for the memory budget.
	size() int
}

// accumulatorSpec is a compiled {<field>: {$op: <expr>}} of $group.
type accumulatorSpec struct {
	field string
	op    string
	arg   expr
}

func (s accumulatorSpec) make() accumulator {
	switch s.op {
	case "$sum", "$count":
		return &sumAcc{}
	case "$avg":
		return &sumAcc{avg: true}
	case "$min":
		return &extremeAcc{max: false}
	case "$max":
		return &extremeAcc{max: true}
	case "$first":
		return &firstAcc{}
	case "$last":
		return &lastAcc{}
	case "$push":
		return &pushAcc{}
	case "$addToSet":
		return &pushAcc{set: map[string]bool{}}
	}
	return nil
}

func compileAccumulator(field string, v Value) (accumulatorSpec, error) {
	d, ok := v.DocumentOK()
	if !ok {
		return accumulatorSpec{}, badValue(40234, "The field '%s' must be an accumulator object", field)
	}
	elems, _ := d.Elements()
	if len(elems) != 1 {
		return accumulatorSpec{}, badValue(40238, "The field '%s' must specify one accumulator", field)
	}
	op, arg := elems[0].Key(), elems[0].Value()
	spec := accumulatorSpec{field: field, op: op}
	switch op {
	case "$sum", "$avg", "$min", "$max", "$first", "$last", "$push", "$addToSet":
	case "$count":
		if ad, ok := arg.DocumentOK(); !ok || len(ad) != 5 {
			return spec, badValue(mongoerr.TypeMismatch, "$count takes no arguments, i.e. $count:{}")
		}
		spec.arg = literal{v: int32Value(1)}
		return spec, nil
	default:
		return spec, unsupported("the $group accumulator %q", op)
	}
	if arg.Type == bsoncore.TypeArray {
		return spec, badValue(40237, "The %s accumulator is a unary operator", op)
	}
	e, err := compileTop(arg, 1)
	if err != nil {
		return spec, err
	}
	spec.arg = e
	return spec, nil
}

// sumAcc is $sum (and $avg, and $count): numbers summed as MongoDB sums
// them, non-numbers ignored. Integers are summed exactly while they fit
// an int64; doubles in double-double precision (twoSum), which is
// MongoDB's DoubleDoubleSummation.
type sumAcc struct {
	avg      bool
	kind     numKind
	n        int64 // numbers added
	long     int64
	overflow bool
	hi, lo   float64 // double-double sum of every number
	special  float64 // the sum of the infinities and NaNs
	decimal  bool
}

func (a *sumAcc) add(v Value) {
	k, i, f, ok := number(v)
	if !ok {
		return
	}
	if k == kindDecimal {
		a.decimal = true
		return
	}
	a.n++
	a.kind = max(a.kind, k)
	if k == kindDouble {
		a.addDouble(f)
		return
	}
	s := a.long + i
	if (i > 0 && s < a.long) || (i < 0 && s > a.long) {
		a.overflow = true
	}
	a.long = s
	// An int64 as two doubles, each exact, so the double sum stays exact.
	high := i / (1 << 32) * (1 << 32)
	a.addDouble(float64(i - high))
	a.addDouble(float64(high))
}

func (a *sumAcc) addDouble(x float64) {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		a.special += x
		return
	}
	s := a.hi + x
	bv := s - a.hi
	e := (a.hi - (s - bv)) + (x - bv) // twoSum's error
	lo := a.lo + e
	a.hi = s + lo
	a.lo = lo - (a.hi - s) // fast2Sum renormalises
}

func (a *sumAcc) double() float64 {
	if a.special != 0 || math.IsNaN(a.special) {
		return a.special
	}
	return a.hi + a.lo
}

func (a *sumAcc) result() (Value, error) {
	if a.decimal {
		return missing, unsupported("a $sum or $avg over decimal128 values")
	}
	if a.avg {
		if a.n == 0 {
			return null, nil
		}
		if a.kind != kindDouble && !a.overflow {
			return doubleValue(float64(a.long) / float64(a.n)), nil
		}
		return doubleValue(a.double() / float64(a.n)), nil
	}
	switch {
	case a.n == 0:
		return int32Value(0), nil
	case a.kind == kindDouble || a.overflow:
		return doubleValue(a.double()), nil
	case a.kind == kindInt32 && a.long >= math.MinInt32 && a.long <= math.MaxInt32:
		return int32Value(int32(a.long)), nil
	}
	return int64Value(a.long), nil
}

func (a *sumAcc) size() int { return 64 }

// extremeAcc is $min or $max: BSON order; null and missing ignored.
type extremeAcc struct {
	max bool
	v   Value
}

func (a *extremeAcc) add(v Value) {
	if isNullish(v) {
		return
	}
	if a.v.Type == 0 || (compare(v, a.v) > 0) == a.max && compare(v, a.v) != 0 {
		a.v = clone(v)
	}
}

func (a *extremeAcc) result() (Value, error) {
	if a.v.Type == 0 {
		return null, nil
	}
	return a.v, nil
}

func (a *extremeAcc) size() int { return 32 + len(a.v.Data) }

type firstAcc struct {
	v    Value
	seen bool
}

func (a *firstAcc) add(v Value) {
	if !a.seen {
		a.v, a.seen = clone(v), true
	}
}

func (a *firstAcc) result() (Value, error) {
	if a.v.Type == 0 {
		return null, nil
	}
	return a.v, nil
}

func (a *firstAcc) size() int { return 32 + len(a.v.Data) }

type lastAcc struct{ v Value }

func (a *lastAcc) add(v Value) { a.v = clone(v) }

func (a *lastAcc) result() (Value, error) {
	if a.v.Type == 0 {
		return null, nil
	}
	return a.v, nil
}

func (a *lastAcc) size() int { return 32 + len(a.v.Data) }

// pushAcc is $push, and with set $addToSet: missing values are left out.
type pushAcc struct {
	vals  []Value
	set   map[string]bool
	bytes int
}

func (a *pushAcc) add(v Value) {
	if v.Type == 0 {
		return
	}
	if a.set != nil {
		k := string(groupKey(nil, v))
		if a.set[k] {
			return
		}
		a.set[k] = true
	}
	a.vals = append(a.vals, clone(v))
	a.bytes += 16 + len(v.Data)
}

func (a *pushAcc) result() (Value, error) {
	idx, arr := bsoncore.AppendArrayStart(nil)
	for i, v := range a.vals {
		arr = bsoncore.AppendValueElement(arr, bsonutil.Itoa(i), v)
	}
	arr, _ = bsoncore.AppendArrayEnd(arr, idx)
	return Value{Type: bsoncore.TypeArray, Data: arr}, nil
}

func (a *pushAcc) size() int { return 32 + a.bytes*2 }
