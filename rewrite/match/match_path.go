package match

import (
	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// This file is how a compiled filter reaches the values of a dotted path,
// following MongoDB's path iterator (src/mongo/db/matcher/path.cpp,
// BSONElementIterator):
//
//   - The path is followed through documents (the first field of a name)
//     until it ends, fails (a missing field is one value: missing), or
//     reaches an array.
//   - An array with path left over: each element that is a document is
//     searched for the rest of the path; an element whose index equals the
//     next path component (all digits, "a.0.b") is also taken as the value
//     there when that component ends the path, or searched for the rest
//     when it is a document or an array. Other elements give nothing (an
//     array directly inside an array is not entered without an index).
//   - An array at the end of the path: each element, then the array itself
//     (most operators), or only the array itself ($size, $elemMatch).
//
// A test of a single value ("one": MongoDB's matchesSingleElement) holds
// for the path when it holds for any value the path yields; $ne, $nin,
// $not and {$exists: false} are the negations of that.

// matcher is a compiled field test.
type matcher interface {
	// one tests a single value (zero: missing), as $elemMatch's value
	// form applies the test to each element.
	one(v bsoncore.Value) bool
	// path tests the values path reaches in doc.
	path(doc bsoncore.Document, path []string) bool
}

// leafMatcher holds for a path when its test holds for a value the path
// yields.
type leafMatcher struct {
	test valuePred
	// wholeArrays: a leaf array is tested as a whole only, not element
	// by element ($size, $elemMatch).
	wholeArrays bool
}

func leaf(test valuePred) leafMatcher      { return leafMatcher{test: test} }
func arrayLeaf(test valuePred) leafMatcher { return leafMatcher{test: test, wholeArrays: true} }

func (m leafMatcher) one(v bsoncore.Value) bool { return m.test(v) }
func (m leafMatcher) path(doc bsoncore.Document, path []string) bool {
	return walkPath(doc, path, !m.wholeArrays, m.test, 0)
}

func eqMatcher(arg bsoncore.Value) leafMatcher {
	return leaf(func(v bsoncore.Value) bool { return ValuesEqual(v, arg) })
}

type notMatcher struct{ m matcher }

func (n notMatcher) one(v bsoncore.Value) bool { return !n.m.one(v) }
func (n notMatcher) path(doc bsoncore.Document, path []string) bool {
	return !n.m.path(doc, path)
}

type andMatcher []matcher

func (a andMatcher) one(v bsoncore.Value) bool {
	for _, m := range a {
		if !m.one(v) {
			return false
		}
	}
	return true
}

func (a andMatcher) path(doc bsoncore.Document, path []string) bool {
	for _, m := range a {
		if !m.path(doc, path) {
			return false
		}
	}
	return true
}

type constMatcher bool

func (c constMatcher) one(bsoncore.Value) bool               { return bool(c) }
func (c constMatcher) path(bsoncore.Document, []string) bool { return bool(c) }

// walkPath calls f on each value path reaches in doc, until f returns
// true; it reports whether f did. leafArrays: a leaf array yields its
// elements before itself.
func walkPath(doc bsoncore.Document, path []string, leafArrays bool, f valuePred, depth int) bool {
	if depth > bsonutil.MaxDepth || len(path) == 0 {
		return false
	}
	v, i := dottedOrArray(doc, path)
	if v.Type != bsoncore.TypeArray {
		return f(v)
	}
	return walkArray(v, path[i+1:], leafArrays, f, depth+1)
}

// dottedOrArray follows path through documents: it returns the value at
// its end (zero when missing), or the first array on the way with the
// index of the component that named it (MongoDB's getFieldDottedOrArray).
func dottedOrArray(doc bsoncore.Document, path []string) (bsoncore.Value, int) {
	cur := doc
	for i, part := range path {
		v, ok := field(cur, part)
		if !ok {
			return bsoncore.Value{}, i
		}
		switch v.Type {
		case bsoncore.TypeArray:
			return v, i
		case bsoncore.TypeEmbeddedDocument:
			d, ok := v.DocumentOK()
			if !ok {
				return bsoncore.Value{}, i
			}
			if i == len(path)-1 {
				return v, i
			}
			cur = d
		default:
			if i < len(path)-1 {
				return bsoncore.Value{}, i
			}
			return v, i
		}
	}
	return bsoncore.Value{}, len(path)
}

// field is the first field named key of doc (malformed bytes end the
// search).
func field(doc bsoncore.Document, key string) (bsoncore.Value, bool) {
	elems, _ := doc.Elements()
	for _, e := range elems {
		if e.Key() == key {
			return e.Value(), true
		}
	}
	return bsoncore.Value{}, false
}

// walkArray yields the values rest reaches from arr, an array value.
func walkArray(arr bsoncore.Value, rest []string, leafArrays bool, f valuePred, depth int) bool {
	if depth > bsonutil.MaxDepth {
		return false
	}
	a, ok := arr.ArrayOK()
	if !ok {
		return false
	}
	elems, _ := bsoncore.Document(a).Elements()
	if len(rest) == 0 {
		if !leafArrays {
			return f(arr)
		}
		for _, e := range elems {
			if f(e.Value()) {
				return true
			}
		}
		return f(arr)
	}
	index := allDigits(rest[0])
	for _, e := range elems {
		ev := e.Value()
		offset := index && e.Key() == rest[0]
		if ev.Type == bsoncore.TypeEmbeddedDocument {
			d, ok := ev.DocumentOK()
			if !ok {
				continue
			}
			if walkPath(d, rest, leafArrays, f, depth+1) {
				return true
			}
			if offset {
				if len(rest) == 1 {
					if f(ev) {
						return true
					}
				} else if walkPath(d, rest[1:], leafArrays, f, depth+1) {
					return true
				}
			}
			continue
		}
		if !offset {
			continue
		}
		if len(rest) == 1 {
			if f(ev) {
				return true
			}
			continue
		}
		if ev.Type == bsoncore.TypeArray && walkArray(ev, rest[1:], leafArrays, f, depth+1) {
			return true
		}
	}
	return false
}

func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
