package expr

import (
	"strings"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/expr/value"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// Expr is a compiled expression, evaluated against one document.
type Expr interface {
	Eval(doc bsoncore.Document) (value.Value, error)
}

type Literal struct{ V value.Value }

func (l Literal) Eval(bsoncore.Document) (value.Value, error) { return l.V, nil }

// fieldPath is "$a.b.c": the value at that path, through arrays as
// MongoDB goes through them (an array of documents gives the array of
// their values).
type fieldPath struct{ parts []string }

func (p fieldPath) Eval(doc bsoncore.Document) (value.Value, error) {
	return LookupPath(value.Value{Type: bsoncore.TypeEmbeddedDocument, Data: doc}, p.parts), nil
}

func LookupPath(v value.Value, parts []string) value.Value {
	for i, part := range parts {
		switch v.Type {
		case bsoncore.TypeEmbeddedDocument:
			next, err := bsoncore.Document(v.Data).LookupErr(part)
			if err != nil {
				return value.Missing
			}
			v = next
		case bsoncore.TypeArray:
			vals, _ := bsoncore.Array(v.Data).Values()
			idx, arr := bsoncore.AppendArrayStart(nil)
			n := 0
			for _, el := range vals {
				if el.Type != bsoncore.TypeEmbeddedDocument && el.Type != bsoncore.TypeArray {
					continue
				}
				got := LookupPath(el, parts[i:])
				if got.Type == 0 {
					continue
				}
				arr = bsoncore.AppendValueElement(arr, bsonutil.Itoa(n), got)
				n++
			}
			arr, _ = bsoncore.AppendArrayEnd(arr, idx)
			return value.Value{Type: bsoncore.TypeArray, Data: arr}
		default:
			return value.Missing
		}
	}
	return v
}

// root is $$ROOT (and $$CURRENT): the whole document.
type root struct{ parts []string }

func (r root) Eval(doc bsoncore.Document) (value.Value, error) {
	return LookupPath(value.Value{Type: bsoncore.TypeEmbeddedDocument, Data: doc}, r.parts), nil
}

// ObjectExpr is {a: <expr>, b: <expr>}: a document of the values, fields
// whose value is missing left out.
type ObjectExpr struct {
	Keys  []string
	Exprs []Expr
}

func (o ObjectExpr) Eval(doc bsoncore.Document) (value.Value, error) {
	idx, out := bsoncore.AppendDocumentStart(nil)
	for i, e := range o.Exprs {
		v, err := e.Eval(doc)
		if err != nil {
			return value.Missing, err
		}
		if v.Type != 0 {
			out = bsoncore.AppendValueElement(out, o.Keys[i], v)
		}
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return value.Value{Type: bsoncore.TypeEmbeddedDocument, Data: out}, nil
}

// arrayExpr is [<expr>, ...]; a missing element becomes null.
type arrayExpr struct{ exprs []Expr }

func (a arrayExpr) Eval(doc bsoncore.Document) (value.Value, error) {
	idx, out := bsoncore.AppendArrayStart(nil)
	for i, e := range a.exprs {
		v, err := e.Eval(doc)
		if err != nil {
			return value.Missing, err
		}
		if v.Type == 0 {
			v = value.Null
		}
		out = bsoncore.AppendValueElement(out, bsonutil.Itoa(i), v)
	}
	out, _ = bsoncore.AppendArrayEnd(out, idx)
	return value.Value{Type: bsoncore.TypeArray, Data: out}, nil
}

// maxExprDepth bounds how deeply expressions nest.
const maxExprDepth = 64

// compileExpr compiles an aggregation expression.
func compileExpr(v value.Value, depth level) (Expr, error) {
	if depth.n > maxExprDepth {
		return nil, value.Unsupported("an expression nested deeper than %d levels", maxExprDepth)
	}
	switch v.Type {
	case bsoncore.TypeString:
		s := v.StringValue()
		switch {
		case strings.HasPrefix(s, "$$"):
			return compileVariable(s, depth)
		case strings.HasPrefix(s, "$"):
			if len(s) == 1 {
				return nil, value.BadValue(16872, "'$' by itself is not a valid FieldPath")
			}
			return fieldPath{parts: strings.Split(s[1:], ".")}, nil
		}
		return Literal{V: value.Clone(v)}, nil
	case bsoncore.TypeEmbeddedDocument:
		elems, err := bsoncore.Document(v.Data).Elements()
		if err != nil {
			return nil, value.BadValue(mongoerr.BadValue, "expression is not valid BSON: %v", err)
		}
		if len(elems) == 1 && strings.HasPrefix(elems[0].Key(), "$") {
			return compileOperator(elems[0].Key(), elems[0].Value(), depth)
		}
		o := ObjectExpr{}
		for _, e := range elems {
			if strings.HasPrefix(e.Key(), "$") {
				return nil, value.BadValue(mongoerr.Code(16410), "FieldPath field names may not start with '$'. Consider using $getField or $setField.")
			}
			if strings.Contains(e.Key(), ".") {
				return nil, value.BadValue(mongoerr.Code(16412), "FieldPath field names may not contain '.'. Consider using $getField or $setField.")
			}
			c, err := compileExpr(e.Value(), depth.next())
			if err != nil {
				return nil, err
			}
			o.Keys, o.Exprs = append(o.Keys, e.Key()), append(o.Exprs, c)
		}
		return o, nil
	case bsoncore.TypeArray:
		vals, err := bsoncore.Array(v.Data).Values()
		if err != nil {
			return nil, value.BadValue(mongoerr.BadValue, "expression is not valid BSON: %v", err)
		}
		a := arrayExpr{}
		for _, el := range vals {
			c, err := compileExpr(el, depth.next())
			if err != nil {
				return nil, err
			}
			a.exprs = append(a.exprs, c)
		}
		return a, nil
	}
	return Literal{V: value.Clone(v)}, nil
}

func compileVariable(s string, depth level) (Expr, error) {
	name, rest, _ := strings.Cut(s[2:], ".")
	var parts []string
	if rest != "" {
		parts = strings.Split(rest, ".")
	}
	switch name {
	case "ROOT", "CURRENT":
		return root{parts: parts}, nil
	case "REMOVE":
		return Literal{V: value.Missing}, nil
	}
	if slot := depth.lookup(name); slot != nil {
		return varRef{slot: slot, parts: parts}, nil
	}
	if strings.ToUpper(name) == name {
		// $$NOW, $$CLUSTER_TIME and the other system variables.
		return nil, value.Unsupported("the variable %q", "$$"+name)
	}
	return nil, value.BadValue(17276, "Use of undefined variable: %s", name)
}

// operatorArgs reads an operator's arguments: an array, or one value
// taken as an array of one.
func operatorArgs(name string, v value.Value, depth level) ([]Expr, error) {
	if v.Type != bsoncore.TypeArray {
		e, err := compileExpr(v, depth.next())
		if err != nil {
			return nil, err
		}
		return []Expr{e}, nil
	}
	vals, err := bsoncore.Array(v.Data).Values()
	if err != nil {
		return nil, value.BadValue(mongoerr.BadValue, "%s: arguments are not valid BSON: %v", name, err)
	}
	out := make([]Expr, 0, len(vals))
	for _, el := range vals {
		e, err := compileExpr(el, depth.next())
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}

func wantArgs(name string, args []Expr, n int) error {
	if len(args) != n {
		return value.BadValue(16020, "Expression %s takes exactly %d arguments. %d were passed in.", name, n, len(args))
	}
	return nil
}

// evalAll evaluates each of args.
func evalAll(args []Expr, doc bsoncore.Document) ([]value.Value, error) {
	out := make([]value.Value, len(args))
	for i, a := range args {
		v, err := a.Eval(doc)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

// opFunc is an operator over its evaluated arguments.
type opFunc struct {
	name string
	args []Expr
	f    func(vals []value.Value) (value.Value, error)
}

func (o opFunc) Eval(doc bsoncore.Document) (value.Value, error) {
	vals, err := evalAll(o.args, doc)
	if err != nil {
		return value.Missing, err
	}
	return o.f(vals)
}

// compileOperator compiles {$op: args}.
func compileOperator(name string, v value.Value, depth level) (Expr, error) {
	if e, ok, err := compileBinding(name, v, depth); ok {
		return e, err
	}
	if c, ok := rawOperators[name]; ok {
		return c(name, v, depth)
	}
	switch name {
	case "$literal", "$const":
		return Literal{V: value.Clone(v)}, nil
	case "$cond":
		return compileCond(v, depth)
	case "$ifNull":
		args, err := operatorArgs(name, v, depth)
		if err != nil {
			return nil, err
		}
		if len(args) < 2 {
			return nil, value.BadValue(mongoerr.Code(1257300), "$ifNull needs at least two arguments, had: %d", len(args))
		}
		return ifNull{args: args}, nil
	case "$and", "$or":
		args, err := operatorArgs(name, v, depth)
		if err != nil {
			return nil, err
		}
		return logic{and: name == "$and", args: args}, nil
	case "$switch":
		return compileSwitch(v, depth)
	}
	if f, ok := dateOperators[name]; ok {
		return compileDatePart(name, v, depth, f)
	}
	switch name {
	case "$dateTrunc":
		return compileDateTrunc(v, depth)
	case "$dateToString":
		return compileDateToString(v, depth)
	}
	mk, ok := operators[name]
	if !ok {
		return nil, value.Unsupported("the expression operator %q", name)
	}
	args, err := operatorArgs(name, v, depth)
	if err != nil {
		return nil, err
	}
	return mk(name, args)
}

// operators build the operators that take their arguments evaluated.
var operators map[string]func(name string, args []Expr) (Expr, error)

func init() {
	operators = map[string]func(string, []Expr) (Expr, error){}
	for _, n := range []string{"$add", "$subtract", "$multiply", "$divide", "$mod"} {
		operators[n] = arithmetic
	}
	for _, n := range []string{"$abs", "$floor", "$ceil", "$sqrt", "$ln", "$log10", "$exp", "$trunc", "$round"} {
		operators[n] = mathUnary
	}
	for _, n := range []string{"$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$cmp"} {
		operators[n] = comparison
	}
	operators["$not"] = func(name string, args []Expr) (Expr, error) {
		if err := wantArgs(name, args, 1); err != nil {
			return nil, err
		}
		return opFunc{name: name, args: args, f: func(v []value.Value) (value.Value, error) { return value.BoolValue(!value.Truthy(v[0])), nil }}, nil
	}
	for _, n := range []string{"$toDouble", "$toInt", "$toLong", "$toString", "$toBool", "$toDate"} {
		operators[n] = conversion
	}
	operators["$concat"] = concat
	operators["$type"] = func(name string, args []Expr) (Expr, error) {
		if err := wantArgs(name, args, 1); err != nil {
			return nil, err
		}
		return opFunc{name: name, args: args, f: func(v []value.Value) (value.Value, error) { return value.StringValue(TypeAlias(v[0])), nil }}, nil
	}
}

// TypeAlias is $type's name of v's type ("missing" for a missing value).
func TypeAlias(v value.Value) string {
	if v.Type == 0 {
		return "missing"
	}
	return bsonutil.TypeName(v.Type)
}
