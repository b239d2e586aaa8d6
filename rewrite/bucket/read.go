package bucket

import (
	"fmt"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

func KeyFields(bdoc bsoncore.Document) (bsoncore.Value, int64, error) {
	meta, ok := bsonutil.Lookup(bdoc, FieldMeta)
	if !ok {
		meta = bsoncore.Value{Type: bsoncore.TypeNull}
	}
	st, ok := bsonutil.Lookup(bdoc, FieldStart)
	if !ok {
		return meta, 0, mongoerr.Errorf(mongoerr.InternalError, "bucket without %q", FieldStart)
	}
	ms, ok := st.DateTimeOK()
	if !ok {
		return meta, 0, mongoerr.Errorf(mongoerr.InternalError, "bucket %q is a %s, not a date", FieldStart, bsonutil.TypeName(st.Type))
	}
	return meta, ms, nil
}

// MaxSeq bounds the search of a bucket's seq (as the proxy's probes).
const MaxSeq = 1 << 16

// SeqOf finds which seq of key's family id is; false when none up to the
// bound is (a bucket the proxy did not write).
func SeqOf(bucketNS string, key Key, id bson.ObjectID) (int, bool) {
	for seq := 0; seq < MaxSeq; seq++ {
		if key.ID(bucketNS, seq) == id {
			return seq, true
		}
	}
	return 0, false
}

// EventValues are the stored events of a bucket or of a staged document,
// in stored order: the packed ones (FieldPacked) first, then the array's
// (FieldEvents). A bucket written whole on an upstream with packed events
// has only the first; a bucket grown by $push only the second; a packed
// bucket a later $push joined (a delete can rewrite a bucket small enough
// for the direct path to join it) has both, in the order they were
// written. An emptied shell has none.
func EventValues(bdoc bsoncore.Document) ([]bsoncore.Value, error) {
	var out []bsoncore.Value
	err := eachEventArray(bdoc, func(field string, arr bsoncore.Array) error {
		vals, err := arr.Values()
		if err != nil {
			return fmt.Errorf("%q: %w", field, err)
		}
		if out == nil {
			out = vals
		} else {
			out = append(out, vals...)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// eachEventArray calls f with the arrays of a document's stored events,
// in stored order (see EventValues): the packed one, unpacked, then
// FieldEvents; field names each.
func eachEventArray(bdoc bsoncore.Document, f func(field string, arr bsoncore.Array) error) error {
	if p, ok, err := packedEvents(bdoc); err != nil {
		return err
	} else if ok {
		if err := f(FieldPacked, p.Array()); err != nil {
			return err
		}
	}
	v, ok := bsonutil.Lookup(bdoc, FieldEvents)
	if !ok {
		return nil
	}
	arr, ok := v.ArrayOK()
	if !ok {
		return fmt.Errorf("%q is a %s, not an array", FieldEvents, bsonutil.TypeName(v.Type))
	}
	return f(FieldEvents, arr)
}

// EventDocs are EventValues as documents.
func EventDocs(bdoc bsoncore.Document) ([]bsoncore.Document, error) {
	vals, err := EventValues(bdoc)
	if err != nil {
		return nil, err
	}
	out := make([]bsoncore.Document, 0, len(vals))
	for i, v := range vals {
		d, ok := v.DocumentOK()
		if !ok {
			return nil, fmt.Errorf("event %d is a %s, not a document", i, bsonutil.TypeName(v.Type))
		}
		out = append(out, d)
	}
	return out, nil
}

// packedEvents reads a document's packed events as an array value; ok is
// false when it has none.
func packedEvents(bdoc bsoncore.Document) (bsoncore.Value, bool, error) {
	p, ok := bsonutil.Lookup(bdoc, FieldPacked)
	if !ok {
		return bsoncore.Value{}, false, nil
	}
	arr, err := unpack(FieldPacked, p)
	if err != nil {
		return bsoncore.Value{}, false, err
	}
	return bsoncore.Value{Type: bsoncore.TypeArray, Data: arr}, true, nil
}

// Shell is a bucket emptied by a delete that must stay because a
// higher seq of its key exists: reads find a key's buckets by probing seq
// 0, 1, ... until the first missing id, so it keeps the family gapless.
// Inserts never join it (they join only the highest seq).
func Shell(meta bsoncore.Value, start int64) bsoncore.Document {
	return bsoncore.NewDocumentBuilder().
		AppendValue(FieldMeta, meta).
		AppendDateTime(FieldStart, start).
		AppendInt32(FieldCount, 0).
		AppendInt32(FieldBytes, 0).
		AppendDocument(FieldMin, bsoncore.NewDocumentBuilder().Build()).
		AppendDocument(FieldMax, bsoncore.NewDocumentBuilder().Build()).
		AppendArray(FieldEvents, bsoncore.NewArrayBuilder().Build()).
		Build()
}

// CountOf reads a bucket's count (0 when absent).
func CountOf(bdoc bsoncore.Document) int {
	v, ok := bsonutil.Lookup(bdoc, FieldCount)
	if !ok {
		return 0
	}
	n, _ := v.AsInt64OK()
	return int(n)
}

// RestoreMeta puts the bucket's meta (metaOf, called only when needed)
// back into a stored event at its marker's position.
func RestoreMeta(stored bsoncore.Document, metaField string, metaOf func() (bsoncore.Value, error)) (bsoncore.Document, error) {
	if metaField == "" {
		return stored, nil
	}
	elems, err := stored.Elements()
	if err != nil {
		return nil, mongoerr.Errorf(mongoerr.InternalError, "stored event is not valid BSON: %v", err)
	}
	hasMarker := false
	for _, e := range elems {
		if e.Key() == metaField {
			hasMarker = true
			break
		}
	}
	if !hasMarker {
		return stored, nil
	}
	meta, err := metaOf()
	if err != nil {
		return nil, err
	}
	meta = UserMeta(meta)
	idx, out := bsoncore.AppendDocumentStart(make([]byte, 0, len(stored)+len(meta.Data)+8))
	for _, e := range elems {
		if e.Key() == metaField {
			out = bsoncore.AppendValueElement(out, metaField, meta)
			continue
		}
		out = append(out, e...)
	}
	return bsoncore.AppendDocumentEnd(out, idx)
}

// StagedEvents reads a staged document, of either form (StagedFormat),
// back into its events, each with its own series and window: those of
// its top-level group (StagedKeyed; StagedPacked has none), then those of
// the groups in FieldMore.
func StagedEvents(doc bsoncore.Document, rule *rules.Rule, lim Limits) ([]Event, error) {
	var r eventReader
	var out []Event
	m, hasMore := bsonutil.Lookup(doc, FieldMore)
	_, keyed := bsonutil.Lookup(doc, FieldMeta)
	switch {
	case keyed:
		var err error
		if out, err = r.appendStored(nil, doc, rule, lim); err != nil {
			return nil, err
		}
	case !hasMore:
		return nil, fmt.Errorf("staged document has neither %q (a group at its top) nor %q (its groups packed)", FieldMeta, FieldMore)
	}
	if !hasMore {
		return out, nil
	}
	more, err := unpack(FieldMore, m)
	if err != nil {
		return nil, err
	}
	i := 0
	err = bsonutil.EachElement(more, func(e bsoncore.Element) error {
		g := e.Value()
		gd, ok := g.DocumentOK()
		if !ok {
			return fmt.Errorf("%q group %d is a %s, not a document", FieldMore, i, bsonutil.TypeName(g.Type))
		}
		if out, err = r.appendStored(out, gd, rule, lim); err != nil {
			return fmt.Errorf("%q group %d: %w", FieldMore, i, err)
		}
		i++
		return nil
	})
	if err != nil {
		return nil, err
	}
	if i == 0 && !keyed {
		return nil, fmt.Errorf("staged document has no group: %q is empty", FieldMore)
	}
	return out, nil
}

// StoredEvents reads a bucket document back into the events it holds, in
// stored order, as PrepareEvent made them (Index is the position in the
// bucket): what a merge needs to write them into other buckets.
func StoredEvents(bdoc bsoncore.Document, rule *rules.Rule, lim Limits) ([]Event, error) {
	var r eventReader
	return r.appendStored(nil, bdoc, rule, lim)
}

// eventReader reads stored events with few allocations: a merge reads
// every staged event (tens of thousands) this way, and the aggregate
// values of many events share one slab.
type eventReader struct {
	slab []bsoncore.Value
	// slabEvents is how many events' values the last slab held: each
	// slab doubles it, from minSlabEvents to maxSlabEvents, so a reader
	// of one staged event (a merge makes one per staged document)
	// allocates 4 events' values, not 256 (8 KB a document, 46 MB for a
	// merge of 4,000 per-event inserts), and a reader of a bucket a few
	// slabs.
	slabEvents int
}

const (
	minSlabEvents = 4
	maxSlabEvents = 256
)

// aggs is a zeroed slice of n values of its own (capped: an append to it
// cannot reach the next event's).
func (r *eventReader) aggs(n int) []bsoncore.Value {
	if n == 0 {
		return nil
	}
	if len(r.slab) < n {
		r.slabEvents = min(max(2*r.slabEvents, minSlabEvents), maxSlabEvents)
		r.slab = make([]bsoncore.Value, r.slabEvents*n)
	}
	a := r.slab[:n:n]
	r.slab = r.slab[n:]
	return a
}

// appendStored appends the events of bdoc (a bucket or one group of a
// staged document) to out: its packed ones, then its array's.
func (r *eventReader) appendStored(out []Event, bdoc bsoncore.Document, rule *rules.Rule, lim Limits) ([]Event, error) {
	meta, start, err := KeyFields(bdoc)
	if err != nil {
		return nil, err
	}
	i := 0
	read := func(e bsoncore.Element) error {
		v := e.Value()
		d, ok := v.DocumentOK()
		if !ok {
			return fmt.Errorf("event %d is a %s, not a document", i, bsonutil.TypeName(v.Type))
		}
		aggs := r.aggs(len(lim.Aggregates))
		f, err := readEventFields(d, rule, lim, aggs)
		if err != nil {
			return fmt.Errorf("event %d: %w", i, err)
		}
		ms, ok := f.time.DateTimeOK()
		if !ok {
			return fmt.Errorf("event %d: %q is a %s, not a date", i, rule.TimeField, bsonutil.TypeName(f.time.Type))
		}
		out = append(out, Event{Index: i, Meta: meta, Start: start, Time: ms, Stored: d, Aggs: aggs})
		i++
		return nil
	}
	err = eachEventArray(bdoc, func(field string, arr bsoncore.Array) error {
		if err := bsonutil.EachElement(arr, read); err != nil {
			return fmt.Errorf("%q: %w", field, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
