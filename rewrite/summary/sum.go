package summary

import (
	"math"
	"math/big"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// sumState adds bucket sums as MongoDB's $sum adds events: integers
// exactly, doubles with compensation, and the result's type from the
// widest input type. It also gathers what proves a sum of doubles exact
// (see exact) and what $avg divides by.
type sumState struct {
	ints            big.Int
	dbl, comp       float64
	hasLong, hasDbl bool
	longSeen        bool // an int64 event is certain

	n         int64   // values summed (when nKnown)
	nUnknown  bool    // a bucket without counts for every event
	low       int32   // lowest set bit of any value summed
	lowUnsure bool    // a bucket whose values' low bit is not known
	bound     float64 // no partial sum of the values exceeds it in magnitude
}

func (s *sumState) add(b *bucketSummary, field string) bool {
	v, ok := bsonutil.Lookup(b.sum, field)
	if !ok {
		// No event of the bucket has the field, if counts says so too.
		_, counted := bsonutil.Lookup(b.counts, field)
		s.nUnknown = s.nUnknown || !b.complete() || counted
		return true
	}
	if !sumTrusted(b, field, v.Type) {
		return false
	}
	s.addCounts(b, field, v.Type)
	switch v.Type {
	case bsoncore.TypeInt32:
		s.ints.Add(&s.ints, big.NewInt(int64(v.Int32())))
	case bsoncore.TypeInt64:
		s.ints.Add(&s.ints, big.NewInt(v.Int64()))
		s.hasLong = true
		for _, d := range []bsoncore.Document{b.min, b.max} {
			if x, ok := bsonutil.Lookup(d, field); ok && x.Type == bsoncore.TypeInt64 {
				s.longSeen = true
			}
		}
	case bsoncore.TypeDouble:
		s.hasDbl = true
		s.addDouble(v.Double())
	default:
		return false
	}
	return true
}

// sumTrusted reports whether a bucket's integer sum cannot have wrapped:
// FerretDB's $inc wraps an int32 (and int64) sum on overflow instead of
// widening it (verified: 2e9 + 2e9 stored as -294967296). With every
// event's value within [min, max] and at most count of them, no partial
// sum leaves ±max(|min|, |max|)·count, so a bound inside the type's range
// proves the stored sum exact. A double sum may have been an int32 sum
// that wrapped before a double event joined it: it gets the int32 bound.
func sumTrusted(b *bucketSummary, field string, t bsoncore.Type) bool {
	limit := 0.0
	switch t {
	case bsoncore.TypeInt32, bsoncore.TypeDouble:
		limit = math.MaxInt32
	case bsoncore.TypeInt64:
		limit = math.MaxInt64 / 2 // float rounding margin
	default:
		return true
	}
	bound := 0.0
	for _, d := range []bsoncore.Document{b.min, b.max} {
		x, ok := bsonutil.Lookup(d, field)
		if !ok {
			return false
		}
		f, ok := x.AsFloat64OK()
		if !ok {
			return false
		}
		bound = math.Max(bound, math.Abs(f))
	}
	return bound*float64(b.count) <= limit
}

// addCounts learns the bucket's count of values, their lowest set bit and
// a bound of their magnitude. Without counts, integers still have a low
// bit of at least 2^0; doubles have none known.
func (s *sumState) addCounts(b *bucketSummary, field string, t bsoncore.Type) {
	n := b.count
	nv, okN := bsonutil.Lookup(b.counts, field)
	lv, okL := bsonutil.Lookup(b.lowBit, field)
	if b.complete() && okN && okL {
		n, _ = bsonutil.WholeNumber(nv)
		low, _ := bsonutil.WholeNumber(lv)
		s.low = min(s.low, int32(max(min(low, bucket.LowBitZero), bucket.LowBitSpecial)))
	} else {
		s.nUnknown = true
		if t == bsoncore.TypeDouble {
			s.lowUnsure = true
		} else {
			s.low = min(s.low, 0)
		}
	}
	s.n += n
	s.bound += float64(n) * maxAbs(b, field)
}

// maxAbs is the largest magnitude of a bucket's values of field (+Inf
// when min or max is missing or not a number).
func maxAbs(b *bucketSummary, field string) float64 {
	m := 0.0
	for _, d := range []bsoncore.Document{b.min, b.max} {
		x, ok := bsonutil.Lookup(d, field)
		if !ok {
			return math.Inf(1)
		}
		f, ok := x.AsFloat64OK()
		if !ok {
			return math.Inf(1)
		}
		m = math.Max(m, math.Abs(f))
	}
	return m
}

// exact reports whether the values' sum is the same in every order of
// addition, in plain doubles ($inc of the bucket sums) and in MongoDB's
// double-double summation alike: every value is a multiple of 2^low and
// no partial sum reaches 2^(low+53), so every partial sum is a double and
// no addition rounds. MongoDB returns the double-double's high part,
// which depends on the order of the events otherwise (and bucket sums
// kept by $inc lose the low parts), so a sum not proven exact declines.
func (s *sumState) exact() bool {
	if s.lowUnsure {
		return false
	}
	if s.low >= bucket.LowBitZero {
		return true // only zeros
	}
	// The margin covers the rounding of bound itself.
	return s.bound*(1+1e-9) < math.Ldexp(1, int(s.low)+53)
}

// avg is MongoDB's $avg: the double-double sum (here exact) divided by the
// number of numeric values, a double; null when there were none.
func (s *sumState) avg() (bsoncore.Value, bool) {
	if s.nUnknown {
		return bsoncore.Value{}, false
	}
	if s.n == 0 {
		return bsoncore.Value{Type: bsoncore.TypeNull}, true
	}
	if !s.exact() {
		return bsoncore.Value{}, false
	}
	return doubleValue(s.total() / float64(s.n)), true
}

// total is the exact sum as a double (exact() holds).
func (s *sumState) total() float64 {
	f, _ := new(big.Float).SetInt(&s.ints).Float64()
	return f + (s.dbl + s.comp)
}

// addDouble is Neumaier's compensated summation.
func (s *sumState) addDouble(x float64) {
	t := s.dbl + x
	if math.Abs(s.dbl) >= math.Abs(x) {
		s.comp += (s.dbl - t) + x
	} else {
		s.comp += (x - t) + s.dbl
	}
	s.dbl = t
}

// value is the $sum MongoDB returns: a double when any input was a double
// or the integer total leaves int64; an int64 when any input was; else an
// int32 when the total fits. A bucket's int64 sum may come from int32
// events that overflowed an int32 partial sum, so an int64 sum with a
// total that fits an int32 is only answered when an int64 event is
// certain (a bucket's min or max is one).
func (s *sumState) value() (bsoncore.Value, bool) {
	if s.hasDbl {
		if !s.exact() {
			return bsoncore.Value{}, false
		}
		return doubleValue(s.total()), true
	}
	if !s.ints.IsInt64() {
		f, _ := new(big.Float).SetInt(&s.ints).Float64()
		return doubleValue(f), true
	}
	n := s.ints.Int64()
	fits32 := n >= math.MinInt32 && n <= math.MaxInt32
	switch {
	case s.hasLong && fits32 && !s.longSeen:
		return bsoncore.Value{}, false
	case s.hasLong || !fits32:
		return bsonutil.Int64Value(n), true
	}
	return bsoncore.Value{Type: bsoncore.TypeInt32, Data: bsoncore.AppendInt32(nil, int32(n))}, true
}

func doubleValue(f float64) bsoncore.Value {
	return bsoncore.Value{Type: bsoncore.TypeDouble, Data: bsoncore.AppendDouble(nil, f)}
}

// countValue is $sum of a constant 1 (or $count) over n events.
func countValue(n int64, one bsoncore.Type) bsoncore.Value {
	switch {
	case one == bsoncore.TypeDouble:
		return doubleValue(float64(n))
	case one == bsoncore.TypeInt64 || n > math.MaxInt32:
		return bsonutil.Int64Value(n)
	}
	return bsoncore.Value{Type: bsoncore.TypeInt32, Data: bsoncore.AppendInt32(nil, int32(n))}
}
