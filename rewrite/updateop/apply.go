package updateop

import (
	"bytes"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/agg"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// Options are what applying an update needs besides the document.
type Options struct {
	// Insert: the document is an upsert's new one ($setOnInsert applies).
	Insert bool
	// Now is $currentDate's time.
	Now time.Time
}

// Apply returns doc updated by u, and whether it changed (a no-op update
// matches without modifying, as nModified counts). The _id never changes:
// an update that would change it fails with MongoDB's ImmutableField.
func (u *Update) Apply(doc bsoncore.Document, opts Options) (bsoncore.Document, bool, error) {
	var d bson.D
	if err := bson.Unmarshal(doc, &d); err != nil {
		return nil, false, mongoerr.Errorf(mongoerr.InvalidBSON, "update: the document: %v", err)
	}
	oldID, hadID := lookupD(d, "_id")
	var out bson.D
	var err error
	switch u.kind {
	case Replacement:
		out = clone(u.replacement).(bson.D)
	case Operators:
		out, err = u.applyOperators(d, opts)
	case Pipeline:
		out, err = u.applyPipeline(doc)
	}
	if err != nil {
		return nil, false, err
	}
	if out, err = keepID(out, oldID, hadID, u.kind); err != nil {
		return nil, false, err
	}
	b, err := bson.Marshal(out)
	if err != nil {
		return nil, false, mongoerr.Errorf(mongoerr.BadValue, "update: the updated document: %v", err)
	}
	return b, !bytes.Equal(b, doc), nil
}

// keepID puts the document's _id back first where the update left it
// out, and refuses one that changed it.
func keepID(out bson.D, oldID any, hadID bool, kind Kind) (bson.D, error) {
	newID, has := lookupD(out, "_id")
	switch {
	case !hadID:
		return out, nil
	case !has:
		return append(bson.D{{Key: "_id", Value: oldID}}, out...), nil
	case compare(newID, oldID) != 0 || typeName(newID) != typeName(oldID):
		if kind == Operators {
			return nil, mongoerr.Errorf(mongoerr.ImmutableField, "Performing an update on the path '_id' would modify the immutable field '_id'")
		}
		return nil, mongoerr.Errorf(mongoerr.ImmutableField, "After applying the update, the (immutable) field '_id' was found to have been altered to _id: %s", show(newID))
	}
	return out, nil
}

func (u *Update) applyOperators(d bson.D, opts Options) (bson.D, error) {
	var root any = d
	for _, o := range u.ops {
		var err error
		if root, err = o.apply(root, opts); err != nil {
			return nil, err
		}
	}
	return root.(bson.D), nil
}

func (u *Update) applyPipeline(doc bsoncore.Document) (bson.D, error) {
	p, err := agg.Compile(u.pipeline, agg.Options{})
	if err != nil {
		return nil, err
	}
	if err := p.Push(doc); err != nil {
		return nil, err
	}
	docs, err := p.Finish()
	if err != nil {
		return nil, err
	}
	if len(docs) != 1 {
		return nil, mongoerr.Errorf(mongoerr.BadValue, "an update pipeline must make one document of each, it made %d", len(docs))
	}
	var out bson.D
	if err := bson.Unmarshal(docs[0], &out); err != nil {
		return nil, mongoerr.Errorf(mongoerr.InvalidBSON, "update pipeline: %v", err)
	}
	return out, nil
}

// action is what a change does to the field it is given.
type action int

const (
	actSet action = iota
	actRemove
	actNone
)

// change computes a field's new value from its old one (exists false:
// the field is missing).
type change func(old any, exists bool) (any, action, error)

// walk applies fn at path in cur and returns cur changed. create says
// missing documents on the way are made (as $set makes them); without
// it a missing or unfit step leaves cur as it is.
func walk(cur any, path []string, fn change, create bool, full string, af arrayFilters) (any, error) {
	key, last := path[0], len(path) == 1
	if id, ok := positional(key); ok {
		return walkElements(cur, path, fn, create, full, af, id)
	}
	switch v := cur.(type) {
	case bson.D:
		idx := -1
		for j := range v {
			if v[j].Key == key {
				idx = j
				break
			}
		}
		if last {
			var old any
			if idx >= 0 {
				old = v[idx].Value
			}
			nv, act, err := fn(old, idx >= 0)
			if err != nil {
				return nil, err
			}
			switch {
			case act == actSet && idx >= 0:
				v[idx].Value = nv
			case act == actSet:
				v = append(v, bson.E{Key: key, Value: nv})
			case act == actRemove && idx >= 0:
				v = append(v[:idx:idx], v[idx+1:]...)
			}
			return v, nil
		}
		if idx < 0 {
			if !create {
				return v, nil
			}
			child, err := walk(bson.D{}, path[1:], fn, create, full, af)
			if err != nil {
				return nil, err
			}
			return append(v, bson.E{Key: key, Value: child}), nil
		}
		child, err := walk(v[idx].Value, path[1:], fn, create, full, af)
		if err != nil {
			return nil, err
		}
		v[idx].Value = child
		return v, nil
	case bson.A:
		n, ok := arrayIndex(key)
		if !ok {
			if !create {
				return v, nil
			}
			return nil, mongoerr.Errorf(mongoerr.PathNotViable, "Cannot create field '%s' in element {%s: %s}", key, full, show(v))
		}
		if last {
			var old any
			exists := n < len(v)
			if exists {
				old = v[n]
			}
			nv, act, err := fn(old, exists)
			if err != nil {
				return nil, err
			}
			switch {
			case act == actSet:
				for len(v) <= n {
					v = append(v, nil)
				}
				v[n] = nv
			case act == actRemove && exists:
				v[n] = nil // $unset of an element leaves null in its place
			}
			return v, nil
		}
		if n >= len(v) {
			if !create {
				return v, nil
			}
			for len(v) <= n {
				v = append(v, nil)
			}
			v[n] = bson.D{}
		}
		child, err := walk(v[n], path[1:], fn, create, full, af)
		if err != nil {
			return nil, err
		}
		v[n] = child
		return v, nil
	default:
		if !create {
			return cur, nil
		}
		return nil, mongoerr.Errorf(mongoerr.PathNotViable, "Cannot create field '%s' in element {%s: %s}", key, full, show(cur))
	}
}

// get reads the value at path, not through arrays' elements by name.
func get(cur any, path []string) (any, bool) {
	for _, key := range path {
		switch v := cur.(type) {
		case bson.D:
			x, ok := lookupD(v, key)
			if !ok {
				return nil, false
			}
			cur = x
		case bson.A:
			n, ok := arrayIndex(key)
			if !ok || n >= len(v) {
				return nil, false
			}
			cur = v[n]
		default:
			return nil, false
		}
	}
	return cur, true
}

func (o op) apply(root any, opts Options) (any, error) {
	switch o.name {
	case "$setOnInsert":
		if !opts.Insert {
			return root, nil
		}
		return walk(root, o.path, setTo(clone(o.arg)), true, o.dotted, o.af)
	case "$set":
		return walk(root, o.path, setTo(clone(o.arg)), true, o.dotted, o.af)
	case "$unset":
		return walk(root, o.path, func(any, bool) (any, action, error) { return nil, actRemove, nil }, false, o.dotted, o.af)
	case "$inc", "$mul":
		return walk(root, o.path, o.arithmetic, true, o.dotted, o.af)
	case "$min", "$max":
		return walk(root, o.path, o.minMax, true, o.dotted, o.af)
	case "$currentDate":
		return walk(root, o.path, setTo(currentDate(o.arg, opts.Now)), true, o.dotted, o.af)
	case "$rename":
		return o.rename(root)
	case "$push":
		return walk(root, o.path, o.push, true, o.dotted, o.af)
	case "$addToSet":
		return walk(root, o.path, o.addToSet, true, o.dotted, o.af)
	case "$pop":
		return walk(root, o.path, o.pop, false, o.dotted, o.af)
	case "$pull", "$pullAll":
		return walk(root, o.path, o.pull, false, o.dotted, o.af)
	case "$bit":
		return walk(root, o.path, o.bit, true, o.dotted, o.af)
	}
	return nil, mongoerr.Errorf(mongoerr.FailedToParse, "Unknown modifier: %s", o.name)
}

func setTo(v any) change {
	return func(any, bool) (any, action, error) { return v, actSet, nil }
}

func currentDate(arg any, now time.Time) any {
	if d, ok := arg.(bson.D); ok {
		if t, _ := lookupD(d, "$type"); t == "timestamp" {
			return bson.Timestamp{T: uint32(now.Unix()), I: 1}
		}
	}
	return bson.NewDateTimeFromTime(now)
}

func (o op) minMax(old any, exists bool) (any, action, error) {
	if !exists {
		return clone(o.arg), actSet, nil
	}
	c := compare(o.arg, old)
	if (o.name == "$min" && c < 0) || (o.name == "$max" && c > 0) {
		return clone(o.arg), actSet, nil
	}
	return nil, actNone, nil
}

func (o op) rename(root any) (any, error) {
	if err := throughArray(root, o.from, o.fromDotted, "source"); err != nil {
		return nil, err
	}
	if err := throughArray(root, o.path, o.dotted, "destination"); err != nil {
		return nil, err
	}
	v, ok := get(root, o.from)
	if !ok {
		return root, nil
	}
	root, err := walk(root, o.from, func(any, bool) (any, action, error) { return nil, actRemove, nil }, false, o.fromDotted, nil)
	if err != nil {
		return nil, err
	}
	return walk(root, o.path, setTo(v), true, o.dotted, o.af)
}

// throughArray refuses a $rename path that passes through an array, as
// MongoDB does.
func throughArray(root any, path []string, dotted, role string) error {
	cur := root
	for i, key := range path {
		if _, ok := cur.(bson.A); ok {
			return mongoerr.Errorf(mongoerr.BadValue, "The %s field cannot be an array element, '%s' in doc with %s", role, dotted, show(cur))
		}
		d, ok := cur.(bson.D)
		if !ok {
			return nil
		}
		x, ok := lookupD(d, key)
		if !ok {
			return nil
		}
		if _, isArr := x.(bson.A); isArr && i < len(path)-1 {
			return mongoerr.Errorf(mongoerr.BadValue, "The %s field cannot be an array element, '%s' in doc with %s", role, dotted, show(x))
		}
		cur = x
	}
	return nil
}

func (o op) bit(old any, exists bool) (any, action, error) {
	var acc int64
	wide := false
	switch n := old.(type) {
	case nil:
		if exists {
			return nil, actNone, o.nonInteger(old)
		}
	case int32:
		acc = int64(n)
	case int64:
		acc, wide = n, true
	default:
		return nil, actNone, o.nonInteger(old)
	}
	for _, e := range o.arg.(bson.D) {
		var m int64
		switch x := e.Value.(type) {
		case int32:
			m = int64(x)
		case int64:
			m, wide = x, true
		}
		switch e.Key {
		case "and":
			acc &= m
		case "or":
			acc |= m
		case "xor":
			acc ^= m
		}
	}
	if wide {
		return acc, actSet, nil
	}
	return int32(acc), actSet, nil
}

func (o op) nonInteger(old any) error {
	return mongoerr.Errorf(mongoerr.BadValue, "Cannot apply $bit to a value of non-integral type. The field '%s' is of type %s", o.dotted, typeName(old))
}

// notArray is MongoDB's error for an array operator on a field that is
// not an array.
func (o op) notArray(old any) error {
	return mongoerr.Errorf(mongoerr.BadValue, "The field '%s' must be an array but is of type %s in document", o.dotted, typeName(old))
}

// walkElements applies fn at the rest of path in each element of the
// array cur that the positional component selects: every element ($[]),
// or those the array filter of its identifier matches ($[<id>]).
func walkElements(cur any, path []string, fn change, create bool, full string, af arrayFilters, id string) (any, error) {
	arr, ok := cur.(bson.A)
	if !ok {
		return nil, mongoerr.Errorf(mongoerr.BadValue, "The path '%s' must exist in the document in order to apply array updates.", full)
	}
	match := func(any) bool { return true }
	if id != "" {
		match = af[id]
	}
	for i, e := range arr {
		if !match(e) {
			continue
		}
		if len(path) == 1 {
			nv, act, err := fn(e, true)
			if err != nil {
				return nil, err
			}
			switch act {
			case actSet:
				arr[i] = nv
			case actRemove:
				arr[i] = nil
			}
			continue
		}
		child, err := walk(e, path[1:], fn, create, full, af)
		if err != nil {
			return nil, err
		}
		arr[i] = child
	}
	return arr, nil
}
