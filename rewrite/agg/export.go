package agg

import "go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

// What a pipeline evaluator outside the engine (rewrite/join, which runs
// $lookup, $graphLookup and $unionWith over namespaces it reads) takes
// from it: expressions ($lookup's let, $graphLookup's startWith), the
// engine's value identity and its field paths.

// Expression is a compiled aggregation expression.
type Expression struct{ e expr }

// CompileExpression compiles an aggregation expression; an operator the
// engine does not run is an error naming it.
func CompileExpression(v Value) (Expression, error) {
	e, err := compileTop(v, 0)
	if err != nil {
		return Expression{}, err
	}
	return Expression{e: e}, nil
}

// Eval evaluates the expression against doc (a zero Value: missing).
func (x Expression) Eval(doc bsoncore.Document) (Value, error) {
	if x.e == nil {
		return missing, nil
	}
	return x.e.eval(doc)
}

// Key is v's identity as $group tells values apart: numbers by value (1,
// 1.0 and NumberLong(1) are one key), null and missing one key, every
// other value by type and bytes.
func Key(v Value) string { return string(groupKey(nil, v)) }

// FieldPath is the value at path parts of v as an expression's "$a.b"
// reads it (through arrays of documents, an array of their values).
func FieldPath(v Value, parts []string) Value { return lookupPath(v, parts) }
