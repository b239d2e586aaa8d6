package expr

import (
	"strings"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/expr/value"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// The object operators: $getField, $setField, $unsetField,
// $mergeObjects, $objectToArray and $arrayToObject. $getField and
// $setField take a field name as it is, dots and dollars included.

func init() {
	rawOperators["$getField"] = compileGetField
	rawOperators["$setField"] = compileSetField
	rawOperators["$unsetField"] = compileSetField
	operators["$mergeObjects"] = mergeObjects
	operators["$objectToArray"] = unary(objectToArray)
	operators["$arrayToObject"] = unary(arrayToObject)
}

// fieldArgs are $getField's, $setField's and $unsetField's arguments.
type fieldArgs struct {
	name  string
	field string
	input Expr // nil: $$CURRENT
	value Expr // $setField only
}

func compileFieldArgs(name string, v value.Value, depth level, allowed ...string) (fieldArgs, error) {
	a := fieldArgs{name: name}
	if s, ok := v.StringValueOK(); ok && name == "$getField" {
		if strings.HasPrefix(s, "$") {
			return a, value.BadValue(5654602, "%s requires 'field' to evaluate to a constant string, found a field path", name)
		}
		a.field = s
		return a, nil
	}
	d, ok := v.DocumentOK()
	if !ok {
		return a, value.BadValue(3041703, "%s requires an object or a string as its argument, found: %s", name, TypeAlias(v))
	}
	elems, _ := d.Elements()
	haveField := false
	for _, e := range elems {
		var err error
		switch {
		case e.Key() == "field":
			f, ok := fieldConstant(e.Value())
			if !ok {
				return a, value.BadValue(4161106, "%s requires 'field' to evaluate to a constant of type string", name)
			}
			a.field, haveField = f, true
		case e.Key() == "input":
			a.input, err = compileExpr(e.Value(), depth.next())
		case e.Key() == "value" && contains(allowed, "value"):
			a.value, err = compileExpr(e.Value(), depth.next())
		default:
			return a, value.BadValue(3041701, "%s found an unknown argument: %s", name, e.Key())
		}
		if err != nil {
			return a, err
		}
	}
	switch {
	case !haveField:
		return a, value.BadValue(3041702, "%s requires 'field' to be specified", name)
	case a.input == nil && name != "$getField":
		return a, value.BadValue(4161102, "%s requires 'input' to be specified", name)
	case a.value == nil && name == "$setField":
		return a, value.BadValue(4161103, "%s requires 'value' to be specified", name)
	}
	return a, nil
}

// fieldConstant is 'field' as a string: a string, or {$literal: string}.
func fieldConstant(v value.Value) (string, bool) {
	if d, ok := v.DocumentOK(); ok {
		lit, err := d.LookupErr("$literal")
		if err != nil {
			return "", false
		}
		v = lit
	} else if s, ok := v.StringValueOK(); ok && strings.HasPrefix(s, "$") {
		return "", false
	}
	return v.StringValueOK()
}

func (a fieldArgs) inputDoc(doc bsoncore.Document) (value.Value, error) {
	if a.input == nil {
		return value.Value{Type: bsoncore.TypeEmbeddedDocument, Data: doc}, nil
	}
	return a.input.Eval(doc)
}

type getField struct{ fieldArgs }

func compileGetField(name string, v value.Value, depth level) (Expr, error) {
	a, err := compileFieldArgs(name, v, depth)
	return getField{a}, err
}

func (g getField) Eval(doc bsoncore.Document) (value.Value, error) {
	in, err := g.inputDoc(doc)
	if err != nil {
		return value.Missing, err
	}
	if value.IsNullish(in) {
		return value.Null, nil
	}
	d, ok := in.DocumentOK()
	if !ok {
		return value.Missing, value.BadValue(3041705, "%s requires 'input' to evaluate to type Object, but got %s", g.name, TypeAlias(in))
	}
	v, err := d.LookupErr(g.field)
	if err != nil {
		return value.Missing, nil
	}
	return v, nil
}

type setField struct{ fieldArgs }

func compileSetField(name string, v value.Value, depth level) (Expr, error) {
	a, err := compileFieldArgs(name, v, depth, "value")
	return setField{a}, err
}

// Eval is the input with field set to value (removed when value is
// missing, as $$REMOVE makes it, and always for $unsetField).
func (s setField) Eval(doc bsoncore.Document) (value.Value, error) {
	in, err := s.inputDoc(doc)
	if err != nil {
		return value.Missing, err
	}
	if value.IsNullish(in) {
		return value.Null, nil
	}
	d, ok := in.DocumentOK()
	if !ok {
		return value.Missing, value.BadValue(4161105, "%s requires 'input' to evaluate to type Object", s.name)
	}
	val := value.Missing
	if s.value != nil {
		if val, err = s.value.Eval(doc); err != nil {
			return value.Missing, err
		}
	}
	elems, _ := d.Elements()
	idx, out := bsoncore.AppendDocumentStart(nil)
	set := false
	for _, e := range elems {
		if e.Key() != s.field {
			out = append(out, e...)
			continue
		}
		if val.Type != 0 {
			out = bsoncore.AppendValueElement(out, s.field, val)
		}
		set = true
	}
	if !set && val.Type != 0 {
		out = bsoncore.AppendValueElement(out, s.field, val)
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return value.Value{Type: bsoncore.TypeEmbeddedDocument, Data: out}, nil
}

// orderedDoc builds a document whose later values for a key replace the
// earlier in place.
type orderedDoc struct {
	keys []string
	vals map[string]value.Value
}

func (o *orderedDoc) set(k string, v value.Value) {
	if o.vals == nil {
		o.vals = map[string]value.Value{}
	}
	if _, ok := o.vals[k]; !ok {
		o.keys = append(o.keys, k)
	}
	o.vals[k] = v
}

func (o *orderedDoc) value() value.Value {
	idx, out := bsoncore.AppendDocumentStart(nil)
	for _, k := range o.keys {
		out = bsoncore.AppendValueElement(out, k, o.vals[k])
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return value.Value{Type: bsoncore.TypeEmbeddedDocument, Data: out}
}

func mergeObjects(name string, args []Expr) (Expr, error) {
	return opFunc{name: name, args: args, f: func(v []value.Value) (value.Value, error) {
		var o orderedDoc
		for _, a := range v {
			if value.IsNullish(a) {
				continue
			}
			d, ok := a.DocumentOK()
			if !ok {
				return value.Missing, value.BadValue(40400, "%s requires object inputs, but input %s is of type %s", name, value.Describe(a), TypeAlias(a))
			}
			elems, _ := d.Elements()
			for _, e := range elems {
				o.set(e.Key(), e.Value())
			}
		}
		return o.value(), nil
	}}, nil
}

func objectToArray(name string, v value.Value) (value.Value, error) {
	if value.IsNullish(v) {
		return value.Null, nil
	}
	d, ok := v.DocumentOK()
	if !ok {
		return value.Missing, value.BadValue(40390, "%s requires a document input, found: %s", name, TypeAlias(v))
	}
	elems, _ := d.Elements()
	out := make([]value.Value, len(elems))
	for i, e := range elems {
		kv := bsoncore.NewDocumentBuilder().AppendString("k", e.Key()).AppendValue("v", e.Value()).Build()
		out[i] = value.Value{Type: bsoncore.TypeEmbeddedDocument, Data: kv}
	}
	return arrayValue(out), nil
}

func arrayToObject(name string, v value.Value) (value.Value, error) {
	if value.IsNullish(v) {
		return value.Null, nil
	}
	vals, ok := arrayOf(v)
	if !ok {
		return value.Missing, value.BadValue(40386, "%s requires an array input, found: %s", name, TypeAlias(v))
	}
	var o orderedDoc
	for _, el := range vals {
		k, val, err := pairOf(name, el)
		if err != nil {
			return value.Missing, err
		}
		o.set(k, val)
	}
	return o.value(), nil
}

// pairOf reads one of $arrayToObject's elements: [k, v] or {k, v}.
func pairOf(name string, el value.Value) (string, value.Value, error) {
	var k, v value.Value
	if pair, ok := arrayOf(el); ok {
		if len(pair) != 2 {
			return "", value.Missing, value.BadValue(40397, "%s requires an array of size 2 arrays,found array of size: %d", name, len(pair))
		}
		k, v = pair[0], pair[1]
	} else if d, ok := el.DocumentOK(); ok {
		elems, _ := d.Elements()
		if len(elems) != 2 {
			return "", value.Missing, value.BadValue(40392, "%s requires an object keys of 'k' and 'v'. Found incorrect number of keys:%d", name, len(elems))
		}
		k, v = d.Lookup("k"), d.Lookup("v")
		if k.Type == 0 || v.Type == 0 {
			return "", value.Missing, value.BadValue(40393, "%s requires an object with keys 'k' and 'v'.", name)
		}
	} else {
		return "", value.Missing, value.BadValue(40398, "Unrecognised input type format for %s: %s", name, TypeAlias(el))
	}
	s, ok := k.StringValueOK()
	if !ok {
		return "", value.Missing, value.BadValue(40394, "%s requires a string 'k' value, found: %s", name, TypeAlias(k))
	}
	if strings.ContainsRune(s, 0) {
		return "", value.Missing, value.BadValue(mongoerr.Code(4940400), "Key field cannot contain an embedded null byte")
	}
	return s, v, nil
}
