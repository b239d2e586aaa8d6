package value

import (
	"math"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
)

// Value is a BSON value; the zero Value is a missing field.
type Value = bsoncore.Value

var (
	Missing = Value{}
	Null    = Value{Type: bsoncore.TypeNull}
)

func IsNullish(v Value) bool {
	return v.Type == 0 || v.Type == bsoncore.TypeNull || v.Type == bsoncore.TypeUndefined
}

func Int32Value(i int32) Value {
	return Value{Type: bsoncore.TypeInt32, Data: bsoncore.AppendInt32(nil, i)}
}
func Int64Value(i int64) Value {
	return Value{Type: bsoncore.TypeInt64, Data: bsoncore.AppendInt64(nil, i)}
}
func DoubleValue(f float64) Value {
	return Value{Type: bsoncore.TypeDouble, Data: bsoncore.AppendDouble(nil, f)}
}
func BoolValue(b bool) Value {
	return Value{Type: bsoncore.TypeBoolean, Data: bsoncore.AppendBoolean(nil, b)}
}
func StringValue(s string) Value {
	return Value{Type: bsoncore.TypeString, Data: bsoncore.AppendString(nil, s)}
}
func DateValue(ms int64) Value {
	return Value{Type: bsoncore.TypeDateTime, Data: bsoncore.AppendDateTime(nil, ms)}
}

// IntValue is n as the narrowest of int32 and int64 that holds it.
func IntValue(n int64) Value {
	if n >= math.MinInt32 && n <= math.MaxInt32 {
		return Int32Value(int32(n))
	}
	return Int64Value(n)
}

// NumKind orders the numeric types by how MongoDB widens them.
type NumKind int

const (
	KindInt32 NumKind = iota + 1
	KindInt64
	KindDouble
	KindDecimal
)

// Number reads v as a number: its kind, and its value as an int64 (for
// int32 and int64) and as a float64.
func Number(v Value) (k NumKind, i int64, f float64, ok bool) {
	switch v.Type {
	case bsoncore.TypeInt32:
		n := v.Int32()
		return KindInt32, int64(n), float64(n), true
	case bsoncore.TypeInt64:
		n := v.Int64()
		return KindInt64, n, float64(n), true
	case bsoncore.TypeDouble:
		d := v.Double()
		return KindDouble, 0, d, true
	case bsoncore.TypeDecimal128:
		return KindDecimal, 0, 0, true
	}
	return 0, 0, 0, false
}

// Truthy is MongoDB's coercion to boolean: false, null, missing,
// undefined and numeric zero are false; everything else is true.
func Truthy(v Value) bool {
	switch v.Type {
	case 0, bsoncore.TypeNull, bsoncore.TypeUndefined:
		return false
	case bsoncore.TypeBoolean:
		return v.Boolean()
	case bsoncore.TypeInt32, bsoncore.TypeInt64, bsoncore.TypeDouble:
		_, i, f, _ := Number(v)
		return i != 0 || f != 0
	}
	return true
}

// Compare orders values as MongoDB's aggregation does: a missing value
// before every other, then bsonutil.Compare's BSON order.
func Compare(a, b Value) int {
	switch {
	case a.Type == 0 && b.Type == 0:
		return 0
	case a.Type == 0:
		return -1
	case b.Type == 0:
		return 1
	}
	return bsonutil.Compare(a, b)
}

// CanonicalRank is the BSON type class of v (numbers are one class).
func CanonicalRank(v Value) int { return bsonutil.CanonicalOrder(v.Type) }

// GroupKey is the map key of a value as $group and $addToSet tell values
// apart: numbers by value (1, 1.0 and NumberLong(1) are one group), every
// other value by type and bytes, documents and arrays element by element.
func GroupKey(dst []byte, v Value) []byte {
	switch v.Type {
	case bsoncore.TypeInt32, bsoncore.TypeInt64, bsoncore.TypeDouble:
		_, i, f, _ := Number(v)
		if v.Type == bsoncore.TypeDouble {
			if f == math.Trunc(f) && math.Abs(f) < 1<<63 {
				i = int64(f)
			} else {
				dst = append(dst, 'd')
				return bsoncore.AppendDouble(dst, f)
			}
		}
		dst = append(dst, 'n')
		return bsoncore.AppendInt64(dst, i)
	case 0, bsoncore.TypeNull, bsoncore.TypeUndefined:
		// $group puts missing and null _ids in one group.
		return append(dst, 'z')
	case bsoncore.TypeEmbeddedDocument, bsoncore.TypeArray:
		dst = append(dst, byte(v.Type))
		elems, _ := bsoncore.Document(v.Data).Elements()
		for _, e := range elems {
			if v.Type == bsoncore.TypeEmbeddedDocument {
				dst = append(dst, e.Key()...)
			}
			dst = append(dst, 0)
			dst = GroupKey(dst, e.Value())
		}
		return append(dst, 0xff)
	}
	dst = append(dst, byte(v.Type))
	return append(dst, v.Data...)
}

// Clone copies v's bytes: values taken from an event outlive its buffer.
func Clone(v Value) Value {
	return Value{Type: v.Type, Data: append([]byte(nil), v.Data...)}
}

// Describe is v as a message shows it: MISSING, or its extended JSON.
func Describe(v Value) string {
	if v.Type == 0 {
		return "MISSING"
	}
	return v.String()
}
