package agg

import (
	"strings"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// expr is a compiled expression, evaluated against one document.
type expr interface {
	eval(doc bsoncore.Document) (Value, error)
}

// unsupported is the error for what the engine does not implement.
func unsupported(format string, args ...any) error {
	return mongoerr.Errorf(mongoerr.NotImplemented, format+" is not supported by the proxy's aggregation engine", args...)
}

func badValue(code mongoerr.Code, format string, args ...any) error {
	return mongoerr.Errorf(code, format, args...)
}

type literal struct{ v Value }

func (l literal) eval(bsoncore.Document) (Value, error) { return l.v, nil }

// fieldPath is "$a.b.c": the value at that path, through arrays as
// MongoDB goes through them (an array of documents gives the array of
// their values).
type fieldPath struct{ parts []string }

func (p fieldPath) eval(doc bsoncore.Document) (Value, error) {
	return lookupPath(Value{Type: bsoncore.TypeEmbeddedDocument, Data: doc}, p.parts), nil
}

func lookupPath(v Value, parts []string) Value {
	for i, part := range parts {
		switch v.Type {
		case bsoncore.TypeEmbeddedDocument:
			next, err := bsoncore.Document(v.Data).LookupErr(part)
			if err != nil {
				return missing
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
				got := lookupPath(el, parts[i:])
				if got.Type == 0 {
					continue
				}
				arr = bsoncore.AppendValueElement(arr, bsonutil.Itoa(n), got)
				n++
			}
			arr, _ = bsoncore.AppendArrayEnd(arr, idx)
			return Value{Type: bsoncore.TypeArray, Data: arr}
		default:
			return missing
		}
	}
	return v
}

// root is $$ROOT (and $$CURRENT): the whole document.
type root struct{ parts []string }

func (r root) eval(doc bsoncore.Document) (Value, error) {
	return lookupPath(Value{Type: bsoncore.TypeEmbeddedDocument, Data: doc}, r.parts), nil
}

// objectExpr is {a: <expr>, b: <expr>}: a document of the values, fields
// whose value is missing left out.
type objectExpr struct {
	keys  []string
	exprs []expr
}

func (o objectExpr) eval(doc bsoncore.Document) (Value, error) {
	idx, out := bsoncore.AppendDocumentStart(nil)
	for i, e := range o.exprs {
		v, err := e.eval(doc)
		if err != nil {
			return missing, err
		}
		if v.Type != 0 {
			out = bsoncore.AppendValueElement(out, o.keys[i], v)
		}
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return Value{Type: bsoncore.TypeEmbeddedDocument, Data: out}, nil
}

// arrayExpr is [<expr>, ...]; a missing element becomes null.
type arrayExpr struct{ exprs []expr }

func (a arrayExpr) eval(doc bsoncore.Document) (Value, error) {
	idx, out := bsoncore.AppendArrayStart(nil)
	for i, e := range a.exprs {
		v, err := e.eval(doc)
		if err != nil {
			return missing, err
		}
		if v.Type == 0 {
			v = null
		}
		out = bsoncore.AppendValueElement(out, bsonutil.Itoa(i), v)
	}
	out, _ = bsoncore.AppendArrayEnd(out, idx)
	return Value{Type: bsoncore.TypeArray, Data: out}, nil
}

// maxExprDepth bounds how deeply expressions nest.
const maxExprDepth = 64

// compileExpr compiles an aggregation expression.
func compileExpr(v Value, depth level) (expr, error) {
	if depth.n > maxExprDepth {
		return nil, unsupported("an expression nested deeper than %d levels", maxExprDepth)
	}
	switch v.Type {
	case bsoncore.TypeString:
		s := v.StringValue()
		switch {
		case strings.HasPrefix(s, "$$"):
			return compileVariable(s, depth)
		case strings.HasPrefix(s, "$"):
			if len(s) == 1 {
				return nil, badValue(16872, "'$' by itself is not a valid FieldPath")
			}
			return fieldPath{parts: strings.Split(s[1:], ".")}, nil
		}
		return literal{v: clone(v)}, nil
	case bsoncore.TypeEmbeddedDocument:
		elems, err := bsoncore.Document(v.Data).Elements()
		if err != nil {
			return nil, badValue(mongoerr.BadValue, "expression is not valid BSON: %v", err)
		}
		if len(elems) == 1 && strings.HasPrefix(elems[0].Key(), "$") {
			return compileOperator(elems[0].Key(), elems[0].Value(), depth)
		}
		o := objectExpr{}
		for _, e := range elems {
			if strings.HasPrefix(e.Key(), "$") {
				return nil, badValue(mongoerr.Code(16410), "FieldPath field names may not start with '$'. Consider using $getField or $setField.")
			}
			if strings.Contains(e.Key(), ".") {
				return nil, badValue(mongoerr.Code(16412), "FieldPath field names may not contain '.'. Consider using $getField or $setField.")
			}
			c, err := compileExpr(e.Value(), depth.next())
			if err != nil {
				return nil, err
			}
			o.keys, o.exprs = append(o.keys, e.Key()), append(o.exprs, c)
		}
		return o, nil
	case bsoncore.TypeArray:
		vals, err := bsoncore.Array(v.Data).Values()
		if err != nil {
			return nil, badValue(mongoerr.BadValue, "expression is not valid BSON: %v", err)
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
	return literal{v: clone(v)}, nil
}

func compileVariable(s string, depth level) (expr, error) {
	name, rest, _ := strings.Cut(s[2:], ".")
	var parts []string
	if rest != "" {
		parts = strings.Split(rest, ".")
	}
	switch name {
	case "ROOT", "CURRENT":
		return root{parts: parts}, nil
	case "REMOVE":
		return literal{v: missing}, nil
	}
	if slot := depth.lookup(name); slot != nil {
		return varRef{slot: slot, parts: parts}, nil
	}
	if strings.ToUpper(name) == name {
		// $$NOW, $$CLUSTER_TIME and the other system variables.
		return nil, unsupported("the variable %q", "$$"+name)
	}
	return nil, badValue(17276, "Use of undefined variable: %s", name)
}

// operatorArgs reads an operator's arguments: an array, or one value
// taken as an array of one.
func operatorArgs(name string, v Value, depth level) ([]expr, error) {
	if v.Type != bsoncore.TypeArray {
		e, err := compileExpr(v, depth.next())
		if err != nil {
			return nil, err
		}
		return []expr{e}, nil
	}
	vals, err := bsoncore.Array(v.Data).Values()
	if err != nil {
		return nil, badValue(mongoerr.BadValue, "%s: arguments are not valid BSON: %v", name, err)
	}
	out := make([]expr, 0, len(vals))
	for _, el := range vals {
		e, err := compileExpr(el, depth.next())
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}

func wantArgs(name string, args []expr, n int) error {
	if len(args) != n {
		return badValue(16020, "Expression %s takes exactly %d arguments. %d were passed in.", name, n, len(args))
	}
	return nil
}

// evalAll evaluates each of args.
func evalAll(args []expr, doc bsoncore.Document) ([]Value, error) {
	out := make([]Value, len(args))
	for i, a := range args {
		v, err := a.eval(doc)
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
	args []expr
	f    func(vals []Value) (Value, error)
}

func (o opFunc) eval(doc bsoncore.Document) (Value, error) {
	vals, err := evalAll(o.args, doc)
	if err != nil {
		return missing, err
	}
	return o.f(vals)
}

// compileOperator compiles {$op: args}.
func compileOperator(name string, v Value, depth level) (expr, error) {
	if e, ok, err := compileBinding(name, v, depth); ok {
		return e, err
	}
	if c, ok := rawOperators[name]; ok {
		return c(name, v, depth)
	}
	switch name {
	case "$literal", "$const":
		return literal{v: clone(v)}, nil
	case "$cond":
		return compileCond(v, depth)
	case "$ifNull":
		args, err := operatorArgs(name, v, depth)
		if err != nil {
			return nil, err
		}
		if len(args) < 2 {
			return nil, badValue(mongoerr.Code(1257300), "$ifNull needs at least two arguments, had: %d", len(args))
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
		return nil, unsupported("the expression operator %q", name)
	}
	args, err := operatorArgs(name, v, depth)
	if err != nil {
		return nil, err
	}
	return mk(name, args)
}

// operators build the operators that take their arguments evaluated.
var operators map[string]func(name string, args []expr) (expr, error)

func init() {
	operators = map[string]func(string, []expr) (expr, error){}
	for _, n := range []string{"$add", "$subtract", "$multiply", "$divide", "$mod"} {
		operators[n] = arithmetic
	}
	for _, n := range []string{"$abs", "$floor", "$ceil", "$sqrt", "$ln", "$log10", "$exp", "$trunc", "$round"} {
		operators[n] = mathUnary
	}
	for _, n := range []string{"$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$cmp"} {
		operators[n] = comparison
	}
	operators["$not"] = func(name string, args []expr) (expr, error) {
		if err := wantArgs(name, args, 1); err != nil {
			return nil, err
		}
		return opFunc{name: name, args: args, f: func(v []Value) (Value, error) { return boolValue(!truthy(v[0])), nil }}, nil
	}
	for _, n := range []string{"$toDouble", "$toInt", "$toLong", "$toString", "$toBool", "$toDate"} {
		operators[n] = conversion
	}
	operators["$concat"] = concat
	operators["$type"] = func(name string, args []expr) (expr, error) {
		if err := wantArgs(name, args, 1); err != nil {
			return nil, err
		}
		return opFunc{name: name, args: args, f: func(v []Value) (Value, error) { return stringValue(typeAlias(v[0])), nil }}, nil
	}
}

// typeAlias is $type's name of v's type ("missing" for a missing value).
func typeAlias(v Value) string {
	if v.Type == 0 {
		return "missing"
	}
	return bsonutil.TypeName(v.Type)
}
