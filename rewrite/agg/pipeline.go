package agg

import (
	"slices"
	"strings"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/expr"
	"github.com/tsproxy/tsproxy/rewrite/expr/value"
	"github.com/tsproxy/tsproxy/rewrite/match"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// DefaultMaxMemory is how much a $group or $sort may hold, as MongoDB's
// 100 MB per blocking stage.
const DefaultMaxMemory = 100 << 20

// Options are what a pipeline run takes besides its stages.
type Options struct {
	// MaxMemory bounds each blocking stage ($group, $sort, $bucket,
	// $sortByCount) and the result (0: DefaultMaxMemory).
	MaxMemory int
	// Foreign holds what the $lookup stages read; nil: $lookup is
	// refused.
	Foreign *Foreign
}

// Stage is one stage as the client sent it.
type Stage struct {
	Name  string
	Value value.Value
}

// Pipeline is a compiled pipeline: Push every input document, then
// Finish for the output.
type Pipeline struct {
	head  processor
	sink  *collector
	names []string
}

// processor is a stage at run time: push gives it a document; flush
// says the input ended (blocking stages emit then).
type processor interface {
	push(doc bsoncore.Document) error
	flush() error
}

// Supported says whether the engine runs a stage named name, without
// compiling it: a caller uses it to choose the engine.
func Supported(name string) bool {
	_, ok := stageCompilers[name]
	return ok
}

type stageCompiler func(v value.Value, next processor, opts Options) (processor, error)

var stageCompilers map[string]stageCompiler

func init() {
	stageCompilers = map[string]stageCompiler{
		"$match":           compileMatch,
		"$project":         compileProject,
		"$addFields":       compileAddFields,
		"$set":             compileAddFields,
		"$unset":           compileUnset,
		"$group":           compileGroup,
		"$sort":            compileSort,
		"$skip":            compileSkip,
		"$limit":           compileLimit,
		"$count":           compileCount,
		"$sortByCount":     compileSortByCount,
		"$unwind":          compileUnwind,
		"$bucket":          compileBucket,
		"$setWindowFields": compileWindowFields,
		"$densify":         compileDensify,
		"$fill":            compileFill,
		"$facet":           compileFacet,
		"$lookup":          compileLookup,
		"$bucketAuto":      compileBucketAuto,
		"$replaceRoot":     compileReplaceRoot,
		"$replaceWith":     compileReplaceWith,
	}
}

// Compile compiles stages; a stage, operator or option the engine does
// not run is an error naming it.
func Compile(stages []Stage, opts Options) (*Pipeline, error) {
	if opts.MaxMemory <= 0 {
		opts.MaxMemory = DefaultMaxMemory
	}
	// The output is held until the client has read it: within the budget.
	p := &Pipeline{sink: &collector{max: opts.MaxMemory}}
	var next processor = p.sink
	for i := len(stages) - 1; i >= 0; i-- {
		st := stages[i]
		c, ok := stageCompilers[st.Name]
		if !ok {
			return nil, value.Unsupported("the aggregation stage %q", st.Name)
		}
		proc, err := c(st.Value, next, opts)
		if err != nil {
			return nil, err
		}
		next = proc
		p.names = append(p.names, st.Name)
	}
	p.head = next
	return p, nil
}

// Push gives the pipeline one input document; the pipeline does not
// keep doc's buffer (it copies what it holds).
func (p *Pipeline) Push(doc bsoncore.Document) error { return p.head.push(doc) }

// Finish ends the input and returns the output documents.
func (p *Pipeline) Finish() ([]bsoncore.Document, error) {
	if err := p.head.flush(); err != nil {
		return nil, err
	}
	return p.sink.docs, nil
}

// Done says whether no more input can change the output (a $limit was
// reached with nothing blocking before it): the caller may stop reading.
func (p *Pipeline) Done() bool {
	if l, ok := p.head.(*limitStage); ok {
		return l.n <= 0
	}
	return false
}

type collector struct {
	docs  []bsoncore.Document
	bytes int
	max   int
}

func (c *collector) push(doc bsoncore.Document) error {
	c.bytes += len(doc)
	if c.bytes > c.max {
		return exceeded("the result", c.max)
	}
	c.docs = append(c.docs, slices.Clone(doc))
	return nil
}

func (c *collector) flush() error { return nil }

func exceeded(stage string, limit int) error {
	return mongoerr.Errorf(mongoerr.QueryExceededMemoryLimit,
		"tsproxy aggregation: %s exceeded the memory limit of %d bytes; the proxy does not spill to disk (allowDiskUse has no effect): filter the input further or group less finely", stage, limit)
}

// $match: the query subset of rewrite/query (comparisons, $in, $nin,
// $exists, $not, $and, $or, $nor), refused by name beyond it.
type matchStage struct {
	pred  match.DocPred
	exprs []expr.Expr // $expr: each must be truthy
	next  processor
}

func compileMatch(v value.Value, next processor, _ Options) (processor, error) {
	d, ok := v.DocumentOK()
	if !ok {
		return nil, value.BadValue(15959, "the match filter must be an expression in an object")
	}
	rest, exprs, err := expr.SplitExpr(d)
	if err != nil {
		return nil, err
	}
	fc := match.Compiler{Unsupported: func(format string, args ...any) error {
		return value.Unsupported("in $match, "+format, args...)
	}}
	pred, err := fc.Compile(rest, 0)
	if err != nil {
		return nil, err
	}
	return &matchStage{pred: pred, exprs: exprs, next: next}, nil
}

func (m *matchStage) push(doc bsoncore.Document) error {
	if !m.pred(doc) {
		return nil
	}
	ok, err := expr.ExprsTrue(m.exprs, doc)
	if err != nil || !ok {
		return err
	}
	return m.next.push(doc)
}

func (m *matchStage) flush() error { return m.next.flush() }

type skipStage struct {
	n    int64
	next processor
}

func wholeNumber(stage string, v value.Value, positive bool) (int64, error) {
	i, ok := bsonutil.WholeNumber(v)
	if !ok {
		return 0, value.BadValue(15957, "the %s must be specified as a number", stage)
	}
	if i < 0 || (positive && i == 0) {
		return 0, value.BadValue(15958, "the %s must be positive", stage)
	}
	return i, nil
}

func compileSkip(v value.Value, next processor, _ Options) (processor, error) {
	n, err := wholeNumber("$skip", v, false)
	if err != nil {
		return nil, err
	}
	return &skipStage{n: n, next: next}, nil
}

func (s *skipStage) push(doc bsoncore.Document) error {
	if s.n > 0 {
		s.n--
		return nil
	}
	return s.next.push(doc)
}

func (s *skipStage) flush() error { return s.next.flush() }

type limitStage struct {
	n    int64
	next processor
}

func compileLimit(v value.Value, next processor, _ Options) (processor, error) {
	n, err := wholeNumber("$limit", v, true)
	if err != nil {
		return nil, err
	}
	return &limitStage{n: n, next: next}, nil
}

func (l *limitStage) push(doc bsoncore.Document) error {
	if l.n <= 0 {
		return nil
	}
	l.n--
	return l.next.push(doc)
}

func (l *limitStage) flush() error { return l.next.flush() }

// $count: one document {<name>: n}, none when n is 0.
type countStage struct {
	name string
	n    int64
	next processor
}

func compileCount(v value.Value, next processor, _ Options) (processor, error) {
	name, ok := v.StringValueOK()
	switch {
	case !ok:
		return nil, value.BadValue(40156, "the count field must be a non-empty string")
	case name == "":
		return nil, value.BadValue(40157, "the count field must be a non-empty string")
	case strings.HasPrefix(name, "$"):
		return nil, value.BadValue(40158, "the count field cannot be a $-prefixed path")
	case strings.Contains(name, "."):
		return nil, value.BadValue(40160, "the count field cannot contain '.'")
	}
	return &countStage{name: name, next: next}, nil
}

func (c *countStage) push(bsoncore.Document) error { c.n++; return nil }

func (c *countStage) flush() error {
	if c.n > 0 {
		d := bsoncore.NewDocumentBuilder().AppendValue(c.name, value.IntValue(c.n)).Build()
		if err := c.next.push(d); err != nil {
			return err
		}
	}
	return c.next.flush()
}
