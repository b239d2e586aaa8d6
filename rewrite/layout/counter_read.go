package layout

import (
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/insert"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/query"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// planFetch chooses between point lookups and a scan.
func (r *LayoutRead) planFetch(filter bsoncore.Document) {
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
func (r *LayoutRead) bounds(filter bsoncore.Document, b *fetchBounds, depth int) {
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
func (r *LayoutRead) Next() bsoncore.Document {
	if len(r.fetch) == 0 {
		return nil
	}
	c := r.fetch[0]
	r.fetch = r.fetch[1:]
	return c
}

// Feed takes the reply to the last command and returns the next one to
// send, or nil when every candidate bucket was fetched.
func (r *LayoutRead) Feed(reply bsoncore.Document) (bsoncore.Document, error) {
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
			r.buckets = append(r.buckets, append(bsoncore.Document(nil), d...))
			r.docs += r.slotsIn(d)
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

// slotsIn is an upper bound of the documents a bucket expands to.
func (r *LayoutRead) slotsIn(b bsoncore.Document) int {
	if r.rule.Layout == rules.LayoutCounter {
		if v, err := b.LookupErr(rules.BucketSlots); err == nil {
			d, _ := v.DocumentOK()
			es, _ := d.Elements()
			return len(es)
		}
		return 0
	}
	if v, err := b.LookupErr(rules.BucketNumSamples); err == nil {
		n, _ := v.AsInt64OK()
		return int(n)
	}
	return 0
}

// expand turns the fetched buckets into the app's documents, in (time,
// meta) order.
func (r *LayoutRead) expand() []layoutDoc {
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

func (r *LayoutRead) expandCounter(b bsoncore.Document, emit func(int, string, bsoncore.Value, int64)) {
	v, err := b.LookupErr(rules.BucketSlots)
	if err != nil {
		return
	}
	d, _ := v.DocumentOK()
	es, _ := d.Elements()
	n := r.rule.LayoutOptions.SlotsPerWindow()
	for _, e := range es {
		slot, err := strconv.Atoi(e.Key())
		c, ok := e.Value().AsInt64OK()
		if err != nil || slot < 0 || slot >= n || !ok || c <= 0 {
			continue
		}
		cv := bsoncore.Value{Type: bsoncore.TypeInt64, Data: bsoncore.AppendInt64(nil, c)}
		if c <= 1<<31-1 {
			cv = bsoncore.Value{Type: bsoncore.TypeInt32, Data: bsoncore.AppendInt32(nil, int32(c))}
		}
		emit(slot, CountField, cv, c)
	}
}

func (r *LayoutRead) expandSlots(b bsoncore.Document, emit func(int, string, bsoncore.Value, int64)) {
	o := r.rule.LayoutOptions
	for s := 0; s < o.SlotsPerWindow(); s++ {
		if v, ok := slotValue(b, o, s); ok {
			emit(s, o.ValueField, v, 1)
		}
	}
}

// run applies the filter and the stages.
func (r *LayoutRead) run() []layoutDoc {
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
func (r *LayoutRead) Result(id int64) (bsoncore.Document, *LayoutCursor) {
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
	cur := &LayoutCursor{ns: r.rule.Namespace, docs: raw}
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

// CountField is the count of events of a counter's slot document.
const CountField = "count"

// maxLayoutDocs bounds the documents one read materialises in the proxy.
const maxLayoutDocs = 1_000_000

// maxPointLookups bounds the windows read by point lookups; more are read
// with one scan.
const maxPointLookups = 64

// layoutDoc is a document of a read and the events it stands for.
type layoutDoc struct {
	doc    bsoncore.Document
	weight int64
}

// LayoutRead is a read on a counter or slots rule: fetch the candidate
// buckets with Next/Feed, then answer with Result.
type LayoutRead struct {
	rule    *rules.Rule
	kind    string // find, aggregate, count
	match   query.DocPred
	stages  []layoutStage
	fetch   []bsoncore.Document // point lookups still to send
	scan    bool
	buckets []bsoncore.Document
	docs    int
	batch   int64 // first batch size; -1 for the default
	single  bool
	err     error
}

// layoutStage is a step after the filter: sort, skip, limit, project, or
// a count (last).
type layoutStage struct {
	sort    []sortKey
	skip    int64
	limit   int64 // 0: none
	proj    *layoutProjection
	countAs string         // $count: field name
	groupID bsoncore.Value // $group count form: the _id
	group   string         // $group count form: the counted field
	kind    byte           // 's'ort 'k'skip 'l'imit 'p'roject 'c'ount 'g'roup
}

type sortKey struct {
	path []string
	desc bool
}

func (r *LayoutRead) unsupported(format string, args ...any) error {
	return mongoerr.Errorf(mongoerr.NotImplemented, "tsproxy rule %s (layout %s): %s", r.rule.Namespace, r.rule.Layout, fmt.Sprintf(format, args...))
}

// PlanLayoutRead plans a find, aggregate or count on a counter or slots
// rule; other commands are refused with an error naming the rule.
func PlanLayoutRead(body bsoncore.Document, rule *rules.Rule) (*LayoutRead, error) {
	if err := bsonutil.Validate(body, 0); err != nil {
		return nil, mongoerr.Errorf(mongoerr.InvalidBSON, "command is not valid BSON: %v", err)
	}
	elems, err := body.Elements()
	if err != nil || len(elems) == 0 {
		return nil, mongoerr.Errorf(mongoerr.BadValue, "empty command")
	}
	r := &LayoutRead{rule: rule, kind: elems[0].Key(), batch: -1}
	if coll, _ := elems[0].Value().StringValueOK(); coll != rule.Collection {
		return nil, mongoerr.Errorf(mongoerr.BadValue, "%s on collection %q does not match the rule's collection %q", r.kind, coll, rule.Collection)
	}
	if _, ok := bsonutil.Lookup(body, "collation"); ok {
		return nil, r.unsupported("collation is not supported")
	}
	var filter bsoncore.Document
	switch r.kind {
	case "find":
		filter, err = r.readFind(body)
	case "count":
		filter, err = r.readCount(body)
	case "aggregate":
		filter, err = r.readAggregate(body)
	default:
		return nil, r.unsupported("command %s is not supported", r.kind)
	}
	if err != nil {
		return nil, err
	}
	fc := &query.Compiler{Unsupported: r.unsupported}
	if r.match, err = fc.Compile(filter, 0); err != nil {
		return nil, err
	}
	r.planFetch(filter)
	return r, nil
}

func docArg(body bsoncore.Document, key string) (bsoncore.Document, error) {
	v, ok := bsonutil.Lookup(body, key)
	if !ok || v.Type == bsoncore.TypeNull {
		return bsoncore.Document(emptyDoc), nil
	}
	d, ok := v.DocumentOK()
	if !ok {
		return nil, mongoerr.Errorf(mongoerr.TypeMismatch, "%q must be an object, got %s", key, bsonutil.TypeName(v.Type))
	}
	return d, nil
}

var emptyDoc = []byte{5, 0, 0, 0, 0}

func intArg(body bsoncore.Document, key string) (int64, bool, error) {
	v, ok := bsonutil.Lookup(body, key)
	if !ok || v.Type == bsoncore.TypeNull {
		return 0, false, nil
	}
	if !v.IsNumber() {
		return 0, false, mongoerr.Errorf(mongoerr.TypeMismatch, "%q must be a number, got %s", key, bsonutil.TypeName(v.Type))
	}
	f, _ := v.AsFloat64OK()
	return int64(f), true, nil
}

func (r *LayoutRead) readFind(body bsoncore.Document) (bsoncore.Document, error) {
	for _, k := range []string{"hint", "min", "max", "returnKey", "showRecordId", "tailable", "awaitData", "let"} {
		if _, ok := bsonutil.Lookup(body, k); ok {
			return nil, r.unsupported("find option %q is not supported", k)
		}
	}
	filter, err := docArg(body, "filter")
	if err != nil {
		return nil, err
	}
	if sort, err := docArg(body, "sort"); err != nil {
		return nil, err
	} else if len(sort) > 5 {
		st, err := r.parseSort(sort)
		if err != nil {
			return nil, err
		}
		r.stages = append(r.stages, st)
	}
	if n, ok, err := intArg(body, "skip"); err != nil {
		return nil, err
	} else if ok {
		if n < 0 {
			return nil, mongoerr.Errorf(mongoerr.BadValue, "skip must be non-negative")
		}
		r.stages = append(r.stages, layoutStage{kind: 'k', skip: n})
	}
	if n, ok, err := intArg(body, "limit"); err != nil {
		return nil, err
	} else if ok && n != 0 {
		if n < 0 {
			n, r.single = -n, true
		}
		r.stages = append(r.stages, layoutStage{kind: 'l', limit: n})
	}
	if proj, err := docArg(body, "projection"); err != nil {
		return nil, err
	} else if len(proj) > 5 {
		p, err := r.parseProjection(proj)
		if err != nil {
			return nil, err
		}
		r.stages = append(r.stages, layoutStage{kind: 'p', proj: p})
	}
	if n, ok, err := intArg(body, "batchSize"); err != nil {
		return nil, err
	} else if ok {
		if n < 0 {
			return nil, mongoerr.Errorf(mongoerr.BadValue, "batchSize must be non-negative")
		}
		r.batch = n
	}
	if b, err := bsonutil.Bool(body, "singleBatch", false); err != nil {
		return nil, err
	} else if b {
		r.single = true
	}
	return filter, nil
}

func (r *LayoutRead) readCount(body bsoncore.Document) (bsoncore.Document, error) {
	filter, err := docArg(body, "query")
	if err != nil {
		return nil, err
	}
	if n, ok, err := intArg(body, "skip"); err != nil {
		return nil, err
	} else if ok && n > 0 {
		r.stages = append(r.stages, layoutStage{kind: 'k', skip: n})
	}
	if n, ok, err := intArg(body, "limit"); err != nil {
		return nil, err
	} else if ok && n != 0 {
		r.stages = append(r.stages, layoutStage{kind: 'l', limit: max(n, -n)})
	}
	return filter, nil
}

func (r *LayoutRead) readAggregate(body bsoncore.Document) (bsoncore.Document, error) {
	v, ok := bsonutil.Lookup(body, "pipeline")
	arr, isArr := v.ArrayOK()
	if !ok || !isArr {
		return nil, mongoerr.Errorf(mongoerr.TypeMismatch, "aggregate needs a pipeline array")
	}
	if cur, err := docArg(body, "cursor"); err != nil {
		return nil, err
	} else if n, ok, err := intArg(cur, "batchSize"); err != nil {
		return nil, err
	} else if ok {
		r.batch = max(n, 0)
	}
	if _, ok := bsonutil.Lookup(body, "explain"); ok {
		return nil, r.unsupported("explain is not supported")
	}
	stages, _ := arr.Values()
	var filters []bsoncore.Document
	for i, sv := range stages {
		st, ok := sv.DocumentOK()
		if !ok {
			return nil, mongoerr.Errorf(mongoerr.TypeMismatch, "pipeline stage %d must be an object", i)
		}
		se, err := st.Elements()
		if err != nil || len(se) != 1 {
			return nil, mongoerr.Errorf(mongoerr.BadValue, "pipeline stage %d must have exactly one field", i)
		}
		name, arg := se[0].Key(), se[0].Value()
		if len(r.stages) > 0 && (r.stages[len(r.stages)-1].kind == 'c' || r.stages[len(r.stages)-1].kind == 'g') {
			return nil, r.unsupported("stage %s after a count is not supported", name)
		}
		if err := r.readStage(name, arg, len(r.stages) == 0, &filters); err != nil {
			return nil, err
		}
	}
	if len(filters) == 0 {
		return bsoncore.Document(emptyDoc), nil
	}
	return query.AndOf(filters), nil
}

// readStage reads one pipeline stage; leading $match stages make the filter.
func (r *LayoutRead) readStage(name string, arg bsoncore.Value, leading bool, filters *[]bsoncore.Document) error {
	switch name {
	case "$match":
		d, ok := arg.DocumentOK()
		if !ok {
			return mongoerr.Errorf(mongoerr.TypeMismatch, "$match must be an object")
		}
		if !leading {
			return r.unsupported("$match after another stage is not supported; put it first")
		}
		*filters = append(*filters, d)
		return nil
	case "$sort":
		d, ok := arg.DocumentOK()
		if !ok {
			return mongoerr.Errorf(mongoerr.TypeMismatch, "$sort must be an object")
		}
		st, err := r.parseSort(d)
		if err == nil {
			r.stages = append(r.stages, st)
		}
		return err
	case "$skip", "$limit":
		if !arg.IsNumber() {
			return mongoerr.Errorf(mongoerr.TypeMismatch, "%s must be a number", name)
		}
		n, _ := arg.AsInt64OK()
		if f, ok := arg.DoubleOK(); ok {
			n = int64(f)
		}
		if n < 0 || (name == "$limit" && n == 0) {
			return mongoerr.Errorf(mongoerr.BadValue, "%s must be positive", name)
		}
		if name == "$skip" {
			r.stages = append(r.stages, layoutStage{kind: 'k', skip: n})
		} else {
			r.stages = append(r.stages, layoutStage{kind: 'l', limit: n})
		}
		return nil
	case "$project":
		d, ok := arg.DocumentOK()
		if !ok {
			return mongoerr.Errorf(mongoerr.TypeMismatch, "$project must be an object")
		}
		p, err := r.parseProjection(d)
		if err == nil {
			r.stages = append(r.stages, layoutStage{kind: 'p', proj: p})
		}
		return err
	case "$count":
		s, ok := arg.StringValueOK()
		if !ok || s == "" || strings.HasPrefix(s, "$") || strings.Contains(s, ".") {
			return mongoerr.Errorf(mongoerr.BadValue, "$count needs a field name")
		}
		r.stages = append(r.stages, layoutStage{kind: 'c', countAs: s})
		return nil
	case "$group":
		return r.readGroupCount(arg)
	}
	return r.unsupported("aggregation stage %s is not supported (supported: $match first, $sort, $skip, $limit, $project, $count, $group {_id: c, n: {$sum: 1}})", name)
}

// readGroupCount accepts the count form drivers send for countDocuments:
// {$group: {_id: <constant>, n: {$sum: 1}}}.
func (r *LayoutRead) readGroupCount(arg bsoncore.Value) error {
	refuse := r.unsupported("$group is supported only as {_id: <constant>, <field>: {$sum: 1}}")
	d, ok := arg.DocumentOK()
	if !ok {
		return refuse
	}
	es, _ := d.Elements()
	if len(es) != 2 || es[0].Key() != "_id" {
		return refuse
	}
	id := es[0].Value()
	if s, ok := id.StringValueOK(); ok && strings.HasPrefix(s, "$") {
		return refuse
	}
	if _, isDoc := id.DocumentOK(); isDoc {
		return refuse
	}
	acc, ok := es[1].Value().DocumentOK()
	if !ok {
		return refuse
	}
	sum, err := acc.LookupErr("$sum")
	if ae, _ := acc.Elements(); err != nil || len(ae) != 1 || !sum.IsNumber() {
		return refuse
	}
	if f, _ := sum.AsFloat64OK(); f != 1 {
		return refuse
	}
	r.stages = append(r.stages, layoutStage{kind: 'g', groupID: id, group: es[1].Key()})
	return nil
}

func (r *LayoutRead) parseSort(d bsoncore.Document) (layoutStage, error) {
	es, err := d.Elements()
	if err != nil {
		return layoutStage{}, mongoerr.Errorf(mongoerr.BadValue, "sort is not valid BSON")
	}
	st := layoutStage{kind: 's'}
	for _, e := range es {
		f, ok := e.Value().AsFloat64OK()
		if !e.Value().IsNumber() || !ok || (f != 1 && f != -1) {
			return layoutStage{}, r.unsupported("sort of %q must be 1 or -1", e.Key())
		}
		st.sort = append(st.sort, sortKey{path: strings.Split(e.Key(), "."), desc: f < 0})
	}
	return st, nil
}

// layoutProjection is an inclusion or exclusion of top-level fields.
type layoutProjection struct {
	include bool
	fields  map[string]bool
	noID    bool
}

func (r *LayoutRead) parseProjection(d bsoncore.Document) (*layoutProjection, error) {
	es, err := d.Elements()
	if err != nil {
		return nil, mongoerr.Errorf(mongoerr.BadValue, "projection is not valid BSON")
	}
	p := &layoutProjection{fields: map[string]bool{}}
	mode := 0 // 1 include, -1 exclude
	for _, e := range es {
		v := e.Value()
		var on bool
		switch {
		case v.Type == bsoncore.TypeBoolean:
			on = v.Boolean()
		case v.IsNumber():
			f, _ := v.AsFloat64OK()
			on = f != 0
		default:
			return nil, r.unsupported("projection of %q: only 0/1 (true/false) are supported", e.Key())
		}
		if strings.Contains(e.Key(), ".") || strings.HasPrefix(e.Key(), "$") {
			return nil, r.unsupported("projection of %q: only top-level fields are supported", e.Key())
		}
		if e.Key() == "_id" {
			p.noID = !on
			continue
		}
		m := -1
		if on {
			m = 1
		}
		if mode != 0 && mode != m {
			return nil, mongoerr.Errorf(mongoerr.BadValue, "projection cannot mix inclusion and exclusion (field %q)", e.Key())
		}
		mode = m
		p.fields[e.Key()] = true
	}
	p.include = mode == 1
	return p, nil
}

func (p *layoutProjection) apply(doc bsoncore.Document) bsoncore.Document {
	es, _ := doc.Elements()
	di, out := bsoncore.AppendDocumentStart(nil)
	for _, e := range es {
		k := e.Key()
		keep := !p.fields[k]
		if p.include {
			keep = p.fields[k]
		}
		if k == "_id" {
			keep = !p.noID
		}
		if keep {
			out = append(out, e...)
		}
	}
	out, _ = bsoncore.AppendDocumentEnd(out, di)
	return out
}
