package value

import (
	"math"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
)

// Accumulator is one $group field's state for one group.
type Accumulator interface {
	Add(v Value)
	Result() (Value, error)
	// Size is about how many bytes it holds, for the memory budget.
	Size() int
}

// sumAcc is $sum (and $avg, and $count): numbers summed as MongoDB sums
// them, non-numbers ignored. Integers are summed exactly while they fit
// an int64; doubles in double-double precision (twoSum), which is
// MongoDB's DoubleDoubleSummation.
type sumAcc struct {
	avg      bool
	kind     NumKind
	n        int64 // numbers added
	long     int64
	overflow bool
	hi, lo   float64 // double-double sum of every number
	special  float64 // the sum of the infinities and NaNs
	decimal  bool
}

func (a *sumAcc) Add(v Value) {
	k, i, f, ok := Number(v)
	if !ok {
		return
	}
	if k == KindDecimal {
		a.decimal = true
		return
	}
	a.n++
	a.kind = max(a.kind, k)
	if k == KindDouble {
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

func (a *sumAcc) Result() (Value, error) {
	if a.decimal {
		return Missing, Unsupported("a $sum or $avg over decimal128 values")
	}
	if a.avg {
		if a.n == 0 {
			return Null, nil
		}
		if a.kind != KindDouble && !a.overflow {
			return DoubleValue(float64(a.long) / float64(a.n)), nil
		}
		return DoubleValue(a.double() / float64(a.n)), nil
	}
	switch {
	case a.n == 0:
		return Int32Value(0), nil
	case a.kind == KindDouble || a.overflow:
		return DoubleValue(a.double()), nil
	case a.kind == KindInt32 && a.long >= math.MinInt32 && a.long <= math.MaxInt32:
		return Int32Value(int32(a.long)), nil
	}
	return Int64Value(a.long), nil
}

func (a *sumAcc) Size() int { return 64 }

// extremeAcc is $min or $max: BSON order; null and missing ignored.
type extremeAcc struct {
	max bool
	v   Value
}

func (a *extremeAcc) Add(v Value) {
	if IsNullish(v) {
		return
	}
	if a.v.Type == 0 || (Compare(v, a.v) > 0) == a.max && Compare(v, a.v) != 0 {
		a.v = Clone(v)
	}
}

func (a *extremeAcc) Result() (Value, error) {
	if a.v.Type == 0 {
		return Null, nil
	}
	return a.v, nil
}

func (a *extremeAcc) Size() int { return 32 + len(a.v.Data) }

type firstAcc struct {
	v    Value
	seen bool
}

func (a *firstAcc) Add(v Value) {
	if !a.seen {
		a.v, a.seen = Clone(v), true
	}
}

func (a *firstAcc) Result() (Value, error) {
	if a.v.Type == 0 {
		return Null, nil
	}
	return a.v, nil
}

func (a *firstAcc) Size() int { return 32 + len(a.v.Data) }

type lastAcc struct{ v Value }

func (a *lastAcc) Add(v Value) { a.v = Clone(v) }

func (a *lastAcc) Result() (Value, error) {
	if a.v.Type == 0 {
		return Null, nil
	}
	return a.v, nil
}

func (a *lastAcc) Size() int { return 32 + len(a.v.Data) }

// pushAcc is $push, and with set $addToSet: missing values are left out.
type pushAcc struct {
	vals  []Value
	set   map[string]bool
	bytes int
}

func (a *pushAcc) Add(v Value) {
	if v.Type == 0 {
		return
	}
	if a.set != nil {
		k := string(GroupKey(nil, v))
		if a.set[k] {
			return
		}
		a.set[k] = true
	}
	a.vals = append(a.vals, Clone(v))
	a.bytes += 16 + len(v.Data)
}

func (a *pushAcc) Result() (Value, error) {
	idx, arr := bsoncore.AppendArrayStart(nil)
	for i, v := range a.vals {
		arr = bsoncore.AppendValueElement(arr, bsonutil.Itoa(i), v)
	}
	arr, _ = bsoncore.AppendArrayEnd(arr, idx)
	return Value{Type: bsoncore.TypeArray, Data: arr}, nil
}

func (a *pushAcc) Size() int { return 32 + a.bytes*2 }

// NewAccumulator is a new state of $group accumulator op, nil if op is
// not one the engine runs.
func NewAccumulator(op string) Accumulator {
	switch op {
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
