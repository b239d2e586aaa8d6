package bsonutil

import (
	"fmt"
	"strconv"

	"github.com/tsproxy/tsproxy/wire"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// MaxDepth bounds the recursion of code that walks documents: the wire
// package's limit, which every document has passed before it gets here.
const MaxDepth = wire.MaxDepth

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
	// One pass over body, with no slice of all its elements: every command
	// the proxy rewrites runs this, most with few of keys present.
	var found []bsoncore.Element // found[i] is keys[i]'s first element
	_ = EachElement(body, func(e bsoncore.Element) error {
		k := e.KeyBytes()
		for i, key := range keys {
			if string(k) != key {
				continue
			}
			if found == nil {
				found = make([]bsoncore.Element, len(keys))
			}
			if found[i] == nil {
				found[i] = e
			}
		}
		return nil
	})
	out := found[:0] // nil when no key was found
	for _, e := range found {
		if e != nil {
			out = append(out, e)
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

// AppendField copies d with key: v added as its last element (d must be
// a valid document).
func AppendField(d bsoncore.Document, key string, v bsoncore.Value) bsoncore.Document {
	out := make([]byte, 0, len(d)+len(key)+len(v.Data)+2)
	out = append(out, d[:len(d)-1]...)
	out = bsoncore.AppendValueElement(out, key, v)
	out = append(out, 0)
	return bsoncore.UpdateLength(out, 0, int32(len(out)))
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

// WholeNumber reads v as an integer: an int32, an int64, or a double
// holding a whole number within the int64 range (how MongoDB reads
// $skip, $limit and other counts).
func WholeNumber(v bsoncore.Value) (int64, bool) {
	switch v.Type {
	case bsoncore.TypeInt32:
		return int64(v.Int32()), true
	case bsoncore.TypeInt64:
		return v.Int64(), true
	case bsoncore.TypeDouble:
		f := v.Double()
		if f == float64(int64(f)) && f > -9.2e18 && f < 9.2e18 {
			return int64(f), true
		}
	}
	return 0, false
}

// EachElement calls f with each element of b (a document or an array:
// the same layout), in order, without making a slice of them.
func EachElement(b []byte, f func(bsoncore.Element) error) error {
	if len(b) < 5 {
		return bsoncore.ErrMissingNull
	}
	rem := b[4 : len(b)-1]
	for len(rem) > 0 {
		elem, rest, ok := bsoncore.ReadElement(rem)
		if !ok {
			return bsoncore.ErrElementMissingKey
		}
		rem = rest
		if err := f(elem); err != nil {
			return err
		}
	}
	return nil
}
