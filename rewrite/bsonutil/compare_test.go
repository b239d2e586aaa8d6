package bsonutil

import (
	"math"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// val makes a bsoncore.Value from a Go value via the driver's marshaller.
func val(t testing.TB, v any) bsoncore.Value {
	t.Helper()
	doc, err := bson.Marshal(bson.D{{Key: "v", Value: v}})
	if err != nil {
		t.Fatal(err)
	}
	return bsoncore.Document(doc).Lookup("v")
}

func TestCompareValues(t *testing.T) {
	dec := func(s string) bson.Decimal128 {
		d, err := bson.ParseDecimal128(s)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	oidA := bson.ObjectID{1}
	oidB := bson.ObjectID{2}
	tests := []struct {
		name string
		a, b any
		want int
	}{
		{"int32 equal", int32(1), int32(1), 0},
		{"int32 less", int32(1), int32(2), -1},
		{"int32 vs int64 equal", int32(5), int64(5), 0},
		{"int32 vs double equal", int32(5), 5.0, 0},
		{"int64 vs double fraction", int64(5), 5.5, -1},
		{"negative int64 vs double fraction", int64(-5), -5.5, 1},
		{"int64 above 2^53 vs double", int64(1<<53 + 1), float64(1 << 53), 1},
		{"int64 max vs 2^63 double", int64(math.MaxInt64), 9223372036854775808.0, -1},
		{"int64 min vs -2^63 double", int64(math.MinInt64), -9223372036854775808.0, 0},
		{"NaN below every number", math.NaN(), math.Inf(-1), -1},
		{"NaN equals NaN", math.NaN(), math.NaN(), 0},
		{"-inf below int64 min", math.Inf(-1), int64(math.MinInt64), -1},
		{"+inf above int64 max", math.Inf(1), int64(math.MaxInt64), 1},
		{"-0 equals 0", math.Copysign(0, -1), int32(0), 0},
		{"decimal vs double", dec("1.25"), 1.5, -1},
		{"decimal vs int exact", dec("3.000"), int32(3), 0},
		{"decimal NaN below numbers", dec("NaN"), int32(-100), -1},
		{"decimal large", dec("1E+30"), math.Inf(1), -1},
		{"minKey lowest", bson.MinKey{}, nil, -1},
		{"undefined below null", bson.Undefined{}, nil, -1},
		{"null below numbers", nil, int32(-1), -1},
		{"numbers below strings", 1e300, "", -1},
		{"strings bytewise", "B", "a", -1},
		{"string prefix first", "ab", "abc", -1},
		{"symbol equals string", bson.Symbol("x"), "x", 0},
		{"strings below documents", "zzz", bson.D{}, -1},
		{"documents below arrays", bson.D{{Key: "a", Value: int32(1)}}, bson.A{}, -1},
		{"document by value", bson.D{{Key: "a", Value: int32(1)}}, bson.D{{Key: "a", Value: 2.0}}, -1},
		{"document numeric equality", bson.D{{Key: "a", Value: int32(1)}}, bson.D{{Key: "a", Value: 1.0}}, 0},
		{"document by field name", bson.D{{Key: "a", Value: int32(9)}}, bson.D{{Key: "b", Value: int32(1)}}, -1},
		{"document by value type first", bson.D{{Key: "b", Value: int32(9)}}, bson.D{{Key: "a", Value: "s"}}, -1},
		{"document prefix first", bson.D{{Key: "a", Value: int32(1)}}, bson.D{{Key: "a", Value: int32(1)}, {Key: "b", Value: nil}}, -1},
		{"arrays element-wise", bson.A{int32(1), int32(2)}, bson.A{int32(1), int32(3)}, -1},
		{"arrays below binary", bson.A{}, bson.Binary{}, -1},
		{"binary by length first", bson.Binary{Subtype: 0, Data: []byte{9}}, bson.Binary{Subtype: 0, Data: []byte{1, 1}}, -1},
		{"binary by subtype", bson.Binary{Subtype: 5, Data: []byte{1}}, bson.Binary{Subtype: 0, Data: []byte{2}}, 1},
		{"binary below objectId", bson.Binary{}, oidA, -1},
		{"objectIds bytewise", oidA, oidB, -1},
		{"objectId below bool", oidB, false, -1},
		{"false below true", false, true, -1},
		{"bool below date", true, bson.DateTime(math.MinInt64), -1},
		{"dates signed", bson.DateTime(-1), bson.DateTime(0), -1},
		{"date below timestamp", bson.DateTime(math.MaxInt64), bson.Timestamp{}, -1},
		{"timestamps unsigned", bson.Timestamp{T: 1, I: 9}, bson.Timestamp{T: 0x80000000, I: 0}, -1},
		{"timestamp below regex", bson.Timestamp{T: math.MaxUint32}, bson.Regex{Pattern: "a"}, -1},
		{"regex below dbpointer", bson.Regex{Pattern: "z"}, bson.DBPointer{DB: "a", Pointer: oidA}, -1},
		{"dbpointer below code", bson.DBPointer{DB: "z", Pointer: oidA}, bson.JavaScript("a"), -1},
		{"code below code with scope", bson.JavaScript("z"), bson.CodeWithScope{Code: "a", Scope: bson.D{}}, -1},
		{"code with scope by scope", bson.CodeWithScope{Code: "a", Scope: bson.D{{Key: "x", Value: int32(1)}}}, bson.CodeWithScope{Code: "a", Scope: bson.D{{Key: "x", Value: int32(2)}}}, -1},
		{"maxKey highest", bson.CodeWithScope{Code: "z", Scope: bson.D{}}, bson.MaxKey{}, -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, b := val(t, tc.a), val(t, tc.b)
			if got := Compare(a, b); got != tc.want {
				t.Errorf("CompareValues(%s, %s) = %d, want %d", a, b, got, tc.want)
			}
			if got := Compare(b, a); got != -tc.want {
				t.Errorf("CompareValues(%s, %s) = %d, want %d (antisymmetry)", b, a, got, -tc.want)
			}
		})
	}
}

func TestCompareValuesMalformedDoesNotPanic(t *testing.T) {
	bad := []bsoncore.Value{
		{Type: bsoncore.TypeInt32, Data: []byte{1}},
		{Type: bsoncore.TypeDouble},
		{Type: bsoncore.TypeEmbeddedDocument, Data: []byte{5, 0, 0}},
		{Type: bsoncore.TypeString, Data: []byte{9, 0, 0, 0, 'a'}},
		{Type: bsoncore.TypeString, Data: []byte{2, 0, 0, 0, 'a', 'b'}},      // no NUL where the length says
		{Type: bsoncore.TypeString, Data: []byte{0, 0, 0, 0, 0}},             // length 0
		{Type: bsoncore.TypeString, Data: []byte{0xff, 0xff, 0xff, 0xff, 0}}, // negative length
		{Type: bsoncore.TypeDecimal128, Data: []byte{1, 2}},
		{Type: bsoncore.TypeCodeWithScope, Data: []byte{1}},
		{Type: 0x77, Data: []byte{1}},
	}
	for _, a := range bad {
		for _, b := range bad {
			_ = Compare(a, b)
		}
	}
	if got := Compare(bad[0], bad[0]); got != 0 {
		t.Errorf("malformed value compared with itself = %d, want 0", got)
	}
}

// TestCompareStringsInPlace: strings compare by their bytes without the
// length or NUL, whatever the bytes after them.
func TestCompareStringsInPlace(t *testing.T) {
	str := func(s string, tail ...byte) bsoncore.Value {
		return bsoncore.Value{Type: bsoncore.TypeString, Data: append(bsoncore.AppendString(nil, s), tail...)}
	}
	sym := bsoncore.Value{Type: bsoncore.TypeSymbol, Data: bsoncore.AppendString(nil, "b")}
	cases := []struct {
		a, b bsoncore.Value
		want int
	}{
		{str("a"), str("a"), 0},
		{str("a"), str("a", 'z', 'z'), 0},
		{str(""), str("a"), -1},
		{str("ab"), str("a"), 1},
		{str("b"), sym, 0},
		{str("c"), sym, 1},
	}
	for i, c := range cases {
		if got := Compare(c.a, c.b); got != c.want {
			t.Errorf("case %d: %d, want %d", i, got, c.want)
		}
	}
}

func TestTypeName(t *testing.T) {
	want := map[bsoncore.Type]string{
		bsoncore.TypeDouble: "double", bsoncore.TypeString: "string", bsoncore.TypeEmbeddedDocument: "object",
		bsoncore.TypeArray: "array", bsoncore.TypeBinary: "binData", bsoncore.TypeUndefined: "undefined",
		bsoncore.TypeObjectID: "objectId", bsoncore.TypeBoolean: "bool", bsoncore.TypeDateTime: "date",
		bsoncore.TypeNull: "null", bsoncore.TypeRegex: "regex", bsoncore.TypeDBPointer: "dbPointer",
		bsoncore.TypeJavaScript: "javascript", bsoncore.TypeSymbol: "symbol", bsoncore.TypeCodeWithScope: "javascriptWithScope",
		bsoncore.TypeInt32: "int", bsoncore.TypeTimestamp: "timestamp", bsoncore.TypeInt64: "long",
		bsoncore.TypeDecimal128: "decimal", bsoncore.TypeMinKey: "minKey", bsoncore.TypeMaxKey: "maxKey",
		bsoncore.Type(0x42): "type 0x42",
	}
	for typ, name := range want {
		if got := TypeName(typ); got != name {
			t.Errorf("typeName(0x%02x) = %q, want %q", byte(typ), got, name)
		}
	}
}

// BenchmarkCompareStrings: a sort compares strings many times; reading
// them in place makes no garbage.
func BenchmarkCompareStrings(b *testing.B) {
	x := bsoncore.Value{Type: bsoncore.TypeString, Data: bsoncore.AppendString(nil, "host-042.example.com")}
	y := bsoncore.Value{Type: bsoncore.TypeString, Data: bsoncore.AppendString(nil, "host-043.example.com")}
	b.ReportAllocs()
	for b.Loop() {
		if Compare(x, y) != -1 {
			b.Fatal("order")
		}
	}
}
