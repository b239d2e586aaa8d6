package updateop

import (
	"math"
	"slices"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/match"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// arithmetic is $inc and $mul: a missing field becomes the argument
// ($inc) or a zero of its type ($mul); int32 widens to int64 where the
// result needs it, and a double makes a double; int64 overflow fails.
func (o op) arithmetic(old any, exists bool) (any, action, error) {
	if !exists {
		if o.name == "$mul" {
			return zeroOf(o.arg), actSet, nil
		}
		return clone(o.arg), actSet, nil
	}
	if !isNumber(old) {
		verb := map[string]string{"$inc": "$inc", "$mul": "$mul"}[o.name]
		return nil, actNone, mongoerr.Errorf(mongoerr.TypeMismatch, "Cannot apply %s to a value of non-numeric type. The field '%s' is of non-numeric type %s", verb, o.dotted, typeName(old))
	}
	_, oldDec := old.(bson.Decimal128)
	_, argDec := o.arg.(bson.Decimal128)
	if oldDec || argDec {
		return nil, actNone, mongoerr.Errorf(mongoerr.NotImplemented, "tsproxy: %s of decimal values is not supported in updates of a time-series collection (field '%s')", o.name, o.dotted)
	}
	_, oldF := old.(float64)
	_, argF := o.arg.(float64)
	if oldF || argF {
		a, _ := toFloat(old)
		b, _ := toFloat(o.arg)
		if o.name == "$mul" {
			return a * b, actSet, nil
		}
		return a + b, actSet, nil
	}
	a, _ := toInt(old)
	b, _ := toInt(o.arg)
	r, ok := intOp(o.name, a, b)
	if !ok {
		return nil, actNone, mongoerr.Errorf(mongoerr.BadValue, "Failed to apply %s operations to current value (%s) for the field '%s': the result overflows a 64-bit integer", o.name, show(old), o.dotted)
	}
	_, old64 := old.(int64)
	_, arg64 := o.arg.(int64)
	if !old64 && !arg64 && r >= math.MinInt32 && r <= math.MaxInt32 {
		return int32(r), actSet, nil
	}
	return r, actSet, nil
}

func intOp(name string, a, b int64) (int64, bool) {
	if name == "$mul" {
		if a == 0 || b == 0 {
			return 0, true
		}
		r := a * b
		return r, r/b == a && !(a == -1 && b == math.MinInt64) && !(b == -1 && a == math.MinInt64)
	}
	r := a + b
	return r, (b >= 0) == (r >= a)
}

func zeroOf(v any) any {
	switch v.(type) {
	case int32:
		return int32(0)
	case int64:
		return int64(0)
	case bson.Decimal128:
		z, _ := bson.ParseDecimal128("0")
		return z
	}
	return float64(0)
}

// eachOf is what $push and $addToSet add: $each's elements, or the
// argument itself.
func eachOf(arg any) (elems bson.A, mods bson.D) {
	if d, ok := arg.(bson.D); ok {
		if each, ok := lookupD(d, "$each"); ok {
			return each.(bson.A), d
		}
	}
	return bson.A{arg}, nil
}

// arrayOf is a copy of the array an array operator changes (nil for a
// missing field), or MongoDB's error for a field that is no array.
func (o op) arrayOf(old any, exists bool) (bson.A, error) {
	if !exists {
		return nil, nil
	}
	a, ok := old.(bson.A)
	if !ok {
		return nil, o.notArray(old)
	}
	return slices.Clone(a), nil
}

func (o op) push(old any, exists bool) (any, action, error) {
	arr, err := o.arrayOf(old, exists)
	if err != nil {
		return nil, actNone, err
	}
	elems, mods := eachOf(o.arg)
	pos := len(arr)
	if p, ok := lookupD(mods, "$position"); ok {
		n, _ := toInt(p)
		if n < 0 {
			n = max(int64(len(arr))+n, 0)
		}
		pos = int(min(n, int64(len(arr))))
	}
	added := make(bson.A, len(elems))
	for i, e := range elems {
		added[i] = clone(e)
	}
	arr = slices.Insert(arr, pos, added...)
	if s, ok := lookupD(mods, "$sort"); ok {
		sortElements(arr, s)
	}
	if s, ok := lookupD(mods, "$slice"); ok {
		n, _ := toInt(s)
		switch {
		case n >= 0 && int(n) < len(arr):
			arr = arr[:n]
		case n < 0 && int(-n) < len(arr):
			arr = arr[len(arr)+int(n):]
		}
	}
	return arr, actSet, nil
}

// sortElements is $push's $sort: by the whole element (1 or -1) or by
// fields of the element documents.
func sortElements(arr bson.A, spec any) {
	if dir, ok := toFloat(spec); ok {
		slices.SortStableFunc(arr, func(a, b any) int { return compare(a, b) * int(dir) })
		return
	}
	fields := spec.(bson.D)
	slices.SortStableFunc(arr, func(a, b any) int {
		for _, f := range fields {
			dir, _ := toFloat(f.Value)
			path, _ := splitPath(f.Key)
			av, _ := get(a, path)
			bv, _ := get(b, path)
			if c := compare(av, bv); c != 0 {
				return c * int(dir)
			}
		}
		return 0
	})
}

func (o op) addToSet(old any, exists bool) (any, action, error) {
	arr, err := o.arrayOf(old, exists)
	if err != nil {
		return nil, actNone, err
	}
	elems, _ := eachOf(o.arg)
	for _, e := range elems {
		if !slices.ContainsFunc(arr, func(x any) bool { return sameValue(x, e) }) {
			arr = append(arr, clone(e))
		}
	}
	if exists && len(arr) == len(old.(bson.A)) {
		return nil, actNone, nil
	}
	return arr, actSet, nil
}

// sameValue is equality as $addToSet and $pullAll see it: the same BSON
// value (numbers of different types equal when their values are).
func sameValue(a, b any) bool { return compare(a, b) == 0 }

func (o op) pop(old any, exists bool) (any, action, error) {
	if !exists {
		return nil, actNone, nil
	}
	arr, ok := old.(bson.A)
	if !ok {
		return nil, actNone, mongoerr.Errorf(mongoerr.TypeMismatch, "Path '%s' contains an element of non-array type '%s'", o.dotted, typeName(old))
	}
	if len(arr) == 0 {
		return nil, actNone, nil
	}
	if n, _ := toFloat(o.arg); n < 0 {
		return slices.Clone(arr[1:]), actSet, nil
	}
	return slices.Clone(arr[:len(arr)-1]), actSet, nil
}

func (o op) pull(old any, exists bool) (any, action, error) {
	if !exists {
		return nil, actNone, nil
	}
	arr, ok := old.(bson.A)
	if !ok {
		return nil, actNone, mongoerr.Errorf(mongoerr.BadValue, "Cannot apply %s to a non-array value", o.name)
	}
	match, err := o.pullMatcher()
	if err != nil {
		return nil, actNone, err
	}
	kept := slices.DeleteFunc(slices.Clone(arr), match)
	if len(kept) == len(arr) {
		return nil, actNone, nil
	}
	return kept, actSet, nil
}

// pullMatcher says which elements $pull or $pullAll removes: $pullAll's
// values; a $pull condition of operators applies to the element, a
// document of fields to element documents as a query; any other value
// by equality.
func (o op) pullMatcher() (func(any) bool, error) {
	if o.name == "$pullAll" {
		vals := o.arg.(bson.A)
		return func(e any) bool {
			return slices.ContainsFunc(vals, func(v any) bool { return sameValue(e, v) })
		}, nil
	}
	cond, ok := o.arg.(bson.D)
	if !ok {
		return func(e any) bool { return sameValue(e, o.arg) }, nil
	}
	fc := &match.Compiler{Unsupported: func(format string, args ...any) error {
		return mongoerr.Errorf(mongoerr.NotImplemented, "tsproxy: $pull condition: "+format, args...)
	}}
	if len(cond) > 0 && len(cond[0].Key) > 0 && cond[0].Key[0] == '$' {
		filter, _ := bson.Marshal(bson.D{{Key: "v", Value: cond}})
		pred, err := fc.Compile(filter, 0)
		if err != nil {
			return nil, err
		}
		return func(e any) bool {
			doc, _ := bson.Marshal(bson.D{{Key: "v", Value: e}})
			return pred(bsoncore.Document(doc))
		}, nil
	}
	filter, _ := bson.Marshal(cond)
	pred, err := fc.Compile(filter, 0)
	if err != nil {
		return nil, err
	}
	return func(e any) bool {
		d, ok := e.(bson.D)
		if !ok {
			return false
		}
		doc, _ := bson.Marshal(d)
		return pred(bsoncore.Document(doc))
	}, nil
}
