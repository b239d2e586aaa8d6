package expr

import (
	"strconv"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/expr/value"
)

// The type operators besides $type and the $toX shorthands:
// $isNumber and $convert {input, to, onError, onNull}.

func init() {
	operators["$isNumber"] = unary(func(_ string, v value.Value) (value.Value, error) {
		_, _, _, ok := value.Number(v)
		return value.BoolValue(ok), nil
	})
	rawOperators["$convert"] = compileConvert
}

// convertTargets maps $convert's 'to' (a type name or number) to the
// shorthand that converts to it.
var convertTargets = map[string]string{
	"double": "$toDouble", "1": "$toDouble",
	"string": "$toString", "2": "$toString",
	"bool": "$toBool", "8": "$toBool",
	"date": "$toDate", "9": "$toDate",
	"int": "$toInt", "16": "$toInt",
	"long": "$toLong", "18": "$toLong",
}

type convertExpr struct {
	input, to, onError, onNull Expr
}

func compileConvert(name string, v value.Value, depth level) (Expr, error) {
	d, ok := v.DocumentOK()
	if !ok {
		return nil, value.BadValue(10065, "%s expects an object of named arguments but found: %s", name, TypeAlias(v))
	}
	var c convertExpr
	if err := namedArgs(name, d, depth, 9, map[string]*Expr{"input": &c.input, "to": &c.to, "onError": &c.onError, "onNull": &c.onNull}); err != nil {
		return nil, err
	}
	switch {
	case c.input == nil:
		return nil, value.BadValue(9, "Missing 'input' parameter to %s", name)
	case c.to == nil:
		return nil, value.BadValue(9, "Missing 'to' parameter to %s", name)
	}
	return c, nil
}

func (c convertExpr) Eval(doc bsoncore.Document) (value.Value, error) {
	in, err := c.input.Eval(doc)
	if err != nil {
		return value.Missing, err
	}
	to, err := c.to.Eval(doc)
	if err != nil {
		return value.Missing, err
	}
	if value.IsNullish(in) || value.IsNullish(to) {
		if c.onNull != nil && value.IsNullish(in) {
			return c.onNull.Eval(doc)
		}
		return value.Null, nil
	}
	target, err := convertTarget(to)
	if err != nil {
		return value.Missing, err
	}
	out, err := convert(target, in)
	if err != nil && c.onError != nil {
		return c.onError.Eval(doc)
	}
	return out, err
}

func convertTarget(to value.Value) (string, error) {
	key, ok := to.StringValueOK()
	if !ok {
		n, whole := bsonutil.WholeNumber(to)
		if !whole {
			return "", value.BadValue(50890, "$convert's 'to' argument must be a string or number, but is %s", TypeAlias(to))
		}
		key = strconv.FormatInt(n, 10)
	}
	t, ok := convertTargets[key]
	if !ok {
		return "", value.Unsupported("$convert to %q", key)
	}
	return t, nil
}
