package bucket

import (
	"math"
	"math/bits"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// Summary is what a bucket records about a chunk of events besides
// the events themselves.
type Summary struct {
	Count            int
	Bytes            int64
	MinTime, MaxTime int64
	Aggs             []AggSummary // per limits.aggregates
}

type AggSummary struct {
	// Mixed: some event of the chunk holds a value other than a number
	// there (a string, null, ...). Such values are stored with their
	// events but left out of min, max, sum and counts, which then cannot
	// answer for the field: the bucket says so (FieldMixed).
	Mixed    bool
	Present  bool // some event of the chunk has a number in the field
	Min, Max bsoncore.Value
	Sum      Num
	N        int   // events with the field: the values summed
	LowBit   int32 // lowest set bit of any value summed (see LowBitOf)
}

// Summarize computes count, bytes, time range and the aggregates' min, max
// and sum of a chunk exactly as $min, $max and $inc would if its events
// were applied one by one, in order (ties keep the first value, as $min
// and $max replace only on strictly smaller or larger).
func Summarize(chunk []Event, lim Limits) Summary {
	s := Summary{Aggs: make([]AggSummary, len(lim.Aggregates))}
	for n, ev := range chunk {
		s.Count++
		s.Bytes += int64(len(ev.Stored))
		if n == 0 || ev.Time < s.MinTime {
			s.MinTime = ev.Time
		}
		if n == 0 || ev.Time > s.MaxTime {
			s.MaxTime = ev.Time
		}
		for i, v := range ev.Aggs {
			if v.Type == 0 {
				continue
			}
			a := &s.Aggs[i]
			// NaN and the infinities too: FerretDB v1.24 refuses to store
			// an infinity and closes its connection on a NaN, so a
			// bucket's min, max or sum must not hold one (the events keep
			// them, packed; reads of the field then use the events).
			if !IsAggregatable(v.Type) || nonFinite(v) {
				a.Mixed = true
				continue
			}
			if !a.Present {
				*a = AggSummary{Mixed: a.Mixed, Present: true, Min: v, Max: v, Sum: NumFrom(v), N: 1, LowBit: LowBitOf(v)}
				continue
			}
			a.N++
			a.LowBit = min(a.LowBit, LowBitOf(v))
			if bsonutil.Compare(v, a.Min) < 0 {
				a.Min = v
			}
			if bsonutil.Compare(v, a.Max) > 0 {
				a.Max = v
			}
			a.Sum = AddNums(a.Sum, NumFrom(v))
		}
	}
	return s
}

func nonFinite(v bsoncore.Value) bool {
	f, ok := v.DoubleOK()
	return ok && (math.IsNaN(f) || math.IsInf(f, 0))
}

// Bounds of LowBitOf: no finite nonzero double has a bit below 2^-1074
// or above 2^1023, so a zero takes a value above every real one (it
// constrains nothing) and NaN and the infinities one below (they make
// every sum inexact, see rewrite/summary, sumState.exact).
const (
	LowBitZero    = 2000
	LowBitSpecial = -2000
)

// LowBitOf is the exponent of the lowest set bit of a number: v is a
// multiple of 2^LowBitOf(v). The read path uses the minimum over a
// bucket's values to prove a sum of doubles exact (no addition rounded),
// whatever order MongoDB would add them in.
func LowBitOf(v bsoncore.Value) int32 {
	n := NumFrom(v)
	if n.T != bsoncore.TypeDouble {
		if n.I == 0 {
			return LowBitZero
		}
		return int32(bits.TrailingZeros64(uint64(n.I)))
	}
	switch {
	case n.F == 0:
		return LowBitZero
	case math.IsNaN(n.F) || math.IsInf(n.F, 0):
		return LowBitSpecial
	}
	b := math.Float64bits(n.F)
	mant, exp := b&(1<<52-1), int32(b>>52&0x7ff)
	if exp == 0 { // subnormal
		return -1074 + int32(bits.TrailingZeros64(mant))
	}
	return exp - 1075 + int32(bits.TrailingZeros64(mant|1<<52))
}

// Num is a BSON number being summed with $inc's type rules.
type Num struct {
	T bsoncore.Type // TypeInt32, TypeInt64 or TypeDouble
	I int64
	F float64
}

func NumFrom(v bsoncore.Value) Num {
	switch v.Type {
	case bsoncore.TypeInt32:
		i, _ := v.Int32OK()
		return Num{T: bsoncore.TypeInt32, I: int64(i)}
	case bsoncore.TypeInt64:
		i, _ := v.Int64OK()
		return Num{T: bsoncore.TypeInt64, I: i}
	default:
		f, _ := v.DoubleOK()
		return Num{T: bsoncore.TypeDouble, F: f}
	}
}

func (n Num) Float() float64 {
	if n.T == bsoncore.TypeDouble {
		return n.F
	}
	return float64(n.I)
}

// AddNums adds as MongoDB's $inc does: any double makes a double;
// int32+int32 is an int32 unless it overflows into an int64; a sum with an
// int64 is an int64 unless it overflows into a double.
func AddNums(a, b Num) Num {
	if a.T == bsoncore.TypeDouble || b.T == bsoncore.TypeDouble {
		return Num{T: bsoncore.TypeDouble, F: a.Float() + b.Float()}
	}
	sum := a.I + b.I
	if a.T == bsoncore.TypeInt32 && b.T == bsoncore.TypeInt32 {
		if sum >= math.MinInt32 && sum <= math.MaxInt32 {
			return Num{T: bsoncore.TypeInt32, I: sum}
		}
		return Num{T: bsoncore.TypeInt64, I: sum} // cannot overflow int64
	}
	if (a.I >= 0) == (b.I >= 0) && (sum >= 0) != (a.I >= 0) {
		return Num{T: bsoncore.TypeDouble, F: float64(a.I) + float64(b.I)}
	}
	return Num{T: bsoncore.TypeInt64, I: sum}
}

func AppendNum(dst []byte, key string, n Num) []byte {
	switch n.T {
	case bsoncore.TypeInt32:
		return bsoncore.AppendInt32Element(dst, key, int32(n.I))
	case bsoncore.TypeInt64:
		return bsoncore.AppendInt64Element(dst, key, n.I)
	default:
		return bsoncore.AppendDoubleElement(dst, key, n.F)
	}
}

// AppendExtremes appends {prefix<timeField>: date, prefix<agg>: v, ...} for
// the min side, or the max side when useMax; prefix is "" inside a complete
// bucket's min/max documents and "min."/"max." in a $min/$max update.
func AppendExtremes(dst []byte, prefix, timeField string, s Summary, lim Limits, useMax bool) []byte {
	t := s.MinTime
	if useMax {
		t = s.MaxTime
	}
	dst = bsoncore.AppendDateTimeElement(dst, prefix+timeField, t)
	for i, a := range s.Aggs {
		if !a.Present {
			continue
		}
		v := a.Min
		if useMax {
			v = a.Max
		}
		dst = bsoncore.AppendValueElement(dst, prefix+lim.Aggregates[i], v)
	}
	return dst
}

func AppendSums(dst []byte, prefix string, s Summary, lim Limits) []byte {
	for i, a := range s.Aggs {
		if a.Present {
			dst = AppendNum(dst, prefix+lim.Aggregates[i], a.Sum)
		}
	}
	return dst
}

// AppendCounts appends the values summed per aggregate field (for $avg
// and exactness, see DESIGN.md "Bucket document"), prefixed as
// AppendSums.
func AppendCounts(dst []byte, prefix string, s Summary, lim Limits) []byte {
	for i, a := range s.Aggs {
		if a.Present {
			dst = bsoncore.AppendInt32Element(dst, prefix+lim.Aggregates[i], int32(a.N))
		}
	}
	return dst
}

func AppendLowBits(dst []byte, prefix string, s Summary, lim Limits) []byte {
	for i, a := range s.Aggs {
		if a.Present {
			dst = bsoncore.AppendInt32Element(dst, prefix+lim.Aggregates[i], a.LowBit)
		}
	}
	return dst
}

func hasAggregates(s Summary) bool {
	for _, a := range s.Aggs {
		if a.Present {
			return true
		}
	}
	return false
}

// Fields of the bucket document that let the summaries answer $avg and
// sums of doubles (see DESIGN.md "Bucket document"). They were added to
// the stored format later, so a bucket may lack them, or (an older bucket
// that newer upserts joined) hold them for only some of its events:
// counted tells, as it equals count only when every event was counted.
const (
	FieldCounted = "counted" // events written with counts and lowBit
	// FieldMixed is {<aggregate field>: true} for the fields some event of
	// the bucket holds a non-number in: the summaries leave those values
	// out, so they cannot answer for the field.
	FieldMixed  = "mixed"
	FieldCounts = "counts" // {<aggregate field>: values summed}
	FieldLowBit = "lowBit" // {<aggregate field>: $min of LowBitOf}
	// FieldSummed is {<aggregate field>: true} for the fields whose min,
	// max and mixed cover every event of the bucket: the aggregates of
	// the rule that created it. A field added to a rule's aggregates
	// later is not in its older buckets' (nor in those the newer upserts
	// joined), so a read prunes buckets by a field's summaries only where
	// this says they are whole (rewrite/query, Prune).
	FieldSummed = "summed"
)

// AppendSummed appends <prefix><field>: true for each aggregate field of
// lim (see FieldSummed).
func AppendSummed(dst []byte, prefix string, lim Limits) []byte {
	for _, a := range lim.Aggregates {
		dst = bsoncore.AppendBooleanElement(dst, prefix+a, true)
	}
	return dst
}

// AppendMixed appends <prefix><field>: true for each aggregate field the
// chunk holds a non-number in (see FieldMixed).
func AppendMixed(dst []byte, prefix string, s Summary, lim Limits) []byte {
	for i, a := range s.Aggs {
		if a.Mixed {
			dst = bsoncore.AppendBooleanElement(dst, prefix+lim.Aggregates[i], true)
		}
	}
	return dst
}

// HasMixed reports whether the chunk holds a non-number in an aggregate
// field.
func (s Summary) HasMixed() bool {
	for _, a := range s.Aggs {
		if a.Mixed {
			return true
		}
	}
	return false
}
