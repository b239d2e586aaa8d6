package agg

import (
	"strings"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

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
	input expr // nil: $$CURRENT
	value expr // $setField only
}

func compileFieldArgs(name string, v Value, depth level, allowed ...string) (fieldArgs, error) {
	a := fieldArgs{name: name}
	if s, ok := v.StringValueOK(); ok && name == "$getField" {
		if strings.HasPrefix(s, "$") {
			return a, badValue(5654602, "%s requires 'field' to evaluate to a constant string, found a field path", name)
		}
		a.field = s
		return a, nil
	}
	d, ok := v.DocumentOK()
	if !ok {
		return a, badValue(3041703, "%s requires an object or a string as its argument, found: %s", name, typeAlias(v))
	}
	elems, _ := d.Elements()
	haveField := false
	for _, e := range elems {
		var err error
		switch {
		case e.Key() == "field":
			f, ok := fieldConstant(e.Value())
			if !ok {
				return a, badValue(4161106, "%s requires 'field' to evaluate to a constant of type string", name)
			}
			a.field, haveField = f, true
		case e.Key() == "input":
			a.input, err = compileExpr(e.Value(), depth.next())
		case e.Key() == "value" && contains(allowed, "value"):
			a.value, err = compileExpr(e.Value(), depth.next())
		default:
			return a, badValue(3041701, "%s found an unknown argument: %s", name, e.Key())
		}
		if err != nil {
			return a, err
		}
	}
	switch {
	case !haveField:
		return a, badValue(3041702, "%s requires 'field' to be specified", name)
	case a.input == nil && name != "$getField":
		return a, badValue(4161102, "%s requires 'input' to be specified", name)
	case a.value == nil && name == "$setField":
		return a, badValue(4161103, "%s requires 'value' to be specified", name)
	}
	return a, nil
}

// fieldConstant is 'field' as a string: a string, or {$literal: string}.
func fieldConstant(v Value) (string, bool) {
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

func (a fieldArgs) inputDoc(doc bsoncore.Document) (Value, error) {
	if a.input == nil {
		return Value{Type: bsoncore.TypeEmbeddedDocument, Data: doc}, nil
	}
	return a.input.eval(doc)
}

type getField struct{ fieldArgs }

func compileGetField(name string, v Value, depth level) (expr, error) {
	a, err := compileFieldArgs(name, v, depth)
	return getField{a}, err
}

func (g getField) eval(doc bsoncore.Document) (Value, error) {
	in, err := g.inputDoc(doc)
	if err != nil {
		return missing, err
	}
	if isNullish(in) {
		return null, nil
	}
	d, ok := in.DocumentOK()
	if !ok {
		return missing, badValue(3041705, "%s requires 'input' to evaluate to type Object, but got %s", g.name, typeAlias(in))
	}
	v, err := d.LookupErr(g.field)
	if err != nil {
		return missing, nil
	}
	return v, nil
}

type setField struct{ fieldArgs }

func compileSetField(name string, v Value, depth level) (expr, error) {
	a, err := compileFieldArgs(name, v, depth, "value")
	return setField{a}, err
}

// eval is the input with field set to value (removed when value is
// missing, as $$REMOVE makes it, and always for $unsetField).
func (s setField) eval(doc bsoncore.Document) (Value, error) {
	in, err := s.inputDoc(doc)
	if err != nil {
		return missing, err
	}
	if isNullish(in) {
		return null, nil
	}
	d, ok := in.DocumentOK()
	if !ok {
		return missing, badValue(4161105, "%s requires 'input' to evaluate to type Object", s.name)
	}
	val := missing
	if s.value != nil {
		if val, err = s.value.eval(doc); err != nil {
			return missing, err
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
	return Value{Type: bsoncore.TypeEmbeddedDocument, Data: out}, nil
}

// orderedDoc builds a document whose later values for a key replace the
// earlier in place.
type orderedDoc struct {
	keys []string
	vals map[string]Value
}

func (o *orderedDoc) set(k string, v Value) {
	if o.vals == nil {
		o.vals = map[string]Value{}
	}
	if _, ok := o.vals[k]; !ok {
		o.keys = append(o.keys, k)
	}
	o.vals[k] = v
}

func (o *orderedDoc) value() Value {
	idx, out := bsoncore.AppendDocumentStart(nil)
	for _, k := range o.keys {
		out = bsoncore.AppendValueElement(out, k, o.vals[k])
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return Value{Type: bsoncore.TypeEmbeddedDocument, Data: out}
}

func mergeObjects(name string, args []expr) (expr, error) {
	return opFunc{name: name, args: args, f: func(v []Value) (Value, error) {
		var o orderedDoc
		for _, a := range v {
			if isNullish(a) {
				continue
			}
			d, ok := a.DocumentOK()
			if !ok {
				return missing, badValue(40400, "%s requires object inputs, but input %s is of type %s", name, describe(a), typeAlias(a))
			}
			elems, _ := d.Elements()
			for _, e := range elems {
				o.set(e.Key(), e.Value())
			}
		}
		return o.value(), nil
	}}, nil
}

func objectToArray(name string, v Value) (Value, error) {
	if isNullish(v) {
		return null, nil
	}
	d, ok := v.DocumentOK()
	if !ok {
		return missing, badValue(40390, "%s requires a document input, found: %s", name, typeAlias(v))
	}
	elems, _ := d.Elements()
	out := make([]Value, len(elems))
	for i, e := range elems {
		kv := bsoncore.NewDocumentBuilder().AppendString("k", e.Key()).AppendValue("v", e.Value()).Build()
		out[i] = Value{Type: bsoncore.TypeEmbeddedDocument, Data: kv}
	}
	return arrayValue(out), nil
}

func arrayToObject(name string, v Value) (Value, error) {
	if isNullish(v) {
		return null, nil
	}
	vals, ok := arrayOf(v)
	if !ok {
		return missing, badValue(40386, "%s requires an array input, found: %s", name, typeAlias(v))
	}
	var o orderedDoc
	for _, el := range vals {
		k, val, err := pairOf(name, el)
		if err != nil {
			return missing, err
		}
		o.set(k, val)
	}
	return o.value(), nil
}

// pairOf reads one of $arrayToObject's elements: [k, v] or {k, v}.
func pairOf(name string, el Value) (string, Value, error) {
	var k, v Value
	if pair, ok := arrayOf(el); ok {
		if len(pair) != 2 {
			return "", missing, badValue(40397, "%s requires an array of size 2 arrays,found array of size: %d", name, len(pair))
		}
		k, v = pair[0], pair[1]
	} else if d, ok := el.DocumentOK(); ok {
		elems, _ := d.Elements()
		if len(elems) != 2 {
			return "", missing, badValue(40392, "%s requires an object keys of 'k' and 'v'. Found incorrect number of keys:%d", name, len(elems))
		}
		k, v = d.Lookup("k"), d.Lookup("v")
		if k.Type == 0 || v.Type == 0 {
			return "", missing, badValue(40393, "%s requires an object with keys 'k' and 'v'.", name)
		}
	} else {
		return "", missing, badValue(40398, "Unrecognised input type format for %s: %s", name, typeAlias(el))
	}
	s, ok := k.StringValueOK()
	if !ok {
		return "", missing, badValue(40394, "%s requires a string 'k' value, found: %s", name, typeAlias(k))
	}
	if strings.ContainsRune(s, 0) {
		return "", missing, badValue(mongoerr.Code(4940400), "Key field cannot contain an embedded null byte")
	}
	return s, v, nil
}
