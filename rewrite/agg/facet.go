package agg

import (
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/expr"
	"github.com/tsproxy/tsproxy/rewrite/expr/value"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// $facet: every input document through each sub-pipeline; one output
// document {<name>: [its output]...}, at most 16 MiB as on MongoDB.
type facetStage struct {
	names []string
	pipes []*Pipeline
	next  processor
}

// maxDocumentBytes is MongoDB's largest document.
const maxDocumentBytes = 16 << 20

func compileFacet(v value.Value, next processor, opts Options) (processor, error) {
	d, ok := v.DocumentOK()
	if !ok {
		return nil, value.BadValue(15947, "$facet requires an object as its argument")
	}
	f := &facetStage{next: next}
	elems, _ := d.Elements()
	for _, e := range elems {
		arr, ok := e.Value().ArrayOK()
		if !ok {
			return nil, value.BadValue(40170, "arguments to $facet must be arrays, %s is type %s", e.Key(), expr.TypeAlias(e.Value()))
		}
		vals, _ := arr.Values()
		var stages []Stage
		for _, sv := range vals {
			sd, ok := sv.DocumentOK()
			first, err := sd.IndexErr(0)
			if !ok || err != nil {
				return nil, value.BadValue(40171, "specification must be an object of one stage in $facet's %s", e.Key())
			}
			switch first.Key() {
			case "$facet", "$out", "$merge":
				return nil, value.BadValue(40600, "%s is not allowed to be used within a $facet stage", first.Key())
			}
			stages = append(stages, Stage{Name: first.Key(), Value: first.Value()})
		}
		p, err := Compile(stages, opts)
		if err != nil {
			return nil, err
		}
		f.names, f.pipes = append(f.names, e.Key()), append(f.pipes, p)
	}
	if len(f.names) == 0 {
		return nil, value.BadValue(40169, "the $facet specification must be a non-empty object")
	}
	return f, nil
}

func (f *facetStage) push(doc bsoncore.Document) error {
	for _, p := range f.pipes {
		if err := p.Push(doc); err != nil {
			return err
		}
	}
	return nil
}

func (f *facetStage) flush() error {
	idx, out := bsoncore.AppendDocumentStart(nil)
	for i, p := range f.pipes {
		docs, err := p.Finish()
		if err != nil {
			return err
		}
		aidx, arr := bsoncore.AppendArrayElementStart(out, f.names[i])
		for j, d := range docs {
			arr = bsoncore.AppendDocumentElement(arr, bsonutil.Itoa(j), d)
		}
		out, _ = bsoncore.AppendArrayEnd(arr, aidx)
		if len(out) > maxDocumentBytes {
			return mongoerr.Errorf(mongoerr.BSONObjectTooLarge, "document constructed by $facet is %d bytes, which exceeds the limit of %d bytes", len(out), maxDocumentBytes)
		}
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	if err := f.next.push(out); err != nil {
		return err
	}
	return f.next.flush()
}
