package bsonutil

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/big"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// This file compares BSON values the way MongoDB's $min and $max update
// operators do (BSONElement::woCompare without a collation), so that the
// min/max the proxy computes in Go for a complete bucket are exactly what
// the upstream would compute for the same events pushed one by one.

// CanonicalOrder ranks BSON types as MongoDB's canonicalizeBSONType
// does: values of different types compare by this rank; all numeric types
// share one rank and compare by value.
func CanonicalOrder(t bsoncore.Type) int {
	switch t {
	case bsoncore.TypeMinKey:
		return -1
	case bsoncore.TypeUndefined:
		return 0
	case bsoncore.TypeNull:
		return 5
	case bsoncore.TypeDouble, bsoncore.TypeInt32, bsoncore.TypeInt64, bsoncore.TypeDecimal128:
		return 10
	case bsoncore.TypeString, bsoncore.TypeSymbol:
		return 15
	case bsoncore.TypeEmbeddedDocument:
		return 20
	case bsoncore.TypeArray:
		return 25
	case bsoncore.TypeBinary:
		return 30
	case bsoncore.TypeObjectID:
		return 35
	case bsoncore.TypeBoolean:
		return 40
	case bsoncore.TypeDateTime:
		return 45
	case bsoncore.TypeTimestamp:
		return 47
	case bsoncore.TypeRegex:
		return 50
	case bsoncore.TypeDBPointer:
		return 55
	case bsoncore.TypeJavaScript:
		return 60
	case bsoncore.TypeCodeWithScope:
		return 65
	case bsoncore.TypeMaxKey:
		return 127
	default:
		// Unknown type bytes never come from valid BSON; rank them after
		// everything so the comparison stays total and never panics.
		return 128
	}
}

// Compare returns -1, 0 or +1 as a sorts before, equal to, or after b
// in MongoDB's BSON comparison order: first by canonical type rank, then
// within a rank by value (numbers numerically across int32, int64, double
// and decimal128, with NaN below every other number; strings bytewise, as
// without a collation; documents and arrays element by element).
// Malformed values compare by their raw bytes instead of panicking.
func Compare(a, b bsoncore.Value) int {
	ra, rb := CanonicalOrder(a.Type), CanonicalOrder(b.Type)
	if ra != rb {
		return sign(ra - rb)
	}
	switch ra {
	case -1, 0, 5, 127: // MinKey, undefined, null, MaxKey: one value each
		return 0
	case 10:
		return compareNumbers(a, b)
	case 15:
		return compareStrings(a, b)
	case 20, 25:
		return compareDocuments(a.Data, b.Data)
	case 30:
		return compareBinary(a, b)
	case 40:
		return compareBooleans(a, b)
	case 45:
		return compareDates(a, b)
	case 47:
		return compareTimestamps(a, b)
	case 65:
		return compareCodeWithScope(a, b)
	default: // ObjectId, regex, DBPointer, code: bytewise is MongoDB's order
		return bytes.Compare(a.Data, b.Data)
	}
}

func sign[T int | int64 | float64](x T) int {
	switch {
	case x < 0:
		return -1
	case x > 0:
		return 1
	default:
		return 0
	}
}

func compareInt64s(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	default:
		return 0
	}
}

func compareStrings(a, b bsoncore.Value) int {
	sa, okA := readStringish(a)
	sb, okB := readStringish(b)
	if !okA || !okB {
		return bytes.Compare(a.Data, b.Data)
	}
	return bytes.Compare(sa, sb)
}

// readStringish reads a string or a symbol, which MongoDB compares alike,
// in place: sorts compare strings many times over.
func readStringish(v bsoncore.Value) ([]byte, bool) {
	if len(v.Data) < 5 {
		return nil, false
	}
	n := int64(int32(binary.LittleEndian.Uint32(v.Data)))
	if n < 1 || 4+n > int64(len(v.Data)) || v.Data[4+n-1] != 0 {
		return nil, false
	}
	return v.Data[4 : 4+n-1], true
}

// compareDocuments walks two documents (or arrays) element by element as
// BSONObj::woCompare does: canonical type rank, then field name, then
// value; a document that is a prefix of the other sorts first.
func compareDocuments(a, b []byte) int {
	ea, errA := bsoncore.Document(a).Elements()
	eb, errB := bsoncore.Document(b).Elements()
	if errA != nil || errB != nil {
		return bytes.Compare(a, b)
	}
	for i := 0; i < len(ea) && i < len(eb); i++ {
		va, vb := ea[i].Value(), eb[i].Value()
		if c := sign(CanonicalOrder(va.Type) - CanonicalOrder(vb.Type)); c != 0 {
			return c
		}
		if c := bytes.Compare(ea[i].KeyBytes(), eb[i].KeyBytes()); c != 0 {
			return c
		}
		if c := Compare(va, vb); c != 0 {
			return c
		}
	}
	return sign(len(ea) - len(eb))
}

// compareBinary orders BinData by length, then subtype, then bytes.
func compareBinary(a, b bsoncore.Value) int {
	sa, da, okA := a.BinaryOK()
	sb, db, okB := b.BinaryOK()
	if !okA || !okB {
		return bytes.Compare(a.Data, b.Data)
	}
	if c := sign(len(da) - len(db)); c != 0 {
		return c
	}
	if c := sign(int(sa) - int(sb)); c != 0 {
		return c
	}
	return bytes.Compare(da, db)
}

func compareBooleans(a, b bsoncore.Value) int {
	ba, okA := a.BooleanOK()
	bb, okB := b.BooleanOK()
	if !okA || !okB {
		return bytes.Compare(a.Data, b.Data)
	}
	return sign(boolInt(ba) - boolInt(bb))
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func compareDates(a, b bsoncore.Value) int {
	da, okA := a.DateTimeOK()
	db, okB := b.DateTimeOK()
	if !okA || !okB {
		return bytes.Compare(a.Data, b.Data)
	}
	return compareInt64s(da, db)
}

// compareTimestamps orders timestamps as unsigned (seconds, increment).
func compareTimestamps(a, b bsoncore.Value) int {
	ta, ia, okA := a.TimestampOK()
	tb, ib, okB := b.TimestampOK()
	if !okA || !okB {
		return bytes.Compare(a.Data, b.Data)
	}
	if ta != tb {
		return compareInt64s(int64(ta), int64(tb))
	}
	return compareInt64s(int64(ia), int64(ib))
}

func compareCodeWithScope(a, b bsoncore.Value) int {
	ca, sa, okA := a.CodeWithScopeOK()
	cb, sb, okB := b.CodeWithScopeOK()
	if !okA || !okB {
		return bytes.Compare(a.Data, b.Data)
	}
	if c := bytes.Compare([]byte(ca), []byte(cb)); c != 0 {
		return c
	}
	return compareDocuments(sa, sb)
}

// number is a BSON number classified for comparison: NaN, an infinity, or
// a finite value (kept as int64 or float64 when that is exact, else as a
// rational for decimal128).
type number struct {
	nan    bool
	inf    int // -1, 0, +1
	isInt  bool
	i      int64
	f      float64
	rat    *big.Rat // finite decimal128 only
	broken bool     // unreadable bytes
}

func readNumber(v bsoncore.Value) number {
	switch v.Type {
	case bsoncore.TypeInt32:
		i, ok := v.Int32OK()
		return number{isInt: true, i: int64(i), broken: !ok}
	case bsoncore.TypeInt64:
		i, ok := v.Int64OK()
		return number{isInt: true, i: i, broken: !ok}
	case bsoncore.TypeDouble:
		f, ok := v.DoubleOK()
		switch {
		case !ok:
			return number{broken: true}
		case math.IsNaN(f):
			return number{nan: true}
		case math.IsInf(f, 0):
			return number{inf: sign(f)}
		}
		return number{f: f}
	case bsoncore.TypeDecimal128:
		h, l, ok := v.Decimal128OK()
		if !ok {
			return number{broken: true}
		}
		return decimalNumber(bson.NewDecimal128(h, l))
	}
	return number{broken: true}
}

func decimalNumber(d bson.Decimal128) number {
	if d.IsNaN() {
		return number{nan: true}
	}
	if inf := d.IsInf(); inf != 0 {
		return number{inf: inf}
	}
	bi, exp, err := d.BigInt()
	if err != nil {
		return number{broken: true}
	}
	r := new(big.Rat).SetInt(bi)
	scale := new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(absInt(exp))), nil)
	if exp >= 0 {
		r.Mul(r, new(big.Rat).SetInt(scale))
	} else {
		r.Quo(r, new(big.Rat).SetInt(scale))
	}
	return number{rat: r}
}

func absInt(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// compareNumbers compares two BSON numbers numerically, exactly, across
// types; NaN equals NaN and sorts below every other number.
func compareNumbers(a, b bsoncore.Value) int {
	na, nb := readNumber(a), readNumber(b)
	if na.broken || nb.broken {
		return bytes.Compare(a.Data, b.Data)
	}
	switch {
	case na.nan || nb.nan:
		return boolInt(nb.nan) - boolInt(na.nan)
	case na.inf != 0 || nb.inf != 0:
		return sign(na.inf - nb.inf)
	case na.isInt && nb.isInt:
		return compareInt64s(na.i, nb.i)
	case na.rat == nil && nb.rat == nil && na.isInt:
		return compareInt64Float(na.i, nb.f)
	case na.rat == nil && nb.rat == nil && nb.isInt:
		return -compareInt64Float(nb.i, na.f)
	case na.rat == nil && nb.rat == nil:
		return sign(na.f - nb.f)
	}
	return na.toRat().Cmp(nb.toRat())
}

func (n number) toRat() *big.Rat {
	switch {
	case n.rat != nil:
		return n.rat
	case n.isInt:
		return new(big.Rat).SetInt64(n.i)
	default:
		return new(big.Rat).SetFloat64(n.f) // finite here
	}
}

// compareInt64Float compares an int64 with a finite float64 exactly
// (converting the int64 to float64 would round above 2^53).
func compareInt64Float(i int64, f float64) int {
	const twoTo63 = 9223372036854775808.0
	if f >= twoTo63 {
		return -1
	}
	if f < -twoTo63 {
		return 1
	}
	t := math.Trunc(f)
	if c := compareInt64s(i, int64(t)); c != 0 {
		return c
	}
	// Same integer part: the fractional part decides.
	return sign(t - f)
}
