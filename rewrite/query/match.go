package query

import (
	"strings"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// The documents a counter or slots read returns are made by the proxy
// from the buckets, so the proxy evaluates the app's filter on them
// itself. It supports a clear subset of the query language and refuses the
// rest by name: comparisons ($eq $ne $gt $gte $lt $lte $in $nin), $exists,
// $not, and $and/$or/$nor, on top-level or dotted fields, with MongoDB's
// type bracketing and BSON order (bsonutil.Compare). Arrays are not matched
// element-wise (no field of these documents holds one, except inside a
// document meta).

// DocPred is a compiled filter.
type DocPred func(doc bsoncore.Document) bool

type Compiler struct {
	Unsupported func(format string, args ...any) error
}

func (fc *Compiler) Compile(f bsoncore.Document, depth int) (DocPred, error) {
	if depth > bsonutil.MaxDepth {
		return nil, fc.Unsupported("filter nested deeper than %d levels", bsonutil.MaxDepth)
	}
	elems, err := f.Elements()
	if err != nil {
		return nil, mongoerr.Errorf(mongoerr.BadValue, "filter is not valid BSON: %v", err)
	}
	preds := make([]DocPred, 0, len(elems))
	for _, e := range elems {
		p, err := fc.element(e, depth)
		if err != nil {
			return nil, err
		}
		preds = append(preds, p)
	}
	return allOf(preds), nil
}

func allOf(preds []DocPred) DocPred {
	return func(doc bsoncore.Document) bool {
		for _, p := range preds {
			if !p(doc) {
				return false
			}
		}
		return true
	}
}

func (fc *Compiler) element(e bsoncore.Element, depth int) (DocPred, error) {
	key, v := e.Key(), e.Value()
	switch key {
	case "$and", "$or", "$nor":
		arr, ok := v.ArrayOK()
		if !ok {
			return nil, mongoerr.Errorf(mongoerr.BadValue, "%s must be an array", key)
		}
		vals, _ := arr.Values()
		if len(vals) == 0 {
			return nil, mongoerr.Errorf(mongoerr.BadValue, "%s must be a nonempty array", key)
		}
		subs := make([]DocPred, 0, len(vals))
		for _, sv := range vals {
			d, ok := sv.DocumentOK()
			if !ok {
				return nil, mongoerr.Errorf(mongoerr.BadValue, "%s entries must be objects", key)
			}
			p, err := fc.Compile(d, depth+1)
			if err != nil {
				return nil, err
			}
			subs = append(subs, p)
		}
		if key == "$and" {
			return allOf(subs), nil
		}
		anyOf := func(doc bsoncore.Document) bool {
			for _, p := range subs {
				if p(doc) {
					return true
				}
			}
			return false
		}
		if key == "$nor" {
			return func(doc bsoncore.Document) bool { return !anyOf(doc) }, nil
		}
		return anyOf, nil
	}
	if strings.HasPrefix(key, "$") {
		return nil, fc.Unsupported("filter operator %s is not supported", key)
	}
	path := strings.Split(key, ".")
	get := func(doc bsoncore.Document) bsoncore.Value {
		v, err := doc.LookupErr(path...)
		if err != nil {
			return bsoncore.Value{}
		}
		return v
	}
	if ops, ok := IsOperatorDoc(v); ok {
		p, err := fc.operators(key, ops)
		if err != nil {
			return nil, err
		}
		return func(doc bsoncore.Document) bool { return p(get(doc)) }, nil
	}
	if err := fc.operand(key, v); err != nil {
		return nil, err
	}
	return func(doc bsoncore.Document) bool { return ValuesEqual(get(doc), v) }, nil
}

// valuePred tests one field's value; a zero Value is a missing field.
type valuePred func(v bsoncore.Value) bool

func (fc *Compiler) operators(field string, ops bsoncore.Document) (valuePred, error) {
	elems, _ := ops.Elements()
	preds := make([]valuePred, 0, len(elems))
	for _, e := range elems {
		p, err := fc.operator(field, e.Key(), e.Value())
		if err != nil {
			return nil, err
		}
		preds = append(preds, p)
	}
	return func(v bsoncore.Value) bool {
		for _, p := range preds {
			if !p(v) {
				return false
			}
		}
		return true
	}, nil
}

func (fc *Compiler) operator(field, op string, arg bsoncore.Value) (valuePred, error) {
	switch op {
	case "$eq", "$ne", "$gt", "$gte", "$lt", "$lte":
		if err := fc.operand(field, arg); err != nil {
			return nil, err
		}
	}
	switch op {
	case "$eq":
		return func(v bsoncore.Value) bool { return ValuesEqual(v, arg) }, nil
	case "$ne":
		return func(v bsoncore.Value) bool { return !ValuesEqual(v, arg) }, nil
	case "$gt":
		return rangePred(arg, func(c int) bool { return c > 0 }), nil
	case "$gte":
		return rangePred(arg, func(c int) bool { return c >= 0 }), nil
	case "$lt":
		return rangePred(arg, func(c int) bool { return c < 0 }), nil
	case "$lte":
		return rangePred(arg, func(c int) bool { return c <= 0 }), nil
	case "$in", "$nin":
		arr, ok := arg.ArrayOK()
		if !ok {
			return nil, mongoerr.Errorf(mongoerr.BadValue, "%s of %q needs an array", op, field)
		}
		vals, _ := arr.Values()
		for _, x := range vals {
			if err := fc.operand(field, x); err != nil {
				return nil, err
			}
		}
		in := func(v bsoncore.Value) bool {
			for _, x := range vals {
				if ValuesEqual(v, x) {
					return true
				}
			}
			return false
		}
		if op == "$nin" {
			return func(v bsoncore.Value) bool { return !in(v) }, nil
		}
		return in, nil
	case "$exists":
		want := arg.Type != bsoncore.TypeNull && truthy(arg)
		return func(v bsoncore.Value) bool { return (v.Type != 0) == want }, nil
	case "$not":
		ops, ok := IsOperatorDoc(arg)
		if !ok {
			return nil, fc.Unsupported("$not of %q needs an operator document such as {$gt: 5}", field)
		}
		p, err := fc.operators(field, ops)
		if err != nil {
			return nil, err
		}
		return func(v bsoncore.Value) bool { return !p(v) }, nil
	}
	return nil, fc.Unsupported("filter operator %s (on %q) is not supported", op, field)
}

// operand refuses the comparison operands whose meaning needs more than
// BSON order (a regex matches strings).
func (fc *Compiler) operand(field string, v bsoncore.Value) error {
	if v.Type == bsoncore.TypeRegex {
		return fc.Unsupported("regular expressions (on %q) are not supported", field)
	}
	return nil
}

func truthy(v bsoncore.Value) bool {
	if b, ok := v.BooleanOK(); ok {
		return b
	}
	if v.IsNumber() {
		f, _ := v.AsFloat64OK()
		return f != 0
	}
	return true
}

// ValuesEqual is equality as a query means it: a missing field equals null.
func ValuesEqual(v, arg bsoncore.Value) bool {
	if v.Type == 0 {
		v = bsoncore.Value{Type: bsoncore.TypeNull}
	}
	if bsonutil.CanonicalOrder(v.Type) != bsonutil.CanonicalOrder(arg.Type) {
		return false
	}
	return bsonutil.Compare(v, arg) == 0
}

// rangePred compares within the operand's type bracket only, as MongoDB
// does: {$gt: 5} never matches a string.
func rangePred(arg bsoncore.Value, ok func(int) bool) valuePred {
	return func(v bsoncore.Value) bool {
		if v.Type == 0 {
			v = bsoncore.Value{Type: bsoncore.TypeNull}
		}
		if bsonutil.CanonicalOrder(v.Type) != bsonutil.CanonicalOrder(arg.Type) {
			return false
		}
		return ok(bsonutil.Compare(v, arg))
	}
}
