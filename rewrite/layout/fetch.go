package layout

import (
	"cmp"
	"encoding/hex"
	"math"
	"slices"
	"strconv"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/insert"
	"github.com/tsproxy/tsproxy/rewrite/match"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// planFetch chooses between point lookups and a scan.
func (r *Read) planFetch(filter bsoncore.Document) {
	var b fetchBounds
	r.bounds(filter, &b, 0)
	win := r.rule.LayoutOptions.Window.Milliseconds()
	// The first window of the dates starts at or after the smallest date
	// (an insert refuses a date whose window would start before it):
	// {$gte: new Date(-2**63)} floored to a window far in the future.
	// Windows are counted below, not stepped through: the step after
	// the last window of the dates wrapped, and never ended.
	b.lo = max(b.lo, math.MinInt64+win-1)
	if exactMeta(b.meta) && b.hasLo && b.hasHi && b.lo <= b.hi && r.rule.MetaField != "" {
		first, last := rules.FloorMillis(b.lo, win), rules.FloorMillis(b.hi, win)
		// last-first as unsigned: from near the smallest date to near the
		// largest, the signed difference wraps.
		if n := uint64(last-first) / uint64(win); n < maxPointLookups {
			for i := range int64(n) + 1 {
				s := first + i*win
				id := bucket.ID(r.rule.BucketNamespace(), b.meta, s, 0)
				r.fetch = append(r.fetch, bsoncore.NewDocumentBuilder().
					AppendString("find", r.rule.BucketCollection).
					AppendDocument("filter", bsoncore.NewDocumentBuilder().AppendObjectID("_id", id).Build()).
					AppendBoolean("singleBatch", true).
					AppendString("$db", r.rule.DB).
					Build())
			}
			return
		}
	}
	if b.hasLo && b.hasHi && b.lo > b.hi {
		return // nothing can match
	}
	r.scan = true
	fi, f := bsoncore.AppendDocumentStart(nil)
	if b.meta.Type != 0 && r.rule.MetaField != "" {
		f = bsoncore.AppendValueElement(f, bucket.FieldMeta, b.meta)
	}
	if b.hasLo || b.hasHi {
		si, d := bsoncore.AppendDocumentElementStart(f, bucket.FieldStart)
		if b.hasLo {
			d = bsoncore.AppendDateTimeElement(d, "$gte", rules.FloorMillis(b.lo, win))
		}
		if b.hasHi {
			d = bsoncore.AppendDateTimeElement(d, "$lte", b.hi)
		}
		f, _ = bsoncore.AppendDocumentEnd(d, si)
	}
	f, _ = bsoncore.AppendDocumentEnd(f, fi)
	r.fetch = []bsoncore.Document{bsoncore.NewDocumentBuilder().
		AppendString("find", r.rule.BucketCollection).
		AppendDocument("filter", f).
		AppendInt32("batchSize", 1000).
		AppendString("$db", r.rule.DB).
		Build()}
}

// bounds reads the top-level conjuncts (and those of a top-level $and).
func (r *Read) bounds(filter bsoncore.Document, b *fetchBounds, depth int) {
	es, _ := filter.Elements()
	for _, e := range es {
		switch key, v := e.Key(), e.Value(); {
		case key == "$and" && depth < 8:
			arr, _ := v.ArrayOK()
			vals, _ := arr.Values()
			for _, x := range vals {
				if d, ok := x.DocumentOK(); ok {
					r.bounds(d, b, depth+1)
				}
			}
		case key == r.rule.TimeField:
			ops, isOps := match.IsOperatorDoc(v)
			if !isOps {
				b.timeOp("$eq", v)
				continue
			}
			oes, _ := ops.Elements()
			for _, oe := range oes {
				b.timeOp(oe.Key(), oe.Value())
			}
		case key == r.rule.MetaField && r.rule.MetaField != "":
			if ops, isOps := match.IsOperatorDoc(v); isOps {
				if eq, err := ops.LookupErr("$eq"); err == nil {
					v = eq
				} else {
					continue
				}
			}
			if v.Type != bsoncore.TypeRegex && v.Type != bsoncore.TypeNull && v.Type != bsoncore.TypeArray {
				b.meta = bucket.EscapeMeta(v)
			}
		}
	}
}

// Next is the first upstream command to send, nil when none is needed.
func (r *Read) Next() bsoncore.Document {
	if len(r.fetch) == 0 {
		return nil
	}
	c := r.fetch[0]
	r.fetch = r.fetch[1:]
	return c
}

// Feed takes the reply to the last command and returns the next one to
// send, or nil when every candidate bucket was fetched.
func (r *Read) Feed(reply bsoncore.Document) (bsoncore.Document, error) {
	if err := reply.Validate(); err != nil {
		return nil, mongoerr.Errorf(mongoerr.InternalError, "upstream reply is not valid BSON: %v", err)
	}
	if !mongoerr.IsOK(reply) {
		e := insert.CommandErrorOf(reply)
		return nil, mongoerr.Errorf(e.Code, "tsproxy rule %s: reading buckets: %s", r.rule.Namespace, e.Msg)
	}
	cur, err := reply.LookupErr("cursor")
	curDoc, ok := cur.DocumentOK()
	if err != nil || !ok {
		return nil, mongoerr.Errorf(mongoerr.InternalError, "tsproxy rule %s: upstream find reply has no cursor", r.rule.Namespace)
	}
	batch, err := curDoc.LookupErr("firstBatch")
	if err != nil {
		batch, _ = curDoc.LookupErr("nextBatch")
	}
	arr, _ := batch.ArrayOK()
	vals, _ := arr.Values()
	for _, v := range vals {
		if d, ok := v.DocumentOK(); ok {
			// The bucket outlives the reply; its written slots point into
			// the copy (or into memory of their own, when packed).
			fb, err := r.fetched(append(bsoncore.Document(nil), d...))
			if err != nil {
				id, _ := d.Lookup(bucket.FieldID).ObjectIDOK()
				return nil, mongoerr.Errorf(mongoerr.InternalError, "tsproxy rule %s: bucket %x: %v", r.rule.Namespace, id, err)
			}
			r.buckets = append(r.buckets, fb)
			r.docs += len(fb.slots)
			if r.docs > maxLayoutDocs {
				return nil, r.unsupported("the read spans more than %d slot documents; narrow the filter by %s and %s", maxLayoutDocs, r.rule.TimeField, r.rule.MetaField)
			}
		}
	}
	if id, _ := curDoc.Lookup("id").AsInt64OK(); id != 0 && r.scan {
		return bsoncore.NewDocumentBuilder().
			AppendInt64("getMore", id).
			AppendString("collection", r.rule.BucketCollection).
			AppendInt32("batchSize", 1000).
			AppendString("$db", r.rule.DB).
			Build(), nil
	}
	return r.Next(), nil
}

// fetchedBucket is a fetched bucket and its written slots, decoded once
// (a packed map is decompressed once, not again to expand it).
type fetchedBucket struct {
	doc   bsoncore.Document
	slots []writtenSlot
}

// writtenSlot is one document a bucket expands to: a slot's value (a
// counter's count), and its weight in a count (a counter's count).
type writtenSlot struct {
	slot   int
	v      bsoncore.Value
	weight int64
}

// fetched decodes the written slots of b, in either form, so that a
// damaged map fails the read instead of reading as empty.
func (r *Read) fetched(b bsoncore.Document) (fetchedBucket, error) {
	fb := fetchedBucket{doc: b}
	if r.rule.Layout == rules.LayoutCounter {
		counts, err := readCounterSlots(b, r.rule.LayoutOptions.SlotsPerWindow())
		for slot, c := range counts {
			if c <= 0 {
				continue
			}
			cv := bsoncore.Value{Type: bsoncore.TypeInt64, Data: bsoncore.AppendInt64(nil, c)}
			if c <= 1<<31-1 {
				cv = bsoncore.Value{Type: bsoncore.TypeInt32, Data: bsoncore.AppendInt32(nil, int32(c))}
			}
			fb.slots = append(fb.slots, writtenSlot{slot: slot, v: cv, weight: c})
		}
		return fb, err
	}
	g, err := readSlotGrid(b, r.rule.LayoutOptions)
	for s, w := range g.written {
		if w {
			fb.slots = append(fb.slots, writtenSlot{slot: s, v: g.vals[s], weight: 1})
		}
	}
	return fb, err
}

// expand turns the fetched buckets into the app's documents, in (time,
// meta) order. The documents share one buffer, sized up front, and sort
// by keys read once (a read of ten hosts' hours of one-second slots
// expands to 36,000 documents).
func (r *Read) expand() []layoutDoc {
	out := make([]layoutDoc, 0, r.docs)
	slotMS := r.rule.LayoutOptions.Slot.Milliseconds()
	field := r.rule.LayoutOptions.ValueField
	if r.rule.Layout == rules.LayoutCounter {
		field = CountField
	}
	type head struct {
		ok    bool // it has a start, so documents
		start int64
		id    [12]byte
		meta  bsoncore.Value // Null when the documents have none
	}
	heads := make([]head, len(r.buckets))
	size := 0
	for i, fb := range r.buckets {
		start, ok := fb.doc.Lookup(bucket.FieldStart).DateTimeOK()
		if !ok {
			continue
		}
		h := head{ok: true, start: start, meta: bsoncore.Value{Type: bsoncore.TypeNull}}
		h.id, _ = fb.doc.Lookup(bucket.FieldID).ObjectIDOK()
		if m := fb.doc.Lookup(bucket.FieldMeta); r.rule.MetaField != "" && m.Type != 0 && m.Type != bsoncore.TypeNull {
			h.meta = bucket.UserMeta(m)
		}
		heads[i] = h
		for _, ws := range fb.slots {
			size += layoutDocSize(r.rule, field, h.meta, ws)
		}
	}
	arena := make([]byte, 0, size)
	for i, fb := range r.buckets {
		h := heads[i]
		if !h.ok {
			continue
		}
		for _, ws := range fb.slots {
			at := len(arena)
			ms := h.start + int64(ws.slot)*slotMS
			di, d := bsoncore.AppendDocumentStart(arena)
			d = appendSlotID(d, h.id, ws.slot)
			if h.meta.Type != bsoncore.TypeNull {
				d = bsoncore.AppendValueElement(d, r.rule.MetaField, h.meta)
			}
			d = bsoncore.AppendDateTimeElement(d, r.rule.TimeField, ms)
			d = bsoncore.AppendValueElement(d, field, ws.v)
			arena, _ = bsoncore.AppendDocumentEnd(d, di)
			out = append(out, layoutDoc{doc: arena[at:len(arena):len(arena)], weight: ws.weight, ms: ms, meta: h.meta, made: len(out)})
		}
	}
	// Unstable, but in a total order: ties keep the order made.
	slices.SortFunc(out, func(a, b layoutDoc) int {
		if c := cmp.Compare(a.ms, b.ms); c != 0 {
			return c
		}
		if r.rule.MetaField != "" {
			if c := bsonutil.Compare(a.meta, b.meta); c != 0 {
				return c
			}
		}
		return cmp.Compare(a.made, b.made)
	})
	return out
}

// layoutDocSize is the length of the document expand makes of ws.
func layoutDocSize(rule *rules.Rule, field string, meta bsoncore.Value, ws writtenSlot) int {
	n := 5 + slotIDSize(ws.slot) + // length, _id, terminator
		2 + len(rule.TimeField) + 8 +
		2 + len(field) + len(ws.v.Data)
	if meta.Type != bsoncore.TypeNull {
		n += 2 + len(rule.MetaField) + len(meta.Data)
	}
	return n
}

// appendSlotID appends the _id of a slot's document, "<bucket id in
// hex>:<slot>", without a string of its own.
func appendSlotID(dst []byte, id [12]byte, slot int) []byte {
	var num [20]byte
	digits := strconv.AppendInt(num[:0], int64(slot), 10)
	dst = bsoncore.AppendHeader(dst, bsoncore.TypeString, "_id")
	dst = bsoncore.AppendInt32(dst, int32(2*len(id)+1+len(digits)+1))
	dst = hex.AppendEncode(dst, id[:])
	dst = append(dst, ':')
	dst = append(dst, digits...)
	return append(dst, 0)
}

// slotIDSize is the length of the element appendSlotID appends.
func slotIDSize(slot int) int {
	var num [20]byte
	return 1 + 4 + 4 + 24 + 1 + len(strconv.AppendInt(num[:0], int64(slot), 10)) + 1
}

// run applies the filter and the stages.
func (r *Read) run() []layoutDoc {
	all := r.expand()
	docs := all[:0]
	for _, d := range all {
		if r.match(d.doc) {
			docs = append(docs, d)
		}
	}
	for _, st := range r.stages {
		switch st.kind {
		case 's':
			slices.SortStableFunc(docs, func(a, b layoutDoc) int {
				for _, k := range st.sort {
					c := bsonutil.Compare(lookupOrNull(a.doc, k.path), lookupOrNull(b.doc, k.path))
					if k.desc {
						c = -c
					}
					if c != 0 {
						return c
					}
				}
				return 0
			})
		case 'k':
			docs = docs[min(int64(len(docs)), st.skip):]
		case 'l':
			docs = docs[:min(int64(len(docs)), st.limit)]
		case 'p':
			for i := range docs {
				docs[i].doc = st.proj.apply(docs[i].doc)
			}
		case 'c', 'g':
			var n int64
			for _, d := range docs {
				n += d.weight
			}
			if n == 0 {
				return nil // as MongoDB: no document when nothing was counted
			}
			b := bsoncore.NewDocumentBuilder()
			if st.kind == 'g' {
				b.AppendValue("_id", st.groupID)
				appendLayoutCount(b, st.group, n)
			} else {
				appendLayoutCount(b, st.countAs, n)
			}
			return []layoutDoc{{doc: b.Build(), weight: n}}
		}
	}
	return docs
}

// Result answers the read once every bucket was fetched. For a cursor
// that is not exhausted by the first batch it returns the rest as a
// LayoutCursor, to be kept under id (the id the proxy chose for it).
func (r *Read) Result(id int64) (bsoncore.Document, *Cursor) {
	docs := r.run()
	if r.kind == "count" {
		var n int64
		for _, d := range docs {
			n += d.weight
		}
		return bsoncore.NewDocumentBuilder().AppendInt64("n", n).AppendDouble("ok", 1).Build(), nil
	}
	raw := make([]bsoncore.Document, len(docs))
	for i, d := range docs {
		raw[i] = d.doc
	}
	cur := &Cursor{ns: r.rule.Namespace, docs: raw}
	size := int64(101)
	if r.batch >= 0 {
		size = r.batch
	}
	if r.single {
		size = int64(len(raw))
	}
	out := cur.reply("firstBatch", size, id)
	if len(cur.docs) == 0 || r.single {
		return out.WithID(0), nil
	}
	return out.WithID(id), cur
}
