package join

import (
	"math"
	"slices"
	"strings"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/expr"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// graphLookupStage is $graphLookup: a breadth-first search of from,
// starting at startWith's values, following connectFromField to
// connectToField, up to maxDepth. A batch of input documents searches
// together: each depth is one foreign read of the values none of them
// looked up yet.
type graphLookupStage struct {
	rt          *runtime
	from        string
	startWith   expr.Expression
	fromPath    []string
	toField     string
	toPath      []string
	as          []string
	depthField  []string
	maxDepth    int64 // -1: none
	restrict    bsoncore.Document
	restrictSrc bsoncore.Value

	batch []bsoncore.Document
	next  step
}

func graphError(code int, format string, args ...any) error {
	return mongoerr.Errorf(mongoerr.Code(code), format, args...)
}

func compileGraphLookup(v bsoncore.Value, next step, rt *runtime) (step, error) {
	d, ok := v.DocumentOK()
	if !ok {
		return nil, failedToParse("the $graphLookup stage specification must be an object")
	}
	g := &graphLookupStage{rt: rt, next: next, maxDepth: -1}
	var haveStart bool
	var from, as, connFrom, connTo string
	elems, _ := d.Elements()
	for _, e := range elems {
		ev := e.Value()
		switch e.Key() {
		case "from", "as", "connectFromField", "connectToField", "depthField":
			s, ok := ev.StringValueOK()
			if !ok {
				return nil, graphError(40103, "expected string as argument for %s, found: %s", e.Key(), ev.Type)
			}
			if strings.HasPrefix(s, "$") && e.Key() != "from" {
				return nil, graphError(16410, "FieldPath field names may not start with '$': %s", s)
			}
			switch e.Key() {
			case "from":
				from = s
			case "as":
				as = s
			case "connectFromField":
				connFrom = s
			case "connectToField":
				connTo = s
			case "depthField":
				g.depthField = splitPath(s)
			}
		case "startWith":
			x, err := expr.CompileExpression(ev)
			if err != nil {
				return nil, err
			}
			g.startWith, haveStart = x, true
		case "maxDepth":
			n, isNum := numberOf(ev)
			if !isNum {
				return nil, graphError(40100, "maxDepth must be numeric, found type: %s", ev.Type)
			}
			if n < 0 {
				return nil, graphError(40101, "maxDepth requires a nonnegative argument, found: %v", n)
			}
			if n != math.Trunc(n) || n > math.MaxInt64 {
				return nil, graphError(40102, "maxDepth could not be represented as a long long: %v", n)
			}
			g.maxDepth = int64(n)
		case "restrictSearchWithMatch":
			q, ok := ev.DocumentOK()
			if !ok {
				return nil, graphError(40185, "restrictSearchWithMatch must be an object, found %s", ev.Type)
			}
			if mentionsExpr(q) {
				return nil, unsupported("$expr in $graphLookup's restrictSearchWithMatch")
			}
			g.restrict, g.restrictSrc = q, ev
		default:
			return nil, graphError(40104, "Unknown argument to $graphLookup: %s", e.Key())
		}
	}
	if from == "" || as == "" || connFrom == "" || connTo == "" || !haveStart {
		return nil, graphError(40105, "from, as, connectFromField, connectToField, and startWith must all be specified")
	}
	g.from, g.as, g.fromPath, g.toField, g.toPath = from, splitPath(as), splitPath(connFrom), connTo, splitPath(connTo)
	return g, nil
}

func (g *graphLookupStage) push(doc bsoncore.Document) error {
	g.batch = append(g.batch, slices.Clone(doc))
	if len(g.batch) >= batchDocs {
		return g.runBatch()
	}
	return nil
}

func (g *graphLookupStage) flush() error {
	if err := g.runBatch(); err != nil {
		return err
	}
	return g.next.flush()
}

// search is one input document's walk.
type search struct {
	visited  map[int]bool
	seen     map[string]bool // values queued already
	frontier []bsoncore.Value
	found    []int
	depths   []int64
}

func (s *search) queue(v bsoncore.Value) {
	k := expr.Key(v)
	if !s.seen[k] {
		s.seen[k] = true
		s.frontier = append(s.frontier, v)
	}
}

// graphStore is the foreign documents a batch's searches found, by _id,
// and which of them each looked-up value finds.
type graphStore struct {
	docs    []bsoncore.Document
	byID    map[string]int
	byTo    map[string][]int
	queried map[string]bool
	bytes   int
}

func (g *graphLookupStage) runBatch() error {
	batch := g.batch
	g.batch = nil
	if len(batch) == 0 {
		return nil
	}
	st := &graphStore{byID: map[string]int{}, byTo: map[string][]int{}, queried: map[string]bool{}}
	searches := make([]*search, len(batch))
	for i, d := range batch {
		s := &search{visited: map[int]bool{}, seen: map[string]bool{}}
		start, err := g.startWith.Eval(d)
		if err != nil {
			return err
		}
		if start.Type == bsoncore.TypeArray {
			vals, _ := start.Array().Values()
			for _, el := range vals {
				s.queue(el)
			}
		} else if start.Type != 0 {
			s.queue(start)
		}
		searches[i] = s
	}
	for depth := int64(0); g.maxDepth < 0 || depth <= g.maxDepth; depth++ {
		if err := g.fetch(st, searches); err != nil {
			return err
		}
		more := false
		for _, s := range searches {
			frontier := s.frontier
			s.frontier = nil
			for _, v := range frontier {
				for _, idx := range st.byTo[expr.Key(v)] {
					if s.visited[idx] {
						continue
					}
					s.visited[idx] = true
					s.found, s.depths = append(s.found, idx), append(s.depths, depth)
					for _, next := range connectValues(st.docs[idx], g.fromPath) {
						s.queue(next)
					}
				}
			}
			more = more || len(s.frontier) > 0
		}
		if !more {
			break
		}
	}
	for i, d := range batch {
		s := searches[i]
		out := make([]bsoncore.Document, len(s.found))
		for j, idx := range s.found {
			out[j] = st.docs[idx]
			if g.depthField != nil {
				out[j] = setPath(out[j], g.depthField, bsoncore.Value{Type: bsoncore.TypeInt64, Data: bsoncore.AppendInt64(nil, s.depths[j])})
			}
		}
		if err := g.next.push(setPath(d, g.as, docsArray(out))); err != nil {
			return err
		}
	}
	return nil
}

// fetch reads the foreign documents whose connectToField holds a value
// of a frontier that was not looked up yet, in one read.
func (g *graphLookupStage) fetch(st *graphStore, searches []*search) error {
	var need keySet
	for _, s := range searches {
		for _, v := range s.frontier {
			if !st.queried[expr.Key(v)] {
				need.add(v)
			}
		}
	}
	if len(need.values) == 0 {
		return nil
	}
	for k := range need.has {
		st.queried[k] = true
	}
	return g.rt.read(g.from, inFilter(g.toField, need.values, g.restrict), func(fd bsoncore.Document) error {
		idKey := expr.Key(fd.Lookup("_id"))
		idx, ok := st.byID[idKey]
		if !ok {
			st.bytes += len(fd)
			if st.bytes > g.rt.env.MaxMemory {
				return exceeded("$graphLookup of "+g.rt.env.DB+"."+g.from, g.rt.env.MaxMemory)
			}
			idx = len(st.docs)
			st.docs = append(st.docs, slices.Clone(fd))
			st.byID[idKey] = idx
		}
		for _, k := range foreignKeys(fd, g.toPath) {
			if need.has[k] && !slices.Contains(st.byTo[k], idx) {
				st.byTo[k] = append(st.byTo[k], idx)
			}
		}
		return nil
	})
}

// connectValues are the values a found document continues the search
// with: its connectFromField, an array's elements.
func connectValues(doc bsoncore.Document, path []string) []bsoncore.Value {
	v := docValue(doc)
	for _, p := range path {
		d, ok := v.DocumentOK()
		if !ok {
			return nil
		}
		next, err := d.LookupErr(p)
		if err != nil {
			return nil
		}
		v = next
	}
	if v.Type == bsoncore.TypeArray {
		vals, _ := v.Array().Values()
		return vals
	}
	return []bsoncore.Value{v}
}

// numberOf is v as a float64, for the numeric types.
func numberOf(v bsoncore.Value) (float64, bool) {
	switch v.Type {
	case bsoncore.TypeInt32:
		return float64(v.Int32()), true
	case bsoncore.TypeInt64:
		return float64(v.Int64()), true
	case bsoncore.TypeDouble:
		return v.Double(), true
	}
	return 0, false
}
