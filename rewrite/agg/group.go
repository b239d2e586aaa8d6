package agg

import (
	"slices"
	"strings"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/expr"
	"github.com/tsproxy/tsproxy/rewrite/expr/value"
)

// $group: groups in the order their first document came (MongoDB gives
// no order); the output is {_id, <field>...} in the spec's order.
type groupStage struct {
	id     expr.Expr
	specs  []expr.AccumulatorSpec
	groups map[string]int
	ids    []value.Value
	accs   [][]value.Accumulator
	bytes  int
	max    int
	next   processor
	name   string
}

func compileGroup(v value.Value, next processor, opts Options) (processor, error) {
	d, ok := v.DocumentOK()
	if !ok {
		return nil, value.BadValue(15947, "a group's fields must be specified in an object")
	}
	g := &groupStage{groups: map[string]int{}, max: opts.MaxMemory, next: next, name: "$group"}
	elems, _ := d.Elements()
	for _, e := range elems {
		if e.Key() == "_id" {
			id, err := expr.CompileTop(e.Value(), 1)
			if err != nil {
				return nil, err
			}
			if o, ok := id.(expr.ObjectExpr); ok {
				// MongoDB's $group makes a missing value of a field of an
				// _id object null ({x: "$m"} is {x: null} whether m is
				// null or missing: one group), unlike an object
				// expression elsewhere, which drops the field.
				id = groupIDObject{o}
			}
			g.id = id
			continue
		}
		spec, err := expr.CompileAccumulator(e.Key(), e.Value())
		if err != nil {
			return nil, err
		}
		g.specs = append(g.specs, spec)
	}
	if g.id == nil {
		return nil, value.BadValue(15955, "a group specification must include an _id")
	}
	return g, nil
}

func (g *groupStage) push(doc bsoncore.Document) error {
	id, err := g.id.Eval(doc)
	if err != nil {
		return err
	}
	key := string(value.GroupKey(nil, id))
	i, ok := g.groups[key]
	if !ok {
		i = len(g.ids)
		g.groups[key] = i
		if id.Type == 0 {
			id = value.Null
		}
		g.ids = append(g.ids, value.Clone(id))
		accs := make([]value.Accumulator, len(g.specs))
		for j, s := range g.specs {
			accs[j] = s.Make()
			g.bytes += accs[j].Size()
		}
		g.accs = append(g.accs, accs)
		g.bytes += 2*len(key) + 64
	}
	for j, s := range g.specs {
		v, err := s.Arg.Eval(doc)
		if err != nil {
			return err
		}
		a := g.accs[i][j]
		before := a.Size()
		a.Add(v)
		g.bytes += a.Size() - before
	}
	if g.bytes > g.max {
		return exceeded(g.name, g.max)
	}
	return nil
}

func (g *groupStage) flush() error {
	for i, id := range g.ids {
		idx, out := bsoncore.AppendDocumentStart(nil)
		out = bsoncore.AppendValueElement(out, "_id", id)
		for j, s := range g.specs {
			v, err := g.accs[i][j].Result()
			if err != nil {
				return err
			}
			out = bsoncore.AppendValueElement(out, s.Field, v)
		}
		out, _ = bsoncore.AppendDocumentEnd(out, idx)
		if err := g.next.push(out); err != nil {
			return err
		}
	}
	g.groups, g.ids, g.accs = nil, nil, nil
	return g.next.flush()
}

// $sortByCount: {_id: <value>, count: n}, most frequent first.
func compileSortByCount(v value.Value, next processor, opts Options) (processor, error) {
	if s, ok := v.StringValueOK(); !ok || len(s) < 2 || s[0] != '$' {
		if _, isDoc := v.DocumentOK(); !isDoc {
			return nil, value.BadValue(40148, "the sortByCount field must be defined as a $-prefixed path or an expression")
		}
	}
	id, err := expr.CompileTop(v, 1)
	if err != nil {
		return nil, err
	}
	sorter := &sortStage{keys: []sortKey{{path: []string{"count"}, desc: true}}, max: opts.MaxMemory, next: next, name: "$sortByCount"}
	return &groupStage{id: id, specs: []expr.AccumulatorSpec{{Field: "count", Op: "$sum", Arg: expr.Literal{V: value.Int32Value(1)}}},
		groups: map[string]int{}, max: opts.MaxMemory, next: sorter, name: "$sortByCount"}, nil
}

// $sort: stable, in BSON order, missing sorting as null; an array sorts
// by its least element ascending and its greatest descending.
type sortKey struct {
	path []string
	desc bool
}

type sortStage struct {
	keys  []sortKey
	docs  []bsoncore.Document
	bytes int
	max   int
	next  processor
	name  string
}

func compileSort(v value.Value, next processor, opts Options) (processor, error) {
	d, ok := v.DocumentOK()
	if !ok {
		return nil, value.BadValue(15973, "the $sort key specification must be an object")
	}
	s := &sortStage{max: opts.MaxMemory, next: next, name: "$sort"}
	elems, _ := d.Elements()
	for _, e := range elems {
		k, i, f, isNum := value.Number(e.Value())
		if k == value.KindDouble {
			i = int64(f)
		}
		if !isNum {
			if _, isDoc := e.Value().DocumentOK(); isDoc {
				return nil, value.Unsupported("a $sort by $meta")
			}
			return nil, value.BadValue(15974, "Illegal key in $sort specification: %s: %s", e.Key(), e.Value())
		}
		if i != 1 && i != -1 {
			return nil, value.BadValue(15975, "$sort key ordering must be 1 (for ascending) or -1 (for descending)")
		}
		s.keys = append(s.keys, sortKey{path: splitPath(e.Key()), desc: i == -1})
	}
	if len(s.keys) == 0 {
		return nil, value.BadValue(15976, "$sort stage must have at least one sort key")
	}
	return s, nil
}

func splitPath(p string) []string {
	var out []string
	start := 0
	for i := 0; i < len(p); i++ {
		if p[i] == '.' {
			out = append(out, p[start:i])
			start = i + 1
		}
	}
	return append(out, p[start:])
}

func (s *sortStage) push(doc bsoncore.Document) error {
	if err := checkSortPaths(s.name, s.keys, doc); err != nil {
		return err
	}
	s.bytes += len(doc) + 24
	if s.bytes > s.max {
		return exceeded(s.name, s.max)
	}
	s.docs = append(s.docs, slices.Clone(doc))
	return nil
}

func (s *sortStage) sortValue(doc bsoncore.Document, k sortKey) value.Value {
	v := expr.LookupPath(value.Value{Type: bsoncore.TypeEmbeddedDocument, Data: doc}, k.path)
	if v.Type == 0 {
		return value.Null
	}
	if v.Type == bsoncore.TypeArray {
		vals, _ := v.Array().Values()
		if len(vals) == 0 {
			return value.Value{Type: bsoncore.TypeUndefined}
		}
		best := vals[0]
		for _, el := range vals[1:] {
			if c := value.Compare(el, best); (c < 0 && !k.desc) || (c > 0 && k.desc) {
				best = el
			}
		}
		return best
	}
	return v
}

// checkSortPaths refuses a document in which a sort key's path goes
// through an array before its last field ({a: [{b: 1}, {c: 2}]} sorted by
// "a.b"): MongoDB sorts it by every value the path reaches, arrays
// inside flattened and an element without the field as null, which
// sortValue does not. An array at the path's end sorts by its least or
// greatest element, as in MongoDB.
func checkSortPaths(stage string, keys []sortKey, doc bsoncore.Document) error {
	for _, k := range keys {
		if throughArray(doc, k.path) {
			return value.Unsupported("a %s by %q, which goes through an array in a document,", stage, strings.Join(k.path, "."))
		}
	}
	return nil
}

// throughArray says whether path meets an array in doc before its last
// field.
func throughArray(doc bsoncore.Document, path []string) bool {
	v := value.Value{Type: bsoncore.TypeEmbeddedDocument, Data: doc}
	for i, part := range path {
		next, err := bsoncore.Document(v.Data).LookupErr(part)
		if err != nil {
			return false
		}
		switch {
		case next.Type == bsoncore.TypeArray:
			return i < len(path)-1
		case next.Type != bsoncore.TypeEmbeddedDocument:
			return false
		}
		v = next
	}
	return false
}

// compareDocs orders two documents by the stage's keys.
func (s *sortStage) compareDocs(a, b bsoncore.Document) int {
	for _, k := range s.keys {
		c := value.Compare(s.sortValue(a, k), s.sortValue(b, k))
		if k.desc {
			c = -c
		}
		if c != 0 {
			return c
		}
	}
	return 0
}

func (s *sortStage) flush() error {
	slices.SortStableFunc(s.docs, s.compareDocs)
	for _, d := range s.docs {
		if err := s.next.push(d); err != nil {
			return err
		}
	}
	s.docs = nil
	return s.next.flush()
}

// $unwind: one document per element of an array field; a non-array
// value is its own element; null, missing and [] give nothing unless
// preserveNullAndEmptyArrays.
type unwindStage struct {
	path     []string
	field    string
	index    string
	preserve bool
	next     processor
}

func compileUnwind(v value.Value, next processor, _ Options) (processor, error) {
	u := &unwindStage{next: next}
	path := ""
	switch v.Type {
	case bsoncore.TypeString:
		path = v.StringValue()
	case bsoncore.TypeEmbeddedDocument:
		elems, _ := v.Document().Elements()
		for _, e := range elems {
			switch e.Key() {
			case "path":
				s, ok := e.Value().StringValueOK()
				if !ok {
					return nil, value.BadValue(28808, "expected a string as the path for $unwind stage, got %s", expr.TypeAlias(e.Value()))
				}
				path = s
			case "includeArrayIndex":
				s, ok := e.Value().StringValueOK()
				if !ok || s == "" || s[0] == '$' {
					return nil, value.BadValue(28810, "expected a non-empty string for the includeArrayIndex option to $unwind stage")
				}
				u.index = s
			case "preserveNullAndEmptyArrays":
				b, ok := e.Value().BooleanOK()
				if !ok {
					return nil, value.BadValue(28809, "expected a boolean for the preserveNullAndEmptyArrays option to $unwind stage")
				}
				u.preserve = b
			default:
				return nil, value.BadValue(28811, "unrecognized option to $unwind stage: %s", e.Key())
			}
		}
	default:
		return nil, value.BadValue(15981, "expected either a string or an object as specification for $unwind stage, got %s", expr.TypeAlias(v))
	}
	if len(path) < 2 || path[0] != '$' {
		return nil, value.BadValue(28818, "path option to $unwind stage should be prefixed with a '$': %s", path)
	}
	u.path = splitPath(path[1:])
	if len(u.path) != 1 {
		return nil, value.Unsupported("$unwind of a dotted path (%s)", path)
	}
	u.field = u.path[0]
	return u, nil
}

func (u *unwindStage) push(doc bsoncore.Document) error {
	v, err := doc.LookupErr(u.field)
	if err != nil {
		v = value.Missing
	}
	switch {
	case v.Type == bsoncore.TypeArray:
		vals, _ := v.Array().Values()
		if len(vals) == 0 {
			if u.preserve {
				return u.emit(doc, value.Missing, value.Null, true)
			}
			return nil
		}
		for i, el := range vals {
			if err := u.emit(doc, el, value.Int64Value(int64(i)), false); err != nil {
				return err
			}
		}
		return nil
	case value.IsNullish(v):
		if u.preserve {
			return u.emit(doc, v, value.Null, v.Type == 0)
		}
		return nil
	}
	return u.emit(doc, v, value.Null, false)
}

// emit is doc with the field set to el (removed when drop), and the
// index field when asked for.
func (u *unwindStage) emit(doc bsoncore.Document, el, index value.Value, drop bool) error {
	idx, out := bsoncore.AppendDocumentStart(nil)
	elems, _ := doc.Elements()
	for _, e := range elems {
		if e.Key() == u.field {
			if !drop {
				out = bsoncore.AppendValueElement(out, u.field, el)
			}
			continue
		}
		if e.Key() == u.index {
			continue
		}
		out = bsoncore.AppendValueElement(out, e.Key(), e.Value())
	}
	if u.index != "" {
		out = bsoncore.AppendValueElement(out, u.index, index)
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return u.next.push(out)
}

func (u *unwindStage) flush() error { return u.next.flush() }

// groupIDObject is a $group _id given as an object: its fields' missing
// values are null, so a missing and a null field are one group.
type groupIDObject struct{ expr.ObjectExpr }

func (o groupIDObject) Eval(doc bsoncore.Document) (value.Value, error) {
	idx, out := bsoncore.AppendDocumentStart(nil)
	for i, e := range o.Exprs {
		v, err := e.Eval(doc)
		if err != nil {
			return value.Missing, err
		}
		if v.Type == 0 {
			v = value.Null
		}
		out = bsoncore.AppendValueElement(out, o.Keys[i], v)
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return value.Value{Type: bsoncore.TypeEmbeddedDocument, Data: out}, nil
}
