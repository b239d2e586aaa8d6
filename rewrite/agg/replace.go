package agg

import (
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// $replaceRoot {newRoot: <expr>} and $replaceWith <expr>: each document
// becomes the expression's value, which must be a document.
type replaceStage struct {
	newRoot expr
	next    processor
}

func compileReplaceRoot(v Value, next processor, _ Options) (processor, error) {
	d, ok := v.DocumentOK()
	if !ok {
		return nil, badValue(40228, "$replaceRoot: the argument must be an object, found: %s", typeAlias(v))
	}
	nr, err := d.LookupErr("newRoot")
	if err != nil {
		return nil, badValue(40231, "no newRoot specified for the $replaceRoot stage")
	}
	elems, _ := d.Elements()
	for _, e := range elems {
		if e.Key() != "newRoot" {
			return nil, badValue(40415, "BSON field '$replaceRoot.%s' is an unknown field.", e.Key())
		}
	}
	return newReplaceStage(nr, next)
}

func compileReplaceWith(v Value, next processor, _ Options) (processor, error) {
	return newReplaceStage(v, next)
}

func newReplaceStage(v Value, next processor) (processor, error) {
	e, err := compileTop(v, 0)
	if err != nil {
		return nil, err
	}
	return &replaceStage{newRoot: e, next: next}, nil
}

func (r *replaceStage) push(doc bsoncore.Document) error {
	v, err := r.newRoot.eval(doc)
	if err != nil {
		return err
	}
	d, ok := v.DocumentOK()
	if !ok {
		return mongoerr.Errorf(40228, "'newRoot' expression must evaluate to an object, but resulting value was: %s. Type of resulting value: '%s'. Input document: %s",
			describe(v), typeAlias(v), doc.String())
	}
	return r.next.push(d)
}

func (r *replaceStage) flush() error { return r.next.flush() }

// describe is v as a message shows it: MISSING, or its extended JSON.
func describe(v Value) string {
	if v.Type == 0 {
		return "MISSING"
	}
	return v.String()
}
