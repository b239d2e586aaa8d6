package agg

import (
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/expr"
	"github.com/tsproxy/tsproxy/rewrite/expr/value"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// $replaceRoot {newRoot: <expr>} and $replaceWith <expr>: each document
// becomes the expression's value, which must be a document.
type replaceStage struct {
	newRoot expr.Expr
	next    processor
}

func compileReplaceRoot(v value.Value, next processor, _ Options) (processor, error) {
	d, ok := v.DocumentOK()
	if !ok {
		return nil, value.BadValue(40228, "$replaceRoot: the argument must be an object, found: %s", expr.TypeAlias(v))
	}
	nr, err := d.LookupErr("newRoot")
	if err != nil {
		return nil, value.BadValue(40231, "no newRoot specified for the $replaceRoot stage")
	}
	elems, _ := d.Elements()
	for _, e := range elems {
		if e.Key() != "newRoot" {
			return nil, value.BadValue(40415, "BSON field '$replaceRoot.%s' is an unknown field.", e.Key())
		}
	}
	return newReplaceStage(nr, next)
}

func compileReplaceWith(v value.Value, next processor, _ Options) (processor, error) {
	return newReplaceStage(v, next)
}

func newReplaceStage(v value.Value, next processor) (processor, error) {
	e, err := expr.CompileTop(v, 0)
	if err != nil {
		return nil, err
	}
	return &replaceStage{newRoot: e, next: next}, nil
}

func (r *replaceStage) push(doc bsoncore.Document) error {
	v, err := r.newRoot.Eval(doc)
	if err != nil {
		return err
	}
	d, ok := v.DocumentOK()
	if !ok {
		return mongoerr.Errorf(40228, "'newRoot' expression must evaluate to an object, but resulting value was: %s. Type of resulting value: '%s'. Input document: %s",
			value.Describe(v), expr.TypeAlias(v), doc.String())
	}
	return r.next.push(d)
}

func (r *replaceStage) flush() error { return r.next.flush() }
