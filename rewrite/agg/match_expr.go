package agg

import (
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// $expr in $match: the top-level $expr keys are taken out of the filter
// and evaluated by the engine's expressions (a document matches when each
// is truthy); the rest is the ordinary query predicate.

// splitExpr returns d without its top-level $expr keys, and those
// compiled.
func splitExpr(d bsoncore.Document) (bsoncore.Document, []expr, error) {
	elems, err := d.Elements()
	if err != nil {
		return nil, nil, badValue(15959, "the match filter is not valid BSON: %v", err)
	}
	var exprs []expr
	idx, rest := bsoncore.AppendDocumentStart(nil)
	for _, e := range elems {
		if e.Key() != "$expr" {
			rest = append(rest, e...)
			continue
		}
		x, err := compileTop(e.Value(), 0)
		if err != nil {
			return nil, nil, err
		}
		exprs = append(exprs, x)
	}
	rest, _ = bsoncore.AppendDocumentEnd(rest, idx)
	return rest, exprs, nil
}

// exprsTrue says whether every one of exprs is truthy on doc.
func exprsTrue(exprs []expr, doc bsoncore.Document) (bool, error) {
	for _, x := range exprs {
		v, err := x.eval(doc)
		if err != nil {
			return false, err
		}
		if !truthy(v) {
			return false, nil
		}
	}
	return true, nil
}
