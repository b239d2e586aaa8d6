package layout

import (
	"encoding/hex"
	"slices"
	"strconv"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/insert"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/query"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// planFetch chooses between point lookups and a scan.
func (r *Read) planFetch(filter bsoncore.Document) {
	var b fetchBounds
	r.bounds(filter, &b, 0)
	win := r.rule.LayoutOptions.Window.Milliseconds()
	if exactMeta(b.meta) && b.hasLo && b.hasHi && b.lo <= b.hi && r.rule.MetaField != "" {
		first, last := rules.FloorMillis(b.lo, win), rules.FloorMillis(b.hi, win)
		if (last-first)/win < maxPointLookups {
			for s := first; s <= last; s += win {
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
			ops, isOps := query.IsOperatorDoc(v)
			if !isOps {
				b.timeOp("$eq", v)
				continue
			}
			oes, _ := ops.Elements()
			for _, oe := range oes {
				b.timeOp(oe.Key(), oe.Value())
			}
		case key == r.rule.MetaField && r.rule.MetaField != "":
			if ops, isOps := query.IsOperatorDoc(v); isOps {
				if eq, err := ops.LookupErr("$eq"); err == nil {
					v = eq
				} else {
					continue
				}
			}
			if v.Type != bsoncore.TypeRegex && v.Type != bsoncore.TypeNull && v.Type != bsoncore.TypeArray {
				b.meta = v
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
			n, err := r.slotsIn(d)
			if err != nil {
				id, _ := d.Lookup(bucket.FieldID).ObjectIDOK()
				return nil, mongoerr.Errorf(mongoerr.InternalError, "tsproxy rule %s: bucket %x: %v", r.rule.Namespace, id, err)
			}
			r.buckets = append(r.buckets, append(bsoncore.Document(nil), d...))
			r.docs += n
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

// slotsIn counts the documents a fetched bucket expands to, decoding its
// map (either form), so that a damaged one fails the read instead of
// reading as empty.
func (r *Read) slotsIn(b bsoncore.Document) (int, error) {
	n := 0
	if r.rule.Layout == rules.LayoutCounter {
		counts, err := readCounterSlots(b, r.rule.LayoutOptions.SlotsPerWindow())
		for _, c := range counts {
			if c > 0 {
				n++
			}
		}
		return n, err
	}
	g, err := readSlotGrid(b, r.rule.LayoutOptions)
	for _, w := range g.written {
		if w {
			n++
		}
	}
	return n, err
}

// expand turns the fetched buckets into the app's documents, in (time,
// meta) order.
func (r *Read) expand() []layoutDoc {
	out := make([]layoutDoc, 0, r.docs)
	slotMS := r.rule.LayoutOptions.Slot.Milliseconds()
	for _, b := range r.buckets {
		start, ok := b.Lookup(bucket.FieldStart).DateTimeOK()
		if !ok {
			continue
		}
		id, _ := b.Lookup(bucket.FieldID).ObjectIDOK()
		meta := b.Lookup(bucket.FieldMeta)
		emit := func(slot int, key string, v bsoncore.Value, weight int64) {
			di, d := bsoncore.AppendDocumentStart(nil)
			d = bsoncore.AppendStringElement(d, "_id", hex.EncodeToString(id[:])+":"+strconv.Itoa(slot))
			if r.rule.MetaField != "" && meta.Type != 0 && meta.Type != bsoncore.TypeNull {
				d = bsoncore.AppendValueElement(d, r.rule.MetaField, meta)
			}
			d = bsoncore.AppendDateTimeElement(d, r.rule.TimeField, start+int64(slot)*slotMS)
			d = bsoncore.AppendValueElement(d, key, v)
			d, _ = bsoncore.AppendDocumentEnd(d, di)
			out = append(out, layoutDoc{doc: d, weight: weight})
		}
		if r.rule.Layout == rules.LayoutCounter {
			r.expandCounter(b, emit)
		} else {
			r.expandSlots(b, emit)
		}
	}
	slices.SortStableFunc(out, func(a, b layoutDoc) int {
		if c := bsonutil.Compare(a.doc.Lookup(r.rule.TimeField), b.doc.Lookup(r.rule.TimeField)); c != 0 {
			return c
		}
		if r.rule.MetaField == "" {
			return 0
		}
		return bsonutil.Compare(lookupOrNull(a.doc, []string{r.rule.MetaField}), lookupOrNull(b.doc, []string{r.rule.MetaField}))
	})
	return out
}

func (r *Read) expandCounter(b bsoncore.Document, emit func(int, string, bsoncore.Value, int64)) {
	counts, _ := readCounterSlots(b, r.rule.LayoutOptions.SlotsPerWindow()) // checked when fetched (Feed)
	for slot, c := range counts {
		if c <= 0 {
			continue
		}
		cv := bsoncore.Value{Type: bsoncore.TypeInt64, Data: bsoncore.AppendInt64(nil, c)}
		if c <= 1<<31-1 {
			cv = bsoncore.Value{Type: bsoncore.TypeInt32, Data: bsoncore.AppendInt32(nil, int32(c))}
		}
		emit(slot, CountField, cv, c)
	}
}

func (r *Read) expandSlots(b bsoncore.Document, emit func(int, string, bsoncore.Value, int64)) {
	o := r.rule.LayoutOptions
	g, _ := readSlotGrid(b, o) // checked when fetched (Feed)
	for s, w := range g.written {
		if w {
			emit(s, o.ValueField, g.vals[s], 1)
		}
	}
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
