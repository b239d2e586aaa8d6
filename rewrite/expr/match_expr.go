package expr

import (
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/expr/value"
)

// $expr in $match: the top-level $expr keys are taken out of the filter
// and evaluated by the engine's expressions (a document matches when each
// is truthy); the rest is the ordinary query predicate.

// SplitExpr returns d without its top-level $expr keys, and those
// compiled.
func SplitExpr(d bsoncore.Document) (bsoncore.Document, []Expr, error) {
	elems, err := d.Elements()
	if err != nil {
		return nil, nil, value.BadValue(15959, "the match filter is not valid BSON: %v", err)
	}
	var exprs []Expr
	idx, rest := bsoncore.AppendDocumentStart(nil)
	for _, e := range elems {
		if e.Key() != "$expr" {
			rest = append(rest, e...)
			continue
		}
		x, err := CompileTop(e.Value(), 0)
		if err != nil {
			return nil, nil, err
		}
		exprs = append(exprs, x)
	}
	rest, _ = bsoncore.AppendDocumentEnd(rest, idx)
	return rest, exprs, nil
}

// ExprsTrue says whether every one of exprs is truthy on doc.
func ExprsTrue(exprs []Expr, doc bsoncore.Document) (bool, error) {
	for _, x := range exprs {
		v, err := x.Eval(doc)
		if err != nil {
			return false, err
		}
		if !value.Truthy(v) {
			return false, nil
		}
	}
	return true, nil
}
