package match

import (
	"math"
	"strings"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

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
		if p != nil {
			preds = append(preds, p)
		}
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
	case "$comment":
		return nil, nil // a note for the logs: matches everything
	}
	if strings.HasPrefix(key, "$") {
		return nil, fc.Unsupported("filter operator %q is not supported", key)
	}
	path := strings.Split(key, ".")
	m, err := fc.fieldMatcher(key, v, depth)
	if err != nil {
		return nil, err
	}
	return func(doc bsoncore.Document) bool { return m.path(doc, path) }, nil
}

// fieldMatcher compiles the value a field path is given in a filter: an
// operator document, a regular expression, or a literal to equal.
func (fc *Compiler) fieldMatcher(field string, v bsoncore.Value, depth int) (matcher, error) {
	if ops, ok := operatorDoc(v); ok {
		return fc.operators(field, ops, depth)
	}
	if v.Type == bsoncore.TypeRegex {
		return fc.regexValue(field, v)
	}
	if err := fc.operand(field, "$eq", v); err != nil {
		return nil, err
	}
	return eqMatcher(v), nil
}

// operatorDoc is IsOperatorDoc, except that a DBRef ({$ref, $id, ...}) is a
// literal, as MongoDB reads it.
func operatorDoc(v bsoncore.Value) (bsoncore.Document, bool) {
	d, ok := IsOperatorDoc(v)
	if !ok {
		return nil, false
	}
	elems, _ := d.Elements()
	if len(elems) >= 2 && elems[0].Key() == "$ref" && elems[1].Key() == "$id" {
		return nil, false
	}
	return d, true
}

// valuePred tests one field's value; a zero Value is a missing field.
type valuePred func(v bsoncore.Value) bool

// operators compiles an operator document ({$gt: 1, $lt: 5}): each
// operator is a test of the path of its own, all of which must hold.
func (fc *Compiler) operators(field string, ops bsoncore.Document, depth int) (matcher, error) {
	if depth > bsonutil.MaxDepth {
		return nil, fc.Unsupported("filter nested deeper than %d levels", bsonutil.MaxDepth)
	}
	elems, err := ops.Elements()
	if err != nil {
		return nil, mongoerr.Errorf(mongoerr.BadValue, "filter is not valid BSON: %v", err)
	}
	var regex, options *bsoncore.Value
	for _, e := range elems {
		v := e.Value()
		switch e.Key() {
		case "$regex":
			regex = &v
		case "$options":
			options = &v
		}
	}
	if options != nil && regex == nil {
		return nil, mongoerr.Errorf(mongoerr.BadValue, "$options needs a $regex")
	}
	all := make(andMatcher, 0, len(elems))
	for _, e := range elems {
		var m matcher
		var err error
		switch e.Key() {
		case "$options":
			continue
		case "$regex":
			m, err = fc.regexOperator(field, *regex, options)
		default:
			m, err = fc.operator(field, e.Key(), e.Value(), depth)
		}
		if err != nil {
			return nil, err
		}
		all = append(all, m)
	}
	if len(all) == 1 {
		return all[0], nil
	}
	return all, nil
}

func (fc *Compiler) operator(field, op string, arg bsoncore.Value, depth int) (matcher, error) {
	switch op {
	case "$eq", "$ne", "$gt", "$gte", "$lt", "$lte":
		if err := fc.operand(field, op, arg); err != nil {
			return nil, err
		}
	}
	switch op {
	case "$eq":
		return eqMatcher(arg), nil
	case "$ne":
		return notMatcher{eqMatcher(arg)}, nil
	case "$gt":
		return leaf(rangePred(arg, func(c int) bool { return c > 0 })), nil
	case "$gte":
		return leaf(rangePred(arg, func(c int) bool { return c >= 0 })), nil
	case "$lt":
		return leaf(rangePred(arg, func(c int) bool { return c < 0 })), nil
	case "$lte":
		return leaf(rangePred(arg, func(c int) bool { return c <= 0 })), nil
	case "$in", "$nin":
		in, err := fc.in(field, op, arg)
		if err != nil {
			return nil, err
		}
		if op == "$nin" {
			return notMatcher{in}, nil
		}
		return in, nil
	case "$exists":
		want := arg.Type != bsoncore.TypeNull && arg.Type != bsoncore.TypeUndefined && truthy(arg)
		exists := leaf(func(v bsoncore.Value) bool { return v.Type != 0 })
		if want {
			return exists, nil
		}
		return notMatcher{exists}, nil
	case "$not":
		return fc.not(field, arg, depth)
	case "$type":
		return fc.typeOperator(field, arg)
	case "$size":
		return fc.size(arg)
	case "$mod":
		return fc.mod(arg)
	case "$bitsAllSet", "$bitsAllClear", "$bitsAnySet", "$bitsAnyClear":
		return fc.bits(field, op, arg)
	case "$all":
		return fc.all(field, arg, depth)
	case "$elemMatch":
		return fc.elemMatch(field, arg, depth)
	case "$regex":
		return fc.regexOperator(field, arg, nil)
	}
	return nil, fc.Unsupported("filter operator %q (on %q) is not supported", op, field)
}

// operand checks the operand of a comparison as MongoDB parses it.
func (fc *Compiler) operand(field, op string, v bsoncore.Value) error {
	switch {
	case v.Type == bsoncore.TypeUndefined:
		return mongoerr.Errorf(mongoerr.BadValue, "cannot compare to undefined")
	case v.Type != bsoncore.TypeRegex, op == "$eq":
		// $eq of a regular expression is the equality of regex values.
		return nil
	case op == "$ne":
		return mongoerr.Errorf(mongoerr.BadValue, "Can't have regex as arg to $ne.")
	}
	return fc.Unsupported("%s with a regular expression (on %q) is not supported", op, field)
}

func (fc *Compiler) not(field string, arg bsoncore.Value, depth int) (matcher, error) {
	switch arg.Type {
	case bsoncore.TypeRegex:
		m, err := fc.regexValue(field, arg)
		if err != nil {
			return nil, err
		}
		return notMatcher{m}, nil
	case bsoncore.TypeEmbeddedDocument:
	default:
		return nil, mongoerr.Errorf(mongoerr.BadValue, "$not needs a regex or a document")
	}
	d, _ := arg.DocumentOK()
	elems, err := d.Elements()
	if err != nil {
		return nil, mongoerr.Errorf(mongoerr.BadValue, "filter is not valid BSON: %v", err)
	}
	if len(elems) == 0 {
		return nil, mongoerr.Errorf(mongoerr.BadValue, "$not cannot be empty")
	}
	if k := elems[0].Key(); !strings.HasPrefix(k, "$") {
		return nil, mongoerr.Errorf(mongoerr.BadValue, "unknown operator: %s", k)
	}
	m, err := fc.operators(field, d, depth+1)
	if err != nil {
		return nil, err
	}
	return notMatcher{m}, nil
}

// in compiles the $in list (the operand of $nin too).
func (fc *Compiler) in(field, op string, arg bsoncore.Value) (matcher, error) {
	arr, ok := arg.ArrayOK()
	if !ok {
		return nil, mongoerr.Errorf(mongoerr.BadValue, "%s of %q needs an array", op, field)
	}
	vals, err := arr.Values()
	if err != nil {
		return nil, mongoerr.Errorf(mongoerr.BadValue, "filter is not valid BSON: %v", err)
	}
	var eqs []bsoncore.Value
	var regexes []valuePred
	for _, x := range vals {
		if x.Type == bsoncore.TypeRegex {
			re, err := fc.compileRegex(field, x)
			if err != nil {
				return nil, err
			}
			regexes = append(regexes, re)
			continue
		}
		if _, isOps := operatorDoc(x); isOps {
			return nil, mongoerr.Errorf(mongoerr.BadValue, "cannot nest $ under %s", op)
		}
		eqs = append(eqs, x)
	}
	return leaf(func(v bsoncore.Value) bool {
		for _, x := range eqs {
			if ValuesEqual(v, x) {
				return true
			}
		}
		for _, re := range regexes {
			if re(v) {
				return true
			}
		}
		return false
	}), nil
}

// all compiles $all: every entry matches the path as an equality (or a
// regex) would, or every entry is an $elemMatch.
func (fc *Compiler) all(field string, arg bsoncore.Value, depth int) (matcher, error) {
	arr, ok := arg.ArrayOK()
	if !ok {
		return nil, mongoerr.Errorf(mongoerr.BadValue, "$all needs an array")
	}
	vals, err := arr.Values()
	if err != nil {
		return nil, mongoerr.Errorf(mongoerr.BadValue, "filter is not valid BSON: %v", err)
	}
	if len(vals) == 0 {
		return constMatcher(false), nil
	}
	isElemMatch := func(v bsoncore.Value) (bsoncore.Value, bool) {
		d, ok := v.DocumentOK()
		if !ok || v.Type != bsoncore.TypeEmbeddedDocument {
			return bsoncore.Value{}, false
		}
		elems, err := d.Elements()
		if err != nil || len(elems) == 0 || elems[0].Key() != "$elemMatch" {
			return bsoncore.Value{}, false
		}
		return elems[0].Value(), true
	}
	out := make(andMatcher, 0, len(vals))
	if _, ok := isElemMatch(vals[0]); ok {
		for _, v := range vals {
			em, ok := isElemMatch(v)
			if !ok {
				return nil, mongoerr.Errorf(mongoerr.BadValue, "$all/$elemMatch has to be consistent")
			}
			m, err := fc.elemMatch(field, em, depth+1)
			if err != nil {
				return nil, err
			}
			out = append(out, m)
		}
		return out, nil
	}
	for _, v := range vals {
		switch {
		case v.Type == bsoncore.TypeRegex:
			m, err := fc.regexValue(field, v)
			if err != nil {
				return nil, err
			}
			out = append(out, m)
		case isPathOperatorDoc(v):
			return nil, mongoerr.Errorf(mongoerr.BadValue, "no $ expressions in $all")
		default:
			out = append(out, eqMatcher(v))
		}
	}
	return out, nil
}

// isPathOperatorDoc reports whether v is a document whose first key is
// an operator MongoDB knows under a field ({$gt: 1}).
func isPathOperatorDoc(v bsoncore.Value) bool {
	d, ok := operatorDoc(v)
	if !ok {
		return false
	}
	elems, _ := d.Elements()
	return len(elems) > 0 && FieldOperators[elems[0].Key()]
}

// pathlessOperators are the top-level operators that name no field: an
// $elemMatch whose first key is one of them is of the query form.
var pathlessOperators = map[string]bool{
	"$and": true, "$or": true, "$nor": true, "$where": true, "$expr": true, "$text": true,
	"$comment": true, "$jsonSchema": true, "$alwaysFalse": true, "$alwaysTrue": true,
	"$sampleRate": true, "$ref": true, "$id": true, "$db": true,
}

// elemMatch compiles $elemMatch: of the value form ({$gt: 1, $lt: 5},
// every operator on the same element) when its first key is a field
// operator, else of the query form ({x: 1, y: 2}, a filter over each
// element that is a document or an array).
func (fc *Compiler) elemMatch(field string, arg bsoncore.Value, depth int) (matcher, error) {
	if depth > bsonutil.MaxDepth {
		return nil, fc.Unsupported("filter nested deeper than %d levels", bsonutil.MaxDepth)
	}
	d, ok := arg.DocumentOK()
	if !ok || arg.Type != bsoncore.TypeEmbeddedDocument {
		return nil, mongoerr.Errorf(mongoerr.BadValue, "$elemMatch needs an Object")
	}
	elems, err := d.Elements()
	if err != nil {
		return nil, mongoerr.Errorf(mongoerr.BadValue, "filter is not valid BSON: %v", err)
	}
	if len(elems) > 0 && strings.HasPrefix(elems[0].Key(), "$") && !pathlessOperators[elems[0].Key()] {
		sub, err := fc.operators(field, d, depth+1)
		if err != nil {
			return nil, err
		}
		return arrayLeaf(func(v bsoncore.Value) bool {
			return anyElement(v, func(x bsoncore.Value) bool { return sub.one(x) })
		}), nil
	}
	sub, err := fc.Compile(d, depth+1)
	if err != nil {
		return nil, err
	}
	return arrayLeaf(func(v bsoncore.Value) bool {
		return anyElement(v, func(x bsoncore.Value) bool {
			if x.Type != bsoncore.TypeEmbeddedDocument && x.Type != bsoncore.TypeArray {
				return false
			}
			return sub(bsoncore.Document(x.Data))
		})
	}), nil
}

// anyElement reports whether f holds for an element of v, an array.
func anyElement(v bsoncore.Value, f func(bsoncore.Value) bool) bool {
	if v.Type != bsoncore.TypeArray {
		return false
	}
	arr, ok := v.ArrayOK()
	if !ok {
		return false
	}
	vals, _ := arr.Values()
	for _, x := range vals {
		if f(x) {
			return true
		}
	}
	return false
}

func (fc *Compiler) size(arg bsoncore.Value) (matcher, error) {
	var n int64
	switch arg.Type {
	case bsoncore.TypeInt32, bsoncore.TypeInt64, bsoncore.TypeDouble, bsoncore.TypeDecimal128:
		i, whole, ok := truncInt64(arg)
		switch {
		case !ok || !whole:
			return nil, mongoerr.Errorf(mongoerr.BadValue, "$size must be a whole number")
		case i < 0:
			return nil, mongoerr.Errorf(mongoerr.BadValue, "$size may not be negative")
		case i > math.MaxInt32:
			return nil, mongoerr.Errorf(mongoerr.BadValue, "$size must be representable as a 32-bit integer")
		}
		n = i
	default:
		return nil, mongoerr.Errorf(mongoerr.BadValue, "$size needs a number")
	}
	return arrayLeaf(func(v bsoncore.Value) bool {
		if v.Type != bsoncore.TypeArray {
			return false
		}
		arr, ok := v.ArrayOK()
		if !ok {
			return false
		}
		vals, err := arr.Values()
		return err == nil && int64(len(vals)) == n
	}), nil
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
// does: {$gt: 5} never matches a string. As in MongoDB, an operand MinKey
// or MaxKey bounds every type, and NaN is only ever equal to NaN.
func rangePred(arg bsoncore.Value, ok func(int) bool) valuePred {
	argNaN := isNaN(arg)
	return func(v bsoncore.Value) bool {
		if v.Type == 0 {
			v = bsoncore.Value{Type: bsoncore.TypeNull}
		}
		if bsonutil.CanonicalOrder(v.Type) != bsonutil.CanonicalOrder(arg.Type) {
			switch arg.Type {
			case bsoncore.TypeMaxKey:
				return ok(-1)
			case bsoncore.TypeMinKey:
				return ok(1)
			}
			return false
		}
		if vNaN := isNaN(v); vNaN || argNaN {
			return vNaN && argNaN && ok(0)
		}
		return ok(bsonutil.Compare(v, arg))
	}
}

// FieldOperators are the operators allowed under a field path; their
// operands do not name fields of the event, so renaming the path keeps
// their meaning ($elemMatch and $not are checked inside).
var FieldOperators = map[string]bool{
	"$eq": true, "$ne": true, "$gt": true, "$gte": true, "$lt": true, "$lte": true,
	"$in": true, "$nin": true, "$exists": true, "$not": true, "$regex": true, "$options": true,
	"$type": true, "$size": true, "$all": true, "$elemMatch": true, "$mod": true,
	"$bitsAllSet": true, "$bitsAllClear": true, "$bitsAnySet": true, "$bitsAnyClear": true,
}

// IsOperatorDoc reports whether v is a document whose first key is an
// operator ({$gt: 1}), which MongoDB reads as operators, not as a literal.
func IsOperatorDoc(v bsoncore.Value) (bsoncore.Document, bool) {
	d, ok := v.DocumentOK()
	if !ok {
		return nil, false
	}
	elems, err := d.Elements()
	if err != nil || len(elems) == 0 {
		return nil, false
	}
	return d, strings.HasPrefix(elems[0].Key(), "$")
}
