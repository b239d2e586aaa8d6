package layout

import (
	"fmt"
	"strings"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/match"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/query"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

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
	// The sort keys of expand: the time, the meta (Null when none), and
	// the order it was made in.
	ms   int64
	meta bsoncore.Value
	made int
}

// LayoutRead is a read on a counter or slots rule: fetch the candidate
// buckets with Next/Feed, then answer with Result.
type Read struct {
	rule    *rules.Rule
	kind    string // find, aggregate, count
	match   match.DocPred
	stages  []layoutStage
	fetch   []bsoncore.Document // point lookups still to send
	scan    bool
	buckets []fetchedBucket
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

func (r *Read) unsupported(format string, args ...any) error {
	return mongoerr.Errorf(mongoerr.NotImplemented, "tsproxy rule %s (layout %s): %s", r.rule.Namespace, r.rule.Layout, fmt.Sprintf(format, args...))
}

// PlanLayoutRead plans a find, aggregate or count on a counter or slots
// rule; other commands are refused with an error naming the rule.
func PlanRead(body bsoncore.Document, rule *rules.Rule) (*Read, error) {
	elems, err := body.Elements()
	if err != nil || len(elems) == 0 {
		return nil, mongoerr.Errorf(mongoerr.BadValue, "empty command")
	}
	r := &Read{rule: rule, kind: elems[0].Key(), batch: -1}
	// A routing mistake must not read another namespace's buckets.
	if err := query.CheckTarget(body, rule, r.kind); err != nil {
		return nil, err
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
	fc := &match.Compiler{Unsupported: r.unsupported}
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

func (r *Read) readFind(body bsoncore.Document) (bsoncore.Document, error) {
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

func (r *Read) readCount(body bsoncore.Document) (bsoncore.Document, error) {
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

func (r *Read) readAggregate(body bsoncore.Document) (bsoncore.Document, error) {
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
func (r *Read) readStage(name string, arg bsoncore.Value, leading bool, filters *[]bsoncore.Document) error {
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
func (r *Read) readGroupCount(arg bsoncore.Value) error {
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

func (r *Read) parseSort(d bsoncore.Document) (layoutStage, error) {
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
