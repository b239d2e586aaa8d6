package join

import (
	"slices"
	"strings"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/agg"
	"github.com/tsproxy/tsproxy/rewrite/expr"
)

// batchDocs is how many input documents share one foreign read.
const batchDocs = 256

// lookupStage is $lookup: each input document with an array "as" of the
// foreign documents that join it (by localField/foreignField), run
// through its pipeline (with its let variables bound to the document's
// values) when it has one.
type lookupStage struct {
	rt           *runtime
	from         string
	as           []string
	local        []string
	foreignField string // dotted, as the foreign read's filter names it
	foreign      []string
	eq           bool
	letNames     []string
	letExprs     []expr.Expression
	pipeline     []agg.Stage
	hasPipeline  bool
	pre          bsoncore.Document // the pipeline's leading binding-free $match

	batch []bsoncore.Document
	// Without localField: the foreign documents are read once, and the
	// pipeline's output kept per binding.
	all     []bsoncore.Document
	allRead bool
	byBind  map[string][]bsoncore.Document
	kept    int // bytes in byBind
	next    step
}

func compileLookup(v bsoncore.Value, next step, rt *runtime) (step, error) {
	d, ok := v.DocumentOK()
	if !ok {
		return nil, failedToParse("the $lookup stage specification must be an object")
	}
	l := &lookupStage{rt: rt, next: next}
	var localField, asField string
	hasForeign := false
	elems, _ := d.Elements()
	for _, e := range elems {
		switch e.Key() {
		case "from":
			s, ok := e.Value().StringValueOK()
			if !ok {
				if _, isDoc := e.Value().DocumentOK(); isDoc {
					return nil, unsupported("$lookup 'from' naming another database")
				}
				return nil, failedToParse("$lookup 'from' field must be a string, not %s", e.Value().Type)
			}
			l.from = s
		case "as", "localField", "foreignField":
			s, ok := e.Value().StringValueOK()
			if !ok {
				return nil, failedToParse("$lookup argument '%s: %s' must be a string, is type %s", e.Key(), e.Value(), e.Value().Type)
			}
			switch e.Key() {
			case "as":
				asField = s
			case "localField":
				localField = s
				l.eq = true
			case "foreignField":
				l.foreignField, hasForeign = s, true
			}
		case "let":
			ld, ok := e.Value().DocumentOK()
			if !ok {
				return nil, failedToParse("$lookup argument 'let' must be an object, is type %s", e.Value().Type)
			}
			lets, _ := ld.Elements()
			for _, le := range lets {
				if err := checkVarName(le.Key()); err != nil {
					return nil, err
				}
				x, err := expr.CompileExpression(le.Value())
				if err != nil {
					return nil, err
				}
				l.letNames, l.letExprs = append(l.letNames, le.Key()), append(l.letExprs, x)
			}
		case "pipeline":
			stages, err := stagesOf("$lookup", e.Value())
			if err != nil {
				return nil, err
			}
			l.pipeline, l.hasPipeline = stages, true
		default:
			return nil, failedToParse("unknown argument to $lookup: %s", e.Key())
		}
	}
	switch {
	case asField == "":
		return nil, failedToParse("must specify 'as' field for a $lookup")
	case l.eq != hasForeign:
		return nil, failedToParse("$lookup requires both or neither of 'localField' and 'foreignField' to be specified")
	case !l.eq && !l.hasPipeline:
		return nil, failedToParse("$lookup requires either 'pipeline' or both 'localField' and 'foreignField' to be specified")
	case l.from == "":
		return nil, unsupported("$lookup without 'from' (a $documents pipeline)")
	case len(l.letNames) > 0 && !l.hasPipeline:
		return nil, failedToParse("$lookup with 'let' must also specify 'pipeline'")
	}
	if strings.HasPrefix(asField, "$") {
		return nil, failedToParse("FieldPath field names may not start with '$': %s", asField)
	}
	l.as = splitPath(asField)
	if l.eq {
		l.local, l.foreign = splitPath(localField), splitPath(l.foreignField)
	}
	if l.hasPipeline {
		// Compiled once here for its errors (with null for each
		// variable); each binding compiles its own.
		vars := map[string]bsoncore.Value{}
		for _, n := range l.letNames {
			vars[n] = nullValue
		}
		bound, err := bindStages(l.pipeline, vars)
		if err != nil {
			return nil, err
		}
		if _, err := compile(bound, rt); err != nil {
			return nil, err
		}
		l.pre = prefilter(l.pipeline)
	}
	return l, nil
}

func (l *lookupStage) push(doc bsoncore.Document) error {
	l.batch = append(l.batch, slices.Clone(doc))
	if len(l.batch) >= batchDocs {
		return l.runBatch()
	}
	return nil
}

func (l *lookupStage) flush() error {
	if err := l.runBatch(); err != nil {
		return err
	}
	return l.next.flush()
}

func (l *lookupStage) runBatch() error {
	batch := l.batch
	l.batch = nil
	if len(batch) == 0 {
		return nil
	}
	if !l.eq {
		return l.runUncorrelatedRead(batch)
	}
	var keys keySet
	docKeys := make([][]string, len(batch))
	for i, d := range batch {
		for _, v := range localValues(d, l.local) {
			docKeys[i] = append(docKeys[i], keys.add(v))
		}
	}
	foreign, err := l.rt.readAll("$lookup", l.from, inFilter(l.foreignField, keys.values, l.pre))
	if err != nil {
		return err
	}
	index := map[string][]int{}
	for i, fd := range foreign {
		for _, k := range foreignKeys(fd, l.foreign) {
			if keys.has[k] {
				if n := len(index[k]); n == 0 || index[k][n-1] != i {
					index[k] = append(index[k], i)
				}
			}
		}
	}
	for i, d := range batch {
		var matched []int
		for _, k := range docKeys[i] {
			matched = append(matched, index[k]...)
		}
		slices.Sort(matched)
		matched = slices.Compact(matched)
		joined := make([]bsoncore.Document, len(matched))
		for j, m := range matched {
			joined[j] = foreign[m]
		}
		if l.hasPipeline {
			vars, _, err := l.bind(d)
			if err != nil {
				return err
			}
			if joined, err = l.runPipeline(vars, joined); err != nil {
				return err
			}
		}
		if err := l.next.push(setPath(d, l.as, docsArray(joined))); err != nil {
			return err
		}
	}
	return nil
}

// runUncorrelatedRead serves the pipeline form without localField: the
// foreign documents (those its leading $match selects) are read once for
// the whole input, and each distinct binding's output is kept.
func (l *lookupStage) runUncorrelatedRead(batch []bsoncore.Document) error {
	if !l.allRead {
		docs, err := l.rt.readAll("$lookup", l.from, l.pre)
		if err != nil {
			return err
		}
		l.all, l.allRead = docs, true
		l.byBind = map[string][]bsoncore.Document{}
	}
	for _, d := range batch {
		vars, key, err := l.bind(d)
		if err != nil {
			return err
		}
		out, ok := l.byBind[key]
		if !ok {
			if out, err = l.runPipeline(vars, l.all); err != nil {
				return err
			}
			for _, o := range out {
				l.kept += len(o)
			}
			if l.kept > l.rt.env.MaxMemory {
				return exceeded("$lookup's results of "+l.rt.env.DB+"."+l.from, l.rt.env.MaxMemory)
			}
			l.byBind[key] = out
		}
		if err := l.next.push(setPath(d, l.as, docsArray(out))); err != nil {
			return err
		}
	}
	return nil
}

// bind evaluates the let variables on doc; key tells bindings apart by
// their exact values (types included: a literal's type shows).
func (l *lookupStage) bind(doc bsoncore.Document) (map[string]bsoncore.Value, string, error) {
	if len(l.letNames) == 0 {
		return nil, "", nil
	}
	vars := make(map[string]bsoncore.Value, len(l.letNames))
	var key []byte
	for i, name := range l.letNames {
		v, err := l.letExprs[i].Eval(doc)
		if err != nil {
			return nil, "", err
		}
		v = bsoncore.Value{Type: v.Type, Data: slices.Clone(v.Data)}
		vars[name] = v
		key = append(key, byte(v.Type))
		key = bsoncore.AppendInt32(key, int32(len(v.Data)))
		key = append(key, v.Data...)
	}
	return vars, string(key), nil
}

func (l *lookupStage) runPipeline(vars map[string]bsoncore.Value, docs []bsoncore.Document) ([]bsoncore.Document, error) {
	stages, err := bindStages(l.pipeline, vars)
	if err != nil {
		return nil, err
	}
	return run(stages, l.rt, docs)
}
