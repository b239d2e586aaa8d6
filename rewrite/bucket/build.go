package bucket

import (
	"math"
	"strconv"

	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// appendEventsArray appends the chunk's stored events as an array.
func appendEventsArray(dst []byte, key string, chunk []Event) []byte {
	idx, dst := bsoncore.AppendArrayElementStart(dst, key)
	dst = appendEventElements(dst, chunk)
	dst, _ = bsoncore.AppendArrayEnd(dst, idx)
	return dst
}

// appendPackedEvents appends the chunk's stored events as the BSON of
// their array in one binary value (FieldPacked), compressed when compress
// says so.
func appendPackedEvents(dst []byte, chunk []Event, compress bool) []byte {
	size := 5
	for i, ev := range chunk {
		size += 2 + len(strconv.Itoa(i)) + len(ev.Stored)
	}
	aidx, arr := bsoncore.AppendArrayStart(make([]byte, 0, size))
	arr = appendEventElements(arr, chunk)
	arr, _ = bsoncore.AppendArrayEnd(arr, aidx)
	return appendPacked(dst, FieldPacked, arr, compress)
}

// appendEventElements appends the chunk's stored events as the elements
// of an array.
func appendEventElements(dst []byte, chunk []Event) []byte {
	for i, ev := range chunk {
		dst = bsoncore.AppendDocumentElement(dst, strconv.Itoa(i), ev.Stored)
	}
	return dst
}

// appendKey appends the chunk's series and window (FieldMeta,
// FieldStart).
func appendKey(dst []byte, chunk []Event) []byte {
	dst = bsoncore.AppendValueElement(dst, FieldMeta, chunk[0].Meta)
	return bsoncore.AppendDateTimeElement(dst, FieldStart, chunk[0].Start)
}

// StagedFormat is the form of a staged document. Every form a proxy can
// write it reads too, and a proxy writes a form only once every proxy
// that may merge the rule reads it (the rule's staging format
// record): a proxy of an older version fails to merge a
// form it does not know.
type StagedFormat int

const (
	// StagedKeyed: {_id, [at], meta, start, packed, [more]}: the first
	// group's key and packed events at the top, the other groups in
	// FieldMore. Every version of the proxy reads it.
	StagedKeyed StagedFormat = 1
	// StagedPacked: {_id, [at], more}: every group in FieldMore. Two
	// fields instead of four for a per-event insert: FerretDB encodes,
	// stores and decodes a document one field at a time, and this saves
	// it 17–19 µs an insert, about 3% of a call through the proxy
	// (tsbench calls; docs/benchmarks.md).
	StagedPacked StagedFormat = 2
	// LatestStagedFormat is the form a rule new to every proxy gets.
	LatestStagedFormat = StagedPacked
)

// Valid says whether f is a form this proxy writes and reads.
func (f StagedFormat) Valid() bool { return f == StagedKeyed || f == StagedPacked }

// StagedOptions say how a staged document is written.
type StagedOptions struct {
	// At is the proxy's arrival stamp of the insert, written in
	// FieldStagedAt (none when 0): the order in which a merge applies
	// staged writes whose order matters (the slots layout, where the last
	// write of a slot wins; see rewrite/stage).
	At int64
	// Compress: the packed values are compressed (Limits.Compress).
	Compress bool
	// Format is the document's form (0: StagedKeyed, which every proxy
	// reads).
	Format StagedFormat
}

// StagedGroups builds the document the staging tier stores for the chunks
// of one insert that go to one staging collection, in the form
// StagedKeyed: the first chunk's key and its events packed as one binary
// value (FieldPacked), and the other chunks in FieldMore, one binary
// value holding the BSON array of their {meta, start, events}; no
// summaries (a merge computes them for the buckets it writes, and nothing
// reads a staged document as a bucket). FerretDB stores a document as
// JSON, one value at a time, and decodes it one document at a time:
// packed, a staged document costs it one string to encode and decode
// instead of every field of every event (reading staging back had cost a
// merge 20 µs an event, more than inserting it), and one document per
// insert instead of one per series (about 30 µs each to decode).
func StagedGroups(id bson.ObjectID, chunks [][]Event) bsoncore.Document {
	return StagedDoc(id, chunks, StagedOptions{})
}

// StagedDoc is StagedGroups with its options: the arrival stamp,
// compression and the form (StagedPacked puts every chunk in FieldMore).
func StagedDoc(id bson.ObjectID, chunks [][]Event, opts StagedOptions) bsoncore.Document {
	var size int64
	for _, c := range chunks {
		size += ChunkBytes(c) + stagedChunkBytes
	}
	idx, doc := bsoncore.AppendDocumentStart(make([]byte, 0, size))
	doc = bsoncore.AppendObjectIDElement(doc, FieldID, id)
	if opts.At != 0 {
		doc = bsoncore.AppendInt64Element(doc, FieldStagedAt, opts.At)
	}
	rest := chunks
	if opts.Format != StagedPacked {
		doc = appendKey(doc, chunks[0])
		doc = appendPackedEvents(doc, chunks[0], opts.Compress)
		rest = chunks[1:]
	}
	if len(rest) > 0 {
		aidx, more := bsoncore.AppendArrayStart(make([]byte, 0, size))
		for i, chunk := range rest {
			gidx, g := bsoncore.AppendDocumentElementStart(more, strconv.Itoa(i))
			g = appendKey(g, chunk)
			g = appendEventsArray(g, FieldEvents, chunk)
			more, _ = bsoncore.AppendDocumentEnd(g, gidx)
		}
		more, _ = bsoncore.AppendArrayEnd(more, aidx)
		doc = appendPacked(doc, FieldMore, more, opts.Compress)
	}
	doc, _ = bsoncore.AppendDocumentEnd(doc, idx)
	return doc
}

// stagedChunkBytes is about what a staged document spends on a chunk
// besides its events (its key, the packing's headers; its _id and stamp
// for the first), so that building one seldom grows its buffer.
const stagedChunkBytes = 128

// Complete builds a whole bucket document for a chunk large enough to
// stand alone (see DESIGN.md), its events packed where lim.Packed says
// so. "sum" is left out when no event carries an aggregate, as the upsert
// path would leave it out.
func Complete(id bson.ObjectID, chunk []Event, rule *rules.Rule, lim Limits) bsoncore.Document {
	s := Summarize(chunk, lim)
	idx, doc := bsoncore.AppendDocumentStart(nil)
	doc = bsoncore.AppendObjectIDElement(doc, FieldID, id)
	doc = appendKey(doc, chunk)
	doc = bsoncore.AppendInt32Element(doc, FieldCount, int32(s.Count))
	doc = bsoncore.AppendInt32Element(doc, FieldBytes, int32(s.Bytes))

	sub, doc := bsoncore.AppendDocumentElementStart(doc, FieldMin)
	doc = AppendExtremes(doc, "", rule.TimeField, s, lim, false)
	doc, _ = bsoncore.AppendDocumentEnd(doc, sub)
	sub, doc = bsoncore.AppendDocumentElementStart(doc, FieldMax)
	doc = AppendExtremes(doc, "", rule.TimeField, s, lim, true)
	doc, _ = bsoncore.AppendDocumentEnd(doc, sub)
	if len(lim.Aggregates) > 0 {
		doc = bsoncore.AppendInt32Element(doc, FieldCounted, int32(s.Count))
		sub, doc = bsoncore.AppendDocumentElementStart(doc, FieldSummed)
		doc = AppendSummed(doc, "", lim)
		doc, _ = bsoncore.AppendDocumentEnd(doc, sub)
	}
	if hasAggregates(s) {
		sub, doc = bsoncore.AppendDocumentElementStart(doc, FieldSum)
		doc = AppendSums(doc, "", s, lim)
		doc, _ = bsoncore.AppendDocumentEnd(doc, sub)
		sub, doc = bsoncore.AppendDocumentElementStart(doc, FieldCounts)
		doc = AppendCounts(doc, "", s, lim)
		doc, _ = bsoncore.AppendDocumentEnd(doc, sub)
		sub, doc = bsoncore.AppendDocumentElementStart(doc, FieldLowBit)
		doc = AppendLowBits(doc, "", s, lim)
		doc, _ = bsoncore.AppendDocumentEnd(doc, sub)
	}
	if s.HasMixed() {
		sub, doc = bsoncore.AppendDocumentElementStart(doc, FieldMixed)
		doc = AppendMixed(doc, "", s, lim)
		doc, _ = bsoncore.AppendDocumentEnd(doc, sub)
	}
	if lim.Packed {
		doc = appendPackedEvents(doc, chunk, lim.Compress)
	} else {
		doc = appendEventsArray(doc, FieldEvents, chunk)
	}
	doc, _ = bsoncore.AppendDocumentEnd(doc, idx)
	return doc
}

// UpsertStatement builds the update statement that adds a chunk to the
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
func UpsertStatement(id bson.ObjectID, chunk []Event, lim Limits, timeField string, idOnly bool) bsoncore.Document {
	s := Summarize(chunk, lim)
	idx, doc := bsoncore.AppendDocumentStart(nil)

	q, doc := bsoncore.AppendDocumentElementStart(doc, "q")
	doc = bsoncore.AppendObjectIDElement(doc, FieldID, id)
	if !idOnly {
		doc = appendLTE(doc, FieldCount, int64(lim.MaxEvents-s.Count))
		doc = appendLTE(doc, FieldBytes, lim.MaxBytes-s.Bytes)
	}
	doc, _ = bsoncore.AppendDocumentEnd(doc, q)

	u, doc := bsoncore.AppendDocumentElementStart(doc, "u")
	meta := chunk[0].Meta
	if meta.Type == bsoncore.TypeNull || s.HasMixed() {
		op, d := bsoncore.AppendDocumentElementStart(doc, "$set")
		if meta.Type == bsoncore.TypeNull {
			d = bsoncore.AppendNullElement(d, FieldMeta)
		}
		d = AppendMixed(d, FieldMixed+".", s, lim)
		doc, _ = bsoncore.AppendDocumentEnd(d, op)
	}
	op, doc := bsoncore.AppendDocumentElementStart(doc, "$setOnInsert")
	if meta.Type != bsoncore.TypeNull {
		doc = bsoncore.AppendValueElement(doc, FieldMeta, meta)
	}
	doc = bsoncore.AppendDateTimeElement(doc, FieldStart, chunk[0].Start)
	doc = AppendSummed(doc, FieldSummed+".", lim)
	doc, _ = bsoncore.AppendDocumentEnd(doc, op)

	op, doc = bsoncore.AppendDocumentElementStart(doc, "$push")
	each, doc := bsoncore.AppendDocumentElementStart(doc, FieldEvents)
	doc = appendEventsArray(doc, "$each", chunk)
	doc, _ = bsoncore.AppendDocumentEnd(doc, each)
	doc, _ = bsoncore.AppendDocumentEnd(doc, op)

	op, doc = bsoncore.AppendDocumentElementStart(doc, "$inc")
	doc = bsoncore.AppendInt32Element(doc, FieldCount, int32(s.Count))
	doc = bsoncore.AppendInt32Element(doc, FieldBytes, int32(s.Bytes))
	doc = AppendSums(doc, FieldSum+".", s, lim)
	if len(lim.Aggregates) > 0 {
		doc = bsoncore.AppendInt32Element(doc, FieldCounted, int32(s.Count))
		doc = AppendCounts(doc, FieldCounts+".", s, lim)
	}
	doc, _ = bsoncore.AppendDocumentEnd(doc, op)

	op, doc = bsoncore.AppendDocumentElementStart(doc, "$min")
	doc = AppendExtremes(doc, FieldMin+".", timeField, s, lim, false)
	doc = AppendLowBits(doc, FieldLowBit+".", s, lim)
	doc, _ = bsoncore.AppendDocumentEnd(doc, op)
	op, doc = bsoncore.AppendDocumentElementStart(doc, "$max")
	doc = AppendExtremes(doc, FieldMax+".", timeField, s, lim, true)
	doc, _ = bsoncore.AppendDocumentEnd(doc, op)
	doc, _ = bsoncore.AppendDocumentEnd(doc, u)

	doc = bsoncore.AppendBooleanElement(doc, "upsert", true)
	doc, _ = bsoncore.AppendDocumentEnd(doc, idx)
	return doc
}

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
