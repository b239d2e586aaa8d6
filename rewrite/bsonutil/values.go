package bsonutil

import (
	"fmt"
	"strconv"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// MaxDepth bounds document nesting, like the server's own limit,
// so validation of hostile input cannot recurse without end.
const MaxDepth = 200

// Validate checks that doc, and every document, array and scope
// nested in it, is well-formed BSON. bsoncore's Validate checks only the
// outer layer; the rewrite reads and copies nested values, so it checks
// all of them once, up front.
func Validate(doc []byte, depth int) error {
	if depth > MaxDepth {
		return fmt.Errorf("nested deeper than %d levels", MaxDepth)
	}
	if err := bsoncore.Document(doc).Validate(); err != nil {
		return err
	}
	// Walked without Elements(), which allocates a slice per document:
	// this runs on every event of every bucketed insert.
	rem := doc[4 : len(doc)-1] // Validate checked the length and terminator
	for len(rem) > 0 {
		e, rest, ok := bsoncore.ReadElement(rem)
		if !ok {
			return bsoncore.ErrElementMissingKey
		}
		rem = rest
		if err := validateNestedValue(e.Value(), depth); err != nil {
			return fmt.Errorf("field %q: %w", e.Key(), err)
		}
	}
	return nil
}

func validateNestedValue(v bsoncore.Value, depth int) error {
	switch v.Type {
	case bsoncore.TypeEmbeddedDocument, bsoncore.TypeArray:
		return Validate(v.Data, depth+1)
	case bsoncore.TypeCodeWithScope:
		_, scope, ok := v.CodeWithScopeOK()
		if !ok {
			return fmt.Errorf("malformed code with scope")
		}
		return Validate(scope, depth+1)
	}
	return nil
}

// Lookup returns the first top-level field named key, without
// descending into dotted paths (bsoncore's Lookup would not either, but
// this says so and never panics on a malformed document).
func Lookup(doc bsoncore.Document, key string) (bsoncore.Value, bool) {
	v, err := doc.LookupErr(key)
	if err != nil {
		return bsoncore.Value{}, false
	}
	return v, true
}

// Bool reads an optional boolean argument such as "ordered". Like
// the server, it accepts numbers as booleans (non-zero is true).
func Bool(body bsoncore.Document, key string, def bool) (bool, error) {
	v, ok := Lookup(body, key)
	if !ok {
		return def, nil
	}
	if b, ok := v.BooleanOK(); ok {
		return b, nil
	}
	if v.IsNumber() {
		f, ok := v.AsFloat64OK()
		return ok && f != 0, nil
	}
	return false, mongoerr.Errorf(mongoerr.TypeMismatch, "field %q must be a boolean, got %s", key, TypeName(v.Type))
}

func Pick(body bsoncore.Document, keys []string) []bsoncore.Element {
	elems, _ := body.Elements()
	var out []bsoncore.Element
	for _, key := range keys {
		for _, e := range elems {
			if e.Key() == key {
				out = append(out, e)
				break
			}
		}
	}
	return out
}

// ReplaceField copies d with each element named key written by put
// instead, in its place; d without key is copied as it is.
func ReplaceField(d bsoncore.Document, key string, put func(dst []byte) []byte) bsoncore.Document {
	elems, _ := d.Elements()
	idx, out := bsoncore.AppendDocumentStart(nil)
	for _, e := range elems {
		if e.Key() == key {
			out = put(out)
			continue
		}
		out = append(out, e...)
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return out
}

// TypeName is MongoDB's alias for a BSON type, as $type and error
// messages spell it.
func TypeName(t bsoncore.Type) string {
	switch t {
	case bsoncore.TypeDouble:
		return "double"
	case bsoncore.TypeString:
		return "string"
	case bsoncore.TypeEmbeddedDocument:
		return "object"
	case bsoncore.TypeArray:
		return "array"
	case bsoncore.TypeBinary:
		return "binData"
	case bsoncore.TypeUndefined:
		return "undefined"
	case bsoncore.TypeObjectID:
		return "objectId"
	case bsoncore.TypeBoolean:
		return "bool"
	case bsoncore.TypeDateTime:
		return "date"
	case bsoncore.TypeNull:
		return "null"
	case bsoncore.TypeRegex:
		return "regex"
	case bsoncore.TypeDBPointer:
		return "dbPointer"
	case bsoncore.TypeJavaScript:
		return "javascript"
	case bsoncore.TypeSymbol:
		return "symbol"
	case bsoncore.TypeCodeWithScope:
		return "javascriptWithScope"
	case bsoncore.TypeInt32:
		return "int"
	case bsoncore.TypeTimestamp:
		return "timestamp"
	case bsoncore.TypeInt64:
		return "long"
	case bsoncore.TypeDecimal128:
		return "decimal"
	case bsoncore.TypeMinKey:
		return "minKey"
	case bsoncore.TypeMaxKey:
		return "maxKey"
	}
	return fmt.Sprintf("type 0x%02x", byte(t))
}

func IsNumber(t bsoncore.Type) bool {
	switch t {
	case bsoncore.TypeInt32, bsoncore.TypeInt64, bsoncore.TypeDouble, bsoncore.TypeDecimal128:
		return true
	}
	return false
}

// Stage builders
func Stage(name string, v bsoncore.Value) bsoncore.Document {
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendValueElement(d, name, v)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

func DocValue(d bsoncore.Document) bsoncore.Value {
	return bsoncore.Value{Type: bsoncore.TypeEmbeddedDocument, Data: d}
}

func Int64Value(n int64) bsoncore.Value {
	return bsoncore.Value{Type: bsoncore.TypeInt64, Data: bsoncore.AppendInt64(nil, n)}
}

func StringValue(s string) bsoncore.Value {
	return bsoncore.Value{Type: bsoncore.TypeString, Data: bsoncore.AppendString(nil, s)}
}

func AppendElems(dst []byte, elems []bsoncore.Element) []byte {
	for _, e := range elems {
		dst = append(dst, e...)
	}
	return dst
}

var smallInts = func() []string {
	s := make([]string, 1024)
	for i := range s {
		s[i] = itoaSlow(i)
	}
	return s
}()

func Itoa(i int) string {
	if i >= 0 && i < len(smallInts) {
		return smallInts[i]
	}
	return itoaSlow(i)
}

func itoaSlow(i int) string { return strconv.Itoa(i) }
