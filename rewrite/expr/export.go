package expr

import (
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/expr/value"
)

// What a pipeline evaluator outside rewrite/agg (rewrite/join, which runs
// $lookup, $graphLookup and $unionWith over namespaces it reads) takes
// from it: expressions ($lookup's let, $graphLookup's startWith), the
// engine's value identity and its field paths.

// Expression is a compiled aggregation expression.
type Expression struct{ e Expr }

// CompileExpression compiles an aggregation expression; an operator the
// engine does not run is an error naming it.
func CompileExpression(v value.Value) (Expression, error) {
	e, err := CompileTop(v, 0)
	if err != nil {
		return Expression{}, err
	}
	return Expression{e: e}, nil
}

// Eval evaluates the expression against doc (a zero Value: missing).
func (x Expression) Eval(doc bsoncore.Document) (value.Value, error) {
	if x.e == nil {
		return value.Missing, nil
	}
	return x.e.Eval(doc)
}

// Key is v's identity as $group tells values apart: numbers by value (1,
// 1.0 and NumberLong(1) are one key), null and missing one key, every
// other value by type and bytes.
func Key(v value.Value) string { return string(value.GroupKey(nil, v)) }

// FieldPath is the value at path parts of v as an expression's "$a.b"
// reads it (through arrays of documents, an array of their values).
func FieldPath(v value.Value, parts []string) value.Value { return LookupPath(v, parts) }
