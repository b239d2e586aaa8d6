package join

import (
	"slices"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/agg"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// Reader reads the documents of a namespace the join stages name.
type Reader interface {
	// Read hands every document of db.coll that filter (nil: all)
	// matches to take, in batches, reading through x; it may hand more
	// documents than filter matches (the caller matches them again),
	// never fewer. take's error ends the read and is Read's.
	Read(x *rewrite.Exec, db, coll string, filter bsoncore.Document, take func([]bsoncore.Document) error) error
}

// Env is what a pipeline's join stages read with.
type Env struct {
	// DB is the database of the pipeline (its "from" names are in it).
	DB     string
	Reader Reader
	// MaxMemory bounds each blocking stage, the documents a join holds
	// and the output (0: agg.DefaultMaxMemory).
	MaxMemory int
}

// IsJoin says whether a stage name is one this package runs.
func IsJoin(name string) bool {
	switch name {
	case "$lookup", "$graphLookup", "$unionWith":
		return true
	}
	return false
}

// HasJoin says whether stages hold a join stage at their top level.
func HasJoin(stages []agg.Stage) bool {
	return slices.ContainsFunc(stages, func(s agg.Stage) bool { return IsJoin(s.Name) })
}

// Pipeline is a compiled pipeline: Bind it to the script it reads in,
// Push every input document, then Finish for the output.
type Pipeline struct {
	rt   *runtime
	head step
	sink *sink
}

// runtime is what the steps of a pipeline (and of the pipelines its
// joins compile) share.
type runtime struct {
	env Env
	x   *rewrite.Exec
}

func (rt *runtime) read(coll string, filter bsoncore.Document, take func(bsoncore.Document) error) error {
	return rt.env.Reader.Read(rt.x, rt.env.DB, coll, filter, func(docs []bsoncore.Document) error {
		for _, d := range docs {
			if err := take(d); err != nil {
				return err
			}
		}
		return nil
	})
}

// readAll reads the documents of coll filter selects, copied, within the
// memory budget.
func (rt *runtime) readAll(stage, coll string, filter bsoncore.Document) ([]bsoncore.Document, error) {
	var docs []bsoncore.Document
	total := 0
	err := rt.read(coll, filter, func(d bsoncore.Document) error {
		total += len(d)
		if total > rt.env.MaxMemory {
			return exceeded(stage+" of "+rt.env.DB+"."+coll, rt.env.MaxMemory)
		}
		docs = append(docs, slices.Clone(d))
		return nil
	})
	return docs, err
}

// step is a stage at run time: push gives it a document (which it does
// not keep without copying); flush says the input ended.
type step interface {
	push(doc bsoncore.Document) error
	flush() error
}

// Compile compiles stages; a stage, operator or option that neither this
// package nor the engine runs is an error naming it.
func Compile(stages []agg.Stage, env Env) (*Pipeline, error) {
	if env.MaxMemory <= 0 {
		env.MaxMemory = agg.DefaultMaxMemory
	}
	return compile(stages, &runtime{env: env})
}

func compile(stages []agg.Stage, rt *runtime) (*Pipeline, error) {
	p := &Pipeline{rt: rt, sink: &sink{max: rt.env.MaxMemory}}
	var next step = p.sink
	end := len(stages)
	for i := len(stages) - 1; i >= -1; i-- {
		if i >= 0 && !IsJoin(stages[i].Name) {
			continue
		}
		// stages[i+1:end] run in the engine, before next.
		if i+1 < end {
			seg, err := compileSegment(stages[i+1:end], next, rt)
			if err != nil {
				return nil, err
			}
			next = seg
		}
		end = i
		if i < 0 {
			break
		}
		var err error
		switch stages[i].Name {
		case "$lookup":
			next, err = compileLookup(stages[i].Value, next, rt)
		case "$graphLookup":
			next, err = compileGraphLookup(stages[i].Value, next, rt)
		case "$unionWith":
			next, err = compileUnionWith(stages[i].Value, next, rt)
		}
		if err != nil {
			return nil, err
		}
	}
	p.head = next
	return p, nil
}

// Bind makes the pipeline read through x (the script running it).
func (p *Pipeline) Bind(x *rewrite.Exec) { p.rt.x = x }

// Push gives the pipeline one input document.
func (p *Pipeline) Push(doc bsoncore.Document) error { return p.head.push(doc) }

// Finish ends the input and returns the output documents.
func (p *Pipeline) Finish() ([]bsoncore.Document, error) {
	if err := p.head.flush(); err != nil {
		return nil, err
	}
	return p.sink.docs, nil
}

// run runs stages over docs (a join's sub-pipeline), in rt.
func run(stages []agg.Stage, rt *runtime, docs []bsoncore.Document) ([]bsoncore.Document, error) {
	p, err := compile(stages, rt)
	if err != nil {
		return nil, err
	}
	for _, d := range docs {
		if err := p.Push(d); err != nil {
			return nil, err
		}
	}
	return p.Finish()
}

type sink struct {
	docs  []bsoncore.Document
	bytes int
	max   int
}

func (s *sink) push(doc bsoncore.Document) error {
	s.bytes += len(doc)
	if s.bytes > s.max {
		return exceeded("the result", s.max)
	}
	s.docs = append(s.docs, slices.Clone(doc))
	return nil
}

func (s *sink) flush() error { return nil }

// segment is stages the engine runs, between joins (or at either end).
// A $lookup inside its $facet reads its collection whole, before the
// first document.
type segment struct {
	p       *agg.Pipeline
	foreign *agg.Foreign
	froms   []string
	loaded  bool
	rt      *runtime
	next    step
}

func compileSegment(stages []agg.Stage, next step, rt *runtime) (step, error) {
	s := &segment{rt: rt, next: next, froms: agg.ForeignCollections(stages)}
	if len(s.froms) > 0 {
		s.foreign = &agg.Foreign{Docs: map[string][]bsoncore.Document{}}
	}
	p, err := agg.Compile(stages, agg.Options{MaxMemory: rt.env.MaxMemory, Foreign: s.foreign})
	if err != nil {
		return nil, err
	}
	s.p = p
	return s, nil
}

func (s *segment) load() error {
	if s.loaded {
		return nil
	}
	s.loaded = true
	for _, from := range s.froms {
		docs, err := s.rt.readAll("$lookup", from, nil)
		if err != nil {
			return err
		}
		s.foreign.Docs[from] = docs
	}
	return nil
}

func (s *segment) push(doc bsoncore.Document) error {
	if err := s.load(); err != nil {
		return err
	}
	return s.p.Push(doc)
}

func (s *segment) flush() error {
	if err := s.load(); err != nil {
		return err
	}
	docs, err := s.p.Finish()
	if err != nil {
		return err
	}
	for _, d := range docs {
		if err := s.next.push(d); err != nil {
			return err
		}
	}
	return s.next.flush()
}

func exceeded(what string, limit int) error {
	return mongoerr.Errorf(mongoerr.QueryExceededMemoryLimit,
		"tsproxy aggregation: %s exceeded the memory limit of %d bytes; the proxy does not spill to disk (allowDiskUse has no effect)", what, limit)
}

func failedToParse(format string, args ...any) error {
	return mongoerr.Errorf(mongoerr.FailedToParse, format, args...)
}

func unsupported(format string, args ...any) error {
	return mongoerr.Errorf(mongoerr.NotImplemented, format+" is not supported by the proxy's aggregation engine", args...)
}

// stagesOf reads a pipeline array: each stage a document of one field.
func stagesOf(owner string, v bsoncore.Value) ([]agg.Stage, error) {
	arr, ok := v.ArrayOK()
	if !ok {
		return nil, failedToParse("%s 'pipeline' must be an array", owner)
	}
	vals, err := arr.Values()
	if err != nil {
		return nil, failedToParse("%s 'pipeline' is not valid BSON: %v", owner, err)
	}
	out := make([]agg.Stage, 0, len(vals))
	for i, sv := range vals {
		d, ok := sv.DocumentOK()
		if !ok {
			return nil, mongoerr.Errorf(mongoerr.TypeMismatch, "%s pipeline stage %d must be a document", owner, i)
		}
		elems, err := d.Elements()
		if err != nil || len(elems) != 1 {
			return nil, mongoerr.Errorf(mongoerr.Code(40323), "a pipeline stage specification object must contain exactly one field (%s pipeline stage %d)", owner, i)
		}
		out = append(out, agg.Stage{Name: elems[0].Key(), Value: elems[0].Value()})
	}
	return out, nil
}

// prefilter is the conjunction of a pipeline's leading $match stages
// that need no variable (no $expr anywhere in them): the same for every
// binding, so it can be sent with the foreign read. The stages stay in
// the pipeline (they are matched again, at no harm).
func prefilter(stages []agg.Stage) bsoncore.Document {
	var fs []bsoncore.Document
	for _, st := range stages {
		d, ok := st.Value.DocumentOK()
		if st.Name != "$match" || !ok || mentionsExpr(d) {
			break
		}
		fs = append(fs, d)
	}
	return andFilters(fs...)
}

// mentionsExpr says whether a query holds $expr (or $where, $function
// or other server-side code) at any depth: such a filter is the engine's.
func mentionsExpr(d bsoncore.Document) bool {
	elems, _ := d.Elements()
	for _, e := range elems {
		switch e.Key() {
		case "$expr", "$where", "$function", "$jsonSchema":
			return true
		}
		v := e.Value()
		if sub, ok := v.DocumentOK(); ok && mentionsExpr(sub) {
			return true
		}
		if arr, ok := v.ArrayOK(); ok {
			vals, _ := arr.Values()
			for _, el := range vals {
				if sub, ok := el.DocumentOK(); ok && mentionsExpr(sub) {
					return true
				}
			}
		}
	}
	return false
}
