package agg

import (
	"strconv"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
)

// The type operators besides $type and the $toX shorthands:
// $isNumber and $convert {input, to, onError, onNull}.

func init() {
	operators["$isNumber"] = unary(func(_ string, v Value) (Value, error) {
		_, _, _, ok := number(v)
		return boolValue(ok), nil
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
	input, to, onError, onNull expr
}

func compileConvert(name string, v Value, depth level) (expr, error) {
	d, ok := v.DocumentOK()
	if !ok {
		return nil, badValue(10065, "%s expects an object of named arguments but found: %s", name, typeAlias(v))
	}
	var c convertExpr
	if err := namedArgs(name, d, depth, 9, map[string]*expr{"input": &c.input, "to": &c.to, "onError": &c.onError, "onNull": &c.onNull}); err != nil {
		return nil, err
	}
	switch {
	case c.input == nil:
		return nil, badValue(9, "Missing 'input' parameter to %s", name)
	case c.to == nil:
		return nil, badValue(9, "Missing 'to' parameter to %s", name)
	}
	return c, nil
}

func (c convertExpr) eval(doc bsoncore.Document) (Value, error) {
	in, err := c.input.eval(doc)
	if err != nil {
		return missing, err
	}
	to, err := c.to.eval(doc)
	if err != nil {
		return missing, err
	}
	if isNullish(in) || isNullish(to) {
		if c.onNull != nil && isNullish(in) {
			return c.onNull.eval(doc)
		}
		return null, nil
	}
	target, err := convertTarget(to)
	if err != nil {
		return missing, err
	}
	out, err := convert(target, in)
	if err != nil && c.onError != nil {
		return c.onError.eval(doc)
	}
	return out, err
}

func convertTarget(to Value) (string, error) {
	key, ok := to.StringValueOK()
	if !ok {
		n, whole := bsonutil.WholeNumber(to)
		if !whole {
			return "", badValue(50890, "$convert's 'to' argument must be a string or number, but is %s", typeAlias(to))
		}
		key = strconv.FormatInt(n, 10)
	}
	t, ok := convertTargets[key]
	if !ok {
		return "", unsupported("$convert to %q", key)
	}
	return t, nil
}
