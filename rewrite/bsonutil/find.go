package bsonutil

import (
	"math"
	"strconv"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// FindValue returns the dotted path of the first value in doc, at any
// depth (array elements by index), for which match is true. Malformed
// parts and what lies deeper than MaxDepth are not searched.
func FindValue(doc bsoncore.Document, match func(bsoncore.Value) bool) (string, bool) {
	return findIn(doc, "", match, 0)
}

func findIn(doc bsoncore.Document, prefix string, match func(bsoncore.Value) bool, depth int) (string, bool) {
	if depth > MaxDepth {
		return "", false
	}
	elems, err := doc.Elements()
	if err != nil {
		return "", false
	}
	for _, e := range elems {
		v, err := e.ValueErr()
		if err != nil {
			return "", false
		}
		path := e.Key()
		if prefix != "" {
			path = prefix + "." + path
		}
		if match(v) {
			return path, true
		}
		var sub bsoncore.Document
		switch v.Type {
		case bsoncore.TypeEmbeddedDocument:
			sub, _ = v.DocumentOK()
		case bsoncore.TypeArray:
			a, _ := v.ArrayOK()
			sub = bsoncore.Document(a)
		}
		if sub != nil {
			if p, ok := findIn(sub, path, match, depth+1); ok {
				return p, true
			}
		}
	}
	return "", false
}

// IsNaNOrDecimal is true of a double NaN and of any Decimal128: values
// FerretDB 1.x cannot take in a message at all.
func IsNaNOrDecimal(v bsoncore.Value) bool {
	switch v.Type {
	case bsoncore.TypeDouble:
		f, ok := v.DoubleOK()
		return ok && math.IsNaN(f)
	case bsoncore.TypeDecimal128:
		return true
	}
	return false
}

// IndexPath is the path of the i-th document of a sequence or array
// named name.
func IndexPath(name string, i int) string { return name + "." + strconv.Itoa(i) }
