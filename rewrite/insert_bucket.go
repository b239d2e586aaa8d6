package rewrite

import (
	"math"
	"math/bits"
	"strconv"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"

	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// chunkSummary is what a bucket records about a chunk of events besides
// the events themselves.
type chunkSummary struct {
	count            int
	bytes            int64
	minTime, maxTime int64
	aggs             []aggSummary // per limits.aggregates
}

type aggSummary struct {
	present  bool // some event of the chunk has the field
	min, max bsoncore.Value
	sum      numValue
	n        int   // events with the field: the values summed
	lowBit   int32 // lowest set bit of any value summed (see lowBitOf)
}

// summarize computes count, bytes, time range and the aggregates' min, max
// and sum of a chunk exactly as $min, $max and $inc would if its events
// were applied one by one, in order (ties keep the first value, as $min
// and $max replace only on strictly smaller or larger).
func summarize(chunk []event, lim limits) chunkSummary {
	s := chunkSummary{aggs: make([]aggSummary, len(lim.aggregates))}
	for n, ev := range chunk {
		s.count++
		s.bytes += int64(len(ev.stored))
		if n == 0 || ev.time < s.minTime {
			s.minTime = ev.time
		}
		if n == 0 || ev.time > s.maxTime {
			s.maxTime = ev.time
		}
		for i, v := range ev.aggs {
			if v.Type == 0 {
				continue
			}
			a := &s.aggs[i]
			if !a.present {
				*a = aggSummary{present: true, min: v, max: v, sum: numFrom(v), n: 1, lowBit: lowBitOf(v)}
				continue
			}
			a.n++
			a.lowBit = min(a.lowBit, lowBitOf(v))
			if bsonutil.Compare(v, a.min) < 0 {
				a.min = v
			}
			if bsonutil.Compare(v, a.max) > 0 {
				a.max = v
			}
			a.sum = addNums(a.sum, numFrom(v))
		}
	}
	return s
}

// Bounds of lowBitOf: no finite nonzero double has a bit below 2^-1074
// or above 2^1023, so a zero takes a value above every real one (it
// constrains nothing) and NaN and the infinities one below (they make
// every sum inexact, see rewrite/read_summary_exec.go exactDoubles).
const (
	lowBitZero    = 2000
	lowBitSpecial = -2000
)

// lowBitOf is the exponent of the lowest set bit of a number: v is a
// multiple of 2^lowBitOf(v). The read path uses the minimum over a
// bucket's values to prove a sum of doubles exact (no addition rounded),
// whatever order MongoDB would add them in.
func lowBitOf(v bsoncore.Value) int32 {
	n := numFrom(v)
	if n.t != bsoncore.TypeDouble {
		if n.i == 0 {
			return lowBitZero
		}
		return int32(bits.TrailingZeros64(uint64(n.i)))
	}
	switch {
	case n.f == 0:
		return lowBitZero
	case math.IsNaN(n.f) || math.IsInf(n.f, 0):
		return lowBitSpecial
	}
	b := math.Float64bits(n.f)
	mant, exp := b&(1<<52-1), int32(b>>52&0x7ff)
	if exp == 0 { // subnormal
		return -1074 + int32(bits.TrailingZeros64(mant))
	}
	return exp - 1075 + int32(bits.TrailingZeros64(mant|1<<52))
}

// numValue is a BSON number being summed with $inc's type rules.
type numValue struct {
	t bsoncore.Type // TypeInt32, TypeInt64 or TypeDouble
	i int64
	f float64
}

func numFrom(v bsoncore.Value) numValue {
	switch v.Type {
	case bsoncore.TypeInt32:
		i, _ := v.Int32OK()
		return numValue{t: bsoncore.TypeInt32, i: int64(i)}
	case bsoncore.TypeInt64:
		i, _ := v.Int64OK()
		return numValue{t: bsoncore.TypeInt64, i: i}
	default:
		f, _ := v.DoubleOK()
		return numValue{t: bsoncore.TypeDouble, f: f}
	}
}

func (n numValue) float() float64 {
	if n.t == bsoncore.TypeDouble {
		return n.f
	}
	return float64(n.i)
}

// addNums adds as MongoDB's $inc does: any double makes a double;
// int32+int32 is an int32 unless it overflows into an int64; a sum with an
// int64 is an int64 unless it overflows into a double.
func addNums(a, b numValue) numValue {
	if a.t == bsoncore.TypeDouble || b.t == bsoncore.TypeDouble {
		return numValue{t: bsoncore.TypeDouble, f: a.float() + b.float()}
	}
	sum := a.i + b.i
	if a.t == bsoncore.TypeInt32 && b.t == bsoncore.TypeInt32 {
		if sum >= math.MinInt32 && sum <= math.MaxInt32 {
			return numValue{t: bsoncore.TypeInt32, i: sum}
		}
		return numValue{t: bsoncore.TypeInt64, i: sum} // cannot overflow int64
	}
	if (a.i >= 0) == (b.i >= 0) && (sum >= 0) != (a.i >= 0) {
		return numValue{t: bsoncore.TypeDouble, f: float64(a.i) + float64(b.i)}
	}
	return numValue{t: bsoncore.TypeInt64, i: sum}
}

func appendNumElement(dst []byte, key string, n numValue) []byte {
	switch n.t {
	case bsoncore.TypeInt32:
		return bsoncore.AppendInt32Element(dst, key, int32(n.i))
	case bsoncore.TypeInt64:
		return bsoncore.AppendInt64Element(dst, key, n.i)
	default:
		return bsoncore.AppendDoubleElement(dst, key, n.f)
	}
}

// appendEventsArray appends the chunk's stored events as an array.
func appendEventsArray(dst []byte, key string, chunk []event) []byte {
	idx, dst := bsoncore.AppendArrayElementStart(dst, key)
	for i, ev := range chunk {
		dst = bsoncore.AppendDocumentElement(dst, strconv.Itoa(i), ev.stored)
	}
	dst, _ = bsoncore.AppendArrayEnd(dst, idx)
	return dst
}

// appendExtremes appends {prefix<timeField>: date, prefix<agg>: v, ...} for
// the min side, or the max side when useMax; prefix is "" inside a complete
// bucket's min/max documents and "min."/"max." in a $min/$max update.
func appendExtremes(dst []byte, prefix, timeField string, s chunkSummary, lim limits, useMax bool) []byte {
	t := s.minTime
	if useMax {
		t = s.maxTime
	}
	dst = bsoncore.AppendDateTimeElement(dst, prefix+timeField, t)
	for i, a := range s.aggs {
		if !a.present {
			continue
		}
		v := a.min
		if useMax {
			v = a.max
		}
		dst = bsoncore.AppendValueElement(dst, prefix+lim.aggregates[i], v)
	}
	return dst
}

func appendSums(dst []byte, prefix string, s chunkSummary, lim limits) []byte {
	for i, a := range s.aggs {
		if a.present {
			dst = appendNumElement(dst, prefix+lim.aggregates[i], a.sum)
		}
	}
	return dst
}

// appendCounts appends the values summed per aggregate field (for $avg
// and exactness, see DESIGN.md "Bucket document"), prefixed as
// appendSums.
func appendCounts(dst []byte, prefix string, s chunkSummary, lim limits) []byte {
	for i, a := range s.aggs {
		if a.present {
			dst = bsoncore.AppendInt32Element(dst, prefix+lim.aggregates[i], int32(a.n))
		}
	}
	return dst
}

func appendLowBits(dst []byte, prefix string, s chunkSummary, lim limits) []byte {
	for i, a := range s.aggs {
		if a.present {
			dst = bsoncore.AppendInt32Element(dst, prefix+lim.aggregates[i], a.lowBit)
		}
	}
	return dst
}

func hasAggregates(s chunkSummary) bool {
	for _, a := range s.aggs {
		if a.present {
			return true
		}
	}
	return false
}

// completeBucket builds a whole bucket document for a chunk large enough to
// stand alone (see DESIGN.md). "sum" is left out when no event carries an
// aggregate, as the upsert path would leave it out.
func completeBucket(id bson.ObjectID, chunk []event, rule *rules.Rule, lim limits) bsoncore.Document {
	s := summarize(chunk, lim)
	idx, doc := bsoncore.AppendDocumentStart(nil)
	doc = bsoncore.AppendObjectIDElement(doc, rules.BucketID, id)
	doc = bsoncore.AppendValueElement(doc, rules.BucketMeta, chunk[0].meta)
	doc = bsoncore.AppendDateTimeElement(doc, rules.BucketStart, chunk[0].start)
	doc = bsoncore.AppendInt32Element(doc, rules.BucketCount, int32(s.count))
	doc = bsoncore.AppendInt32Element(doc, rules.BucketBytes, int32(s.bytes))

	sub, doc := bsoncore.AppendDocumentElementStart(doc, rules.BucketMin)
	doc = appendExtremes(doc, "", rule.TimeField, s, lim, false)
	doc, _ = bsoncore.AppendDocumentEnd(doc, sub)
	sub, doc = bsoncore.AppendDocumentElementStart(doc, rules.BucketMax)
	doc = appendExtremes(doc, "", rule.TimeField, s, lim, true)
	doc, _ = bsoncore.AppendDocumentEnd(doc, sub)
	if len(lim.aggregates) > 0 {
		doc = bsoncore.AppendInt32Element(doc, BucketCounted, int32(s.count))
	}
	if hasAggregates(s) {
		sub, doc = bsoncore.AppendDocumentElementStart(doc, rules.BucketSum)
		doc = appendSums(doc, "", s, lim)
		doc, _ = bsoncore.AppendDocumentEnd(doc, sub)
		sub, doc = bsoncore.AppendDocumentElementStart(doc, BucketCounts)
		doc = appendCounts(doc, "", s, lim)
		doc, _ = bsoncore.AppendDocumentEnd(doc, sub)
		sub, doc = bsoncore.AppendDocumentElementStart(doc, BucketLowBit)
		doc = appendLowBits(doc, "", s, lim)
		doc, _ = bsoncore.AppendDocumentEnd(doc, sub)
	}
	doc = appendEventsArray(doc, rules.BucketEvents, chunk)
	doc, _ = bsoncore.AppendDocumentEnd(doc, idx)
	return doc
}

// upsertStatement builds the update statement that adds a chunk to the
// bucket with _id id, creating it when it does not exist:
//
//	q: {_id: id, count: {$lte: maxEvents-k}, bytes: {$lte: maxBytes-b}}
//	u: {$setOnInsert: {meta: M, start: S}, $push: {events: {$each: [...]}},
//	    $inc: {count: k, bytes: b, sum.<agg>: s},
//	    $min: {min.<time>: t, min.<agg>: v}, $max: {...}}
//	upsert: true
//
// With idOnly (an upstream that pushes only {_id: X} filters down to its
// storage, see Caps.IDOnlyFilters) q is {_id: id} alone: the caller's fill
// is exact there. Otherwise the count/bytes guard makes an upsert into a
// bucket that turned out full try to insert _id id again: a duplicate key,
// which Retry re-plans at the next seq, so no bucket ever overfills.
//
// A null meta is set with $set rather than $setOnInsert: FerretDB's
// $setOnInsert skips null values, and $set of the same null on an existing
// bucket changes nothing.
func upsertStatement(id bson.ObjectID, chunk []event, lim limits, timeField string, idOnly bool) bsoncore.Document {
	s := summarize(chunk, lim)
	idx, doc := bsoncore.AppendDocumentStart(nil)

	q, doc := bsoncore.AppendDocumentElementStart(doc, "q")
	doc = bsoncore.AppendObjectIDElement(doc, rules.BucketID, id)
	if !idOnly {
		doc = appendLTE(doc, rules.BucketCount, int64(lim.maxEvents-s.count))
		doc = appendLTE(doc, rules.BucketBytes, lim.maxBytes-s.bytes)
	}
	doc, _ = bsoncore.AppendDocumentEnd(doc, q)

	u, doc := bsoncore.AppendDocumentElementStart(doc, "u")
	meta := chunk[0].meta
	if meta.Type == bsoncore.TypeNull {
		op, d := bsoncore.AppendDocumentElementStart(doc, "$set")
		d = bsoncore.AppendNullElement(d, rules.BucketMeta)
		doc, _ = bsoncore.AppendDocumentEnd(d, op)
	}
	op, doc := bsoncore.AppendDocumentElementStart(doc, "$setOnInsert")
	if meta.Type != bsoncore.TypeNull {
		doc = bsoncore.AppendValueElement(doc, rules.BucketMeta, meta)
	}
	doc = bsoncore.AppendDateTimeElement(doc, rules.BucketStart, chunk[0].start)
	doc, _ = bsoncore.AppendDocumentEnd(doc, op)

	op, doc = bsoncore.AppendDocumentElementStart(doc, "$push")
	each, doc := bsoncore.AppendDocumentElementStart(doc, rules.BucketEvents)
	doc = appendEventsArray(doc, "$each", chunk)
	doc, _ = bsoncore.AppendDocumentEnd(doc, each)
	doc, _ = bsoncore.AppendDocumentEnd(doc, op)

	op, doc = bsoncore.AppendDocumentElementStart(doc, "$inc")
	doc = bsoncore.AppendInt32Element(doc, rules.BucketCount, int32(s.count))
	doc = bsoncore.AppendInt32Element(doc, rules.BucketBytes, int32(s.bytes))
	doc = appendSums(doc, rules.BucketSum+".", s, lim)
	if len(lim.aggregates) > 0 {
		doc = bsoncore.AppendInt32Element(doc, BucketCounted, int32(s.count))
		doc = appendCounts(doc, BucketCounts+".", s, lim)
	}
	doc, _ = bsoncore.AppendDocumentEnd(doc, op)

	op, doc = bsoncore.AppendDocumentElementStart(doc, "$min")
	doc = appendExtremes(doc, rules.BucketMin+".", timeField, s, lim, false)
	doc = appendLowBits(doc, BucketLowBit+".", s, lim)
	doc, _ = bsoncore.AppendDocumentEnd(doc, op)
	op, doc = bsoncore.AppendDocumentElementStart(doc, "$max")
	doc = appendExtremes(doc, rules.BucketMax+".", timeField, s, lim, true)
	doc, _ = bsoncore.AppendDocumentEnd(doc, op)
	doc, _ = bsoncore.AppendDocumentEnd(doc, u)

	doc = bsoncore.AppendBooleanElement(doc, "upsert", true)
	doc, _ = bsoncore.AppendDocumentEnd(doc, idx)
	return doc
}

// Fields of the bucket document that let the summaries answer $avg and
// sums of doubles (see DESIGN.md "Bucket document"). They were added to
// the stored format later, so a bucket may lack them, or (an older bucket
// that newer upserts joined) hold them for only some of its events:
// counted tells, as it equals count only when every event was counted.
const (
	BucketCounted = "counted" // events written with counts and lowBit
	BucketCounts  = "counts"  // {<aggregate field>: values summed}
	BucketLowBit  = "lowBit"  // {<aggregate field>: $min of lowBitOf}
)

// appendLTE appends key: {$lte: n}, n as an int32 when it fits (it does
// for every valid rule) so filters look like what a person would write.
func appendLTE(dst []byte, key string, n int64) []byte {
	sub, dst := bsoncore.AppendDocumentElementStart(dst, key)
	if n >= math.MinInt32 && n <= math.MaxInt32 {
		dst = bsoncore.AppendInt32Element(dst, "$lte", int32(n))
	} else {
		dst = bsoncore.AppendInt64Element(dst, "$lte", n)
	}
	dst, _ = bsoncore.AppendDocumentEnd(dst, sub)
	return dst
}

// session is what of the client's session the rewrite uses.
type session struct {
	hasTxnNumber  bool
	inTransaction bool
}

func readSession(body bsoncore.Document) session {
	var s session
	if v, ok := bsonutil.Lookup(body, "txnNumber"); ok && (v.Type == bsoncore.TypeInt64 || v.Type == bsoncore.TypeInt32) {
		_, s.hasTxnNumber = v.AsInt64OK()
	}
	s.inTransaction = inTransaction(body)
	return s
}

// retryable: a retryable write (not a transaction statement), the only case
// where the server may see the same statements twice and must recognise
// them by their stmtIds.
func (s session) retryable() bool { return s.hasTxnNumber && !s.inTransaction }
