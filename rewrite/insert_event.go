package rewrite

import (
	"fmt"
	"strings"

	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// event is one valid event of the app's batch, ready to be stored.
type event struct {
	index  int            // position in the app's batch
	meta   bsoncore.Value // the metaField value; null when absent
	start  int64          // window start, ms since the epoch
	time   int64          // the timeField, ms since the epoch
	stored bsoncore.Document
	aggs   []bsoncore.Value // per limits.aggregates; Type 0 when absent
}

// seriesKey identifies the event's (series, window). Two metas are the
// same series when their BSON bytes (type and value) are equal, so
// {a:1,b:2} and {b:2,a:1} are different series, as in MongoDB. So are 1
// and 1.0 within a batch; but the upstream's {meta: 1} also matches a
// bucket whose meta is 1.0 (MongoDB compares numbers by value), so such
// events may share a bucket and read back with that bucket's numeric type.
func (e *event) seriesKey() string {
	var b strings.Builder
	b.WriteByte(byte(e.meta.Type))
	b.Write(e.meta.Data)
	fmt.Fprintf(&b, "|%d", e.start)
	return b.String()
}

// prepareEvents validates each event and builds its stored form. Invalid
// events are recorded as rejected; with ordered:true the batch is cut
// before the first of them, so the events after it are neither written
// nor reported, as a plain collection does.
func (p *InsertPlan) prepareEvents(docs []bsoncore.Document, rule *rules.Rule, lim limits, newID func() bson.ObjectID) []event {
	events := make([]event, 0, len(docs))
	for i, doc := range docs {
		ev, werr := prepareEvent(doc, i, rule, lim, newID)
		if werr != nil {
			p.rejected = append(p.rejected, *werr)
			if p.ordered {
				break
			}
			continue
		}
		events = append(events, ev)
	}
	return events
}

func prepareEvent(doc bsoncore.Document, index int, rule *rules.Rule, lim limits, newID func() bson.ObjectID) (event, *writeError) {
	reject := func(code int32, format string, args ...any) (event, *writeError) {
		return event{}, eventError(index, rule, code, format, args...)
	}
	meta, ms, start, werr := eventTimeMeta(doc, index, rule, lim)
	if werr != nil {
		return event{}, werr
	}
	ev := event{index: index, meta: meta, time: ms, start: start}

	for _, name := range lim.aggregates {
		v, ok := lookupTop(doc, name)
		if ok && !isAggregatable(v.Type) {
			return reject(CodeBadValue, "aggregate field %q must be a number (int, long or double), got %s", name, typeName(v.Type))
		}
		ev.aggs = append(ev.aggs, v) // zero Value when absent
	}

	stored, err := storedEvent(doc, rule.MetaField, newID)
	if err != nil {
		return reject(CodeInvalidBSON, "event is not valid BSON: %v", err)
	}
	if int64(len(stored)) > lim.maxBytes {
		return reject(CodeBSONObjectTooLarge, "event is %d bytes as stored, more than the bucket limit maxBytes %d", len(stored), lim.maxBytes)
	}
	ev.stored = stored
	return ev, nil
}

func eventError(index int, rule *rules.Rule, code int32, format string, args ...any) *writeError {
	msg := fmt.Sprintf("tsproxy rule %s: ", rule.Namespace) + fmt.Sprintf(format, args...)
	return &writeError{index: index, code: code, errmsg: msg}
}

// eventTimeMeta reads and checks the fields that place an event in its
// bucket: the metaField value (null when absent), the time and the window
// start.
func eventTimeMeta(doc bsoncore.Document, index int, rule *rules.Rule, lim limits) (meta bsoncore.Value, ms, start int64, werr *writeError) {
	meta = bsoncore.Value{Type: bsoncore.TypeNull}
	t, ok := lookupTop(doc, rule.TimeField)
	if !ok {
		return meta, 0, 0, eventError(index, rule, CodeBadValue, "event has no timeField %q", rule.TimeField)
	}
	ms, ok = t.DateTimeOK()
	if !ok {
		return meta, 0, 0, eventError(index, rule, CodeBadValue, "timeField %q must be a BSON date, got %s", rule.TimeField, typeName(t.Type))
	}
	start = rules.FloorMillis(ms, lim.spanMillis)
	if start > ms { // flooring wrapped around the int64 range
		return meta, 0, 0, eventError(index, rule, CodeBadValue, "timeField %q date %d is out of the supported range", rule.TimeField, ms)
	}
	if rule.MetaField != "" {
		if m, ok := lookupTop(doc, rule.MetaField); ok {
			if why := unsupportedMeta(m); why != "" {
				return meta, 0, 0, eventError(index, rule, CodeBadValue, "metaField %q: %s", rule.MetaField, why)
			}
			meta = m
		}
	}
	return meta, ms, start, nil
}

// unsupportedMeta says why a meta value cannot identify a series, or "".
// The upsert filter {meta: M} must match exactly the buckets of M, and the
// upsert must copy M into a new bucket. That holds for every type but these:
// an array also matches arrays that contain it, a regex matches strings,
// undefined is not a queryable value, and a document whose first key is
// $-prefixed reads as query operators.
func unsupportedMeta(m bsoncore.Value) string {
	switch m.Type {
	case bsoncore.TypeArray, bsoncore.TypeRegex, bsoncore.TypeUndefined:
		return fmt.Sprintf("values of type %s are not supported", typeName(m.Type))
	case bsoncore.TypeEmbeddedDocument:
		elems, err := bsoncore.Document(m.Data).Elements()
		if err == nil && len(elems) > 0 && strings.HasPrefix(elems[0].Key(), "$") {
			return fmt.Sprintf("documents whose first field is $-prefixed (%q) are not supported", elems[0].Key())
		}
	}
	return ""
}

func isAggregatable(t bsoncore.Type) bool {
	return t == bsoncore.TypeInt32 || t == bsoncore.TypeInt64 || t == bsoncore.TypeDouble
}

// storedEvent is the event as kept in a bucket's events array: an _id
// first when the event had none (as mongod adds one), and the metaField's
// value replaced by null at its own position. The null marks where the
// read path puts the bucket's meta back, so field order and presence
// round-trip exactly; an absent key means the event had no metaField.
func storedEvent(doc bsoncore.Document, metaField string, newID func() bson.ObjectID) (bsoncore.Document, error) {
	elems, err := doc.Elements()
	if err != nil {
		return nil, err
	}
	idx, out := bsoncore.AppendDocumentStart(make([]byte, 0, len(doc)+17))
	if _, hasID := lookupTop(doc, "_id"); !hasID {
		out = bsoncore.AppendObjectIDElement(out, "_id", newID())
	}
	for _, e := range elems {
		if metaField != "" && e.Key() == metaField {
			out = bsoncore.AppendNullElement(out, metaField)
			continue
		}
		out = append(out, e...)
	}
	return bsoncore.AppendDocumentEnd(out, idx)
}

// groupEvents groups events by (series, window) in order of first
// appearance in the batch, keeping batch order inside each group, so the
// same batch always yields the same statements (a retry is recognised).
func groupEvents(events []event) [][]event {
	var groups [][]event
	pos := map[string]int{}
	for _, ev := range events {
		key := ev.seriesKey()
		g, ok := pos[key]
		if !ok {
			g = len(groups)
			pos[key] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], ev)
	}
	return groups
}

// chunkEvents cuts a group's events, in order, into chunks of at most
// maxEvents events and maxBytes stored bytes: each chunk fits in one bucket.
func chunkEvents(g []event, lim limits) [][]event {
	var chunks [][]event
	var cur []event
	var curBytes int64
	for _, ev := range g {
		size := int64(len(ev.stored))
		if len(cur) > 0 && (len(cur) >= lim.maxEvents || curBytes+size > lim.maxBytes) {
			chunks = append(chunks, cur)
			cur, curBytes = nil, 0
		}
		cur = append(cur, ev)
		curBytes += size
	}
	if len(cur) > 0 {
		chunks = append(chunks, cur)
	}
	return chunks
}

func chunkBytes(chunk []event) int64 {
	var n int64
	for _, ev := range chunk {
		n += int64(len(ev.stored))
	}
	return n
}
