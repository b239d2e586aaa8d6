package bucket

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// WriteError is one entry of a reply's writeErrors: index is the position
// of the event in the app's own batch.
type WriteError struct {
	Index int
	Code  mongoerr.Code
	Msg   string
}

// Event is one valid event of the app's batch, ready to be stored.
type Event struct {
	Index  int            // position in the app's batch
	Meta   bsoncore.Value // the metaField value; null when absent
	Start  int64          // window start, ms since the epoch
	Time   int64          // the timeField, ms since the epoch
	Stored bsoncore.Document
	Aggs   []bsoncore.Value // per limits.aggregates; Type 0 when absent
}

// appendSeriesKey appends the event's (series, window) identity: the
// meta's type byte and bytes, then the window start. Two metas are the same
// series when their BSON bytes (type and value) are equal, so {a:1,b:2}
// and {b:2,a:1} are different series, as in MongoDB. So are 1 and 1.0
// within a batch; but the upstream's {meta: 1} also matches a bucket whose
// meta is 1.0 (MongoDB compares numbers by value), so such events may share
// a bucket and read back with that bucket's numeric type.
func (e *Event) AppendSeriesKey(dst []byte) []byte {
	dst = append(dst, byte(e.Meta.Type))
	dst = append(dst, e.Meta.Data...)
	return binary.BigEndian.AppendUint64(dst, uint64(e.Start))
}

// PrepareEvents validates each event and builds its stored form. Invalid
// events are recorded as rejected; with ordered:true the batch is cut
// before the first of them, so the events after it are neither written
// nor reported, as a plain collection does. The stored forms share one
// buffer and the aggregate values one slice (an insert holds them all
// until it is answered anyway): two allocations per batch, not per event.
func PrepareEvents(docs []bsoncore.Document, ordered bool, rule *rules.Rule, lim Limits, newID func() bson.ObjectID) ([]Event, []WriteError) {
	return PrepareEventsChecked(docs, ordered, rule, lim, newID, nil)
}

// EventCheck is a layout's own check of an event that passed
// PrepareEvent's (its time and meta): nil when it is valid.
type EventCheck func(doc bsoncore.Document, index int) *WriteError

// PrepareEventsChecked is PrepareEvents with check (nil: none) applied to
// each event after the common checks, as the layouts' direct path does.
func PrepareEventsChecked(docs []bsoncore.Document, ordered bool, rule *rules.Rule, lim Limits, newID func() bson.ObjectID, check EventCheck) ([]Event, []WriteError) {
	total := 0
	for _, doc := range docs {
		total += len(doc) + storedIDBytes
	}
	buf := make([]byte, 0, total)
	na := len(lim.Aggregates)
	aggs := make([]bsoncore.Value, len(docs)*na)
	events := make([]Event, 0, len(docs))
	var rejected []WriteError
	for i, doc := range docs {
		ev, werr := PrepareEvent(doc, i, rule, lim, newID, &buf, aggs[:na:na])
		if werr == nil && check != nil {
			werr = check(doc, i)
		}
		if werr != nil {
			clear(aggs[:na]) // reused by the next event
			rejected = append(rejected, *werr)
			if ordered {
				break
			}
			continue
		}
		aggs = aggs[na:]
		events = append(events, ev)
	}
	return events, rejected
}

// storedIDBytes is what an _id added to a stored event takes: an ObjectId
// element named "_id".
const storedIDBytes = 1 + 4 + 12

// eventFields are the fields of an event the write path reads, found in
// one pass over its top level.
type eventFields struct {
	hasID      bool
	time, meta bsoncore.Value // Type 0 when absent
	// duplicate names the time or meta field when the event has it twice.
	duplicate string
}

// readEventFields reads _id presence, the time and meta fields and the
// aggregates (into aggs, per lim.aggregates) in one pass; for an
// aggregate the first occurrence of a name counts, as a lookup finds it,
// and a repeated time or meta field is noted in duplicate.
func readEventFields(doc bsoncore.Document, rule *rules.Rule, lim Limits, aggs []bsoncore.Value) (eventFields, error) {
	var f eventFields
	err := bsonutil.EachElement(doc, func(elem bsoncore.Element) error {
		key := elem.KeyBytes()
		switch {
		case string(key) == "_id":
			f.hasID = true
		case string(key) == rule.TimeField:
			if f.time.Type != 0 {
				f.duplicate = rule.TimeField
			}
			f.time = elem.Value()
		case rule.MetaField != "" && string(key) == rule.MetaField:
			if f.meta.Type != 0 {
				f.duplicate = rule.MetaField
			}
			f.meta = elem.Value()
		}
		for i, a := range lim.Aggregates {
			if string(key) == a && aggs[i].Type == 0 {
				aggs[i] = elem.Value()
			}
		}
		return nil
	})
	return f, err
}

// MaxMeasurementBytes is MongoDB's maximum document size, which a
// measurement may not exceed (BSONObjectTooLarge); its meta counts, though
// the bucket keeps it once for the series.
const MaxMeasurementBytes = 16 * 1024 * 1024

func PrepareEvent(doc bsoncore.Document, index int, rule *rules.Rule, lim Limits, newID func() bson.ObjectID, buf *[]byte, aggs []bsoncore.Value) (Event, *WriteError) {
	reject := func(code mongoerr.Code, format string, args ...any) (Event, *WriteError) {
		return Event{}, WriteErrorf(index, rule, code, format, args...)
	}
	f, err := readEventFields(doc, rule, lim, aggs)
	if err != nil {
		return reject(mongoerr.InvalidBSON, "event is not valid BSON: %v", err)
	}
	if len(doc) > MaxMeasurementBytes {
		return reject(mongoerr.BSONObjectTooLarge, "measurement is %d bytes, more than the maximum BSON object size %d", len(doc), MaxMeasurementBytes)
	}
	if f.duplicate != "" {
		// The bucket keeps one value of each: the event read back would
		// not be the one inserted.
		return reject(mongoerr.BadValue, "event has field %q more than once", f.duplicate)
	}
	meta, ms, start, werr := checkTimeMeta(f.time, f.meta, index, rule, lim)
	if werr != nil {
		return Event{}, werr
	}
	if lim.NumbersOnly {
		for i, name := range lim.Aggregates {
			if v := aggs[i]; v.Type != 0 && !IsAggregatable(v.Type) {
				return reject(mongoerr.BadValue, "aggregate field %q must be a number (int, long or double) on a rule with rollups, got %s", name, bsonutil.TypeName(v.Type))
			}
		}
	}
	from := len(*buf)
	out, err := AppendStoredEvent(*buf, doc, rule.MetaField, !f.hasID, newID)
	if err != nil {
		return reject(mongoerr.InvalidBSON, "event is not valid BSON: %v", err)
	}
	stored := bsoncore.Document(out[from:len(out):len(out)])
	if int64(len(stored)) > lim.MaxBytes {
		return reject(mongoerr.BSONObjectTooLarge, "event is %d bytes as stored, more than the bucket limit maxBytes %d", len(stored), lim.MaxBytes)
	}
	// The buffer was sized for every event with an added _id, so appending
	// never moved it: the slices of earlier events stay valid.
	*buf = out
	return Event{Index: index, Meta: meta, Time: ms, Start: start, Stored: stored, Aggs: aggs}, nil
}

// WriteErrorf is the write error of the event at index. The message names
// the config rule, if any: a namespace the app created as a time-series
// collection gets MongoDB's messages as they are.
func WriteErrorf(index int, rule *rules.Rule, code mongoerr.Code, format string, args ...any) *WriteError {
	msg := fmt.Sprintf(format, args...)
	if rule.Declared == nil {
		msg = fmt.Sprintf("tsproxy rule %s: ", rule.Namespace) + msg
	}
	return &WriteError{Index: index, Code: code, Msg: msg}
}

// badTimeField is MongoDB's error for a measurement without a date in
// its timeField.
func badTimeField(index int, rule *rules.Rule, t bsoncore.Value) *WriteError {
	got := "none"
	if t.Type != 0 {
		got = bsonutil.TypeName(t.Type)
	}
	werr := WriteErrorf(index, rule, mongoerr.BadValue, "'%s' must be present and contain a valid BSON UTC datetime value", rule.TimeField)
	if rule.Declared == nil {
		werr.Msg += " (got " + got + ")"
	}
	return werr
}

// TimeMeta reads and checks the fields that place an event in its
// bucket: the metaField value (null when absent), the time and the window
// start.
func TimeMeta(doc bsoncore.Document, index int, rule *rules.Rule, lim Limits) (meta bsoncore.Value, ms, start int64, werr *WriteError) {
	t, _ := bsonutil.Lookup(doc, rule.TimeField)
	var m bsoncore.Value
	if rule.MetaField != "" {
		m, _ = bsonutil.Lookup(doc, rule.MetaField)
	}
	return checkTimeMeta(t, m, index, rule, lim)
}

// checkTimeMeta checks an event's time and meta values (Type 0: absent).
func checkTimeMeta(t, m bsoncore.Value, index int, rule *rules.Rule, lim Limits) (meta bsoncore.Value, ms, start int64, werr *WriteError) {
	meta = bsoncore.Value{Type: bsoncore.TypeNull}
	ms, ok := t.DateTimeOK()
	if !ok {
		return meta, 0, 0, badTimeField(index, rule, t)
	}
	start = rules.FloorMillis(ms, lim.SpanMillis)
	if start > ms { // flooring wrapped around the int64 range
		return meta, 0, 0, WriteErrorf(index, rule, mongoerr.BadValue, "timeField %q date %d is out of the supported range", rule.TimeField, ms)
	}
	if m.Type != 0 {
		if why := unsupportedMeta(m); why != "" {
			return meta, 0, 0, WriteErrorf(index, rule, mongoerr.BadValue, "metaField %q: %s", rule.MetaField, why)
		}
		meta = StoredMeta(m)
	}
	return meta, ms, start, nil
}

// unsupportedMeta says why a meta value cannot identify a series, or "".
// The upsert filter {meta: M} must match exactly the buckets of M, and the
// upsert must copy M into a new bucket. That holds for every type but these:
// an array also matches arrays that contain it, a regex matches strings
// and undefined is not a queryable value. (A document whose first name
// is $-prefixed, which would read as query operators, is stored with
// that name escaped: StoredMeta.)
//
// Nor values FerretDB refuses to store in a document (infinities, NaN,
// an array directly inside an array, Decimal128, on which FerretDB v1.x
// closes its connection), anywhere in the meta: a staged event's merge
// into a bucket failed on them, and every read of the rule with it, the
// insert having been acknowledged. MongoDB stores them; a series named
// by one is refused here on every upstream, so that the stored format
// is the same on all (field names FerretDB cannot store are escaped
// instead: StoredMeta).
func unsupportedMeta(m bsoncore.Value) string {
	switch m.Type {
	case bsoncore.TypeArray, bsoncore.TypeRegex, bsoncore.TypeUndefined:
		return fmt.Sprintf("values of type %s are not supported", bsonutil.TypeName(m.Type))
	}
	return unstorableIn(m, false, 0)
}

// unstorableIn says why value v (inside an array when inArray) is one
// FerretDB cannot store, or "".
func unstorableIn(v bsoncore.Value, inArray bool, depth int) string {
	if depth > bsonutil.MaxDepth {
		return "it is nested too deep"
	}
	switch v.Type {
	case bsoncore.TypeDouble:
		if f := v.Double(); math.IsInf(f, 0) || math.IsNaN(f) {
			return fmt.Sprintf("it holds %v, which the upstream cannot store in a bucket", f)
		}
	case bsoncore.TypeDecimal128:
		return "it holds a Decimal128, which FerretDB v1.x cannot store in a bucket"
	case bsoncore.TypeArray:
		if inArray {
			return "it holds an array inside an array, which the upstream cannot store in a bucket"
		}
		vals, _ := bsoncore.Array(v.Data).Values()
		for _, e := range vals {
			if why := unstorableIn(e, true, depth+1); why != "" {
				return why
			}
		}
	case bsoncore.TypeEmbeddedDocument:
		elems, _ := bsoncore.Document(v.Data).Elements()
		for _, e := range elems {
			if why := unstorableIn(e.Value(), false, depth+1); why != "" {
				return why
			}
		}
	}
	return ""
}

func IsAggregatable(t bsoncore.Type) bool {
	return t == bsoncore.TypeInt32 || t == bsoncore.TypeInt64 || t == bsoncore.TypeDouble
}

// AppendStoredEvent appends the event as kept in a bucket's events array:
// an _id first when the event had none (addID; as mongod adds one), and
// the metaField's value replaced by null at its own position. The null
// marks where the read path puts the bucket's meta back, so field order
// and presence round-trip exactly; an absent key means the event had no
// metaField.
func AppendStoredEvent(dst []byte, doc bsoncore.Document, metaField string, addID bool, newID func() bson.ObjectID) ([]byte, error) {
	if len(doc) < 5 {
		return dst, bsoncore.ErrMissingNull
	}
	idx, out := bsoncore.AppendDocumentStart(dst)
	if addID {
		out = bsoncore.AppendObjectIDElement(out, "_id", newID())
	}
	err := bsonutil.EachElement(doc, func(elem bsoncore.Element) error {
		if metaField != "" && string(elem.KeyBytes()) == metaField {
			out = bsoncore.AppendNullElement(out, metaField)
		} else {
			out = append(out, elem...)
		}
		return nil
	})
	if err != nil {
		return dst, err
	}
	return bsoncore.AppendDocumentEnd(out, idx)
}

// GroupEvents groups events by (series, window) in order of first
// appearance in the batch, keeping batch order inside each group, so the
// same batch always yields the same statements (a retry is recognised).
func GroupEvents(events []Event) [][]Event {
	var groups [][]Event
	// Most inserts hold one (series, window), a per-event insert always:
	// until a second one appears, keys are compared with the first
	// group's, and no map is made.
	var pos map[string]int
	var key, first []byte
	for _, ev := range events {
		key = ev.AppendSeriesKey(key[:0])
		g, ok := 0, false
		switch {
		case len(groups) == 0:
			first = append(first, key...)
		case pos == nil && bytes.Equal(key, first):
			ok = true
		case pos == nil:
			pos = map[string]int{string(first): 0}
			fallthrough
		default:
			g, ok = pos[string(key)]
		}
		if !ok {
			g = len(groups)
			if pos != nil {
				pos[string(key)] = g
			}
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], ev)
	}
	return groups
}

// ChunkEvents cuts a group's events, in order, into chunks of at most
// maxEvents events and maxBytes stored bytes: each chunk fits in one
// bucket. The chunks are g's own (capped: an append to one copies it).
func ChunkEvents(g []Event, lim Limits) [][]Event {
	var chunks [][]Event
	from := 0
	var curBytes int64
	for i, ev := range g {
		size := int64(len(ev.Stored))
		if i > from && (i-from >= lim.MaxEvents || curBytes+size > lim.MaxBytes) {
			chunks = append(chunks, g[from:i:i])
			from, curBytes = i, 0
		}
		curBytes += size
	}
	if len(g) > from {
		chunks = append(chunks, g[from:len(g):len(g)])
	}
	return chunks
}

func ChunkBytes(chunk []Event) int64 {
	var n int64
	for _, ev := range chunk {
		n += int64(len(ev.Stored))
	}
	return n
}
