package match

import (
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// The operators with operands of their own: $type, $mod and the bit
// tests.

// typeAliases are $type's names of BSON types, bsonutil.TypeName's
// ("number" is every numeric type).
var typeAliases = func() map[string][]bsoncore.Type {
	m := map[string][]bsoncore.Type{}
	for b := 0; b < 256; b++ {
		t := bsoncore.Type(b)
		if name := bsonutil.TypeName(t); !strings.HasPrefix(name, "type 0x") {
			m[name] = []bsoncore.Type{t}
		}
		if bsonutil.IsNumber(t) {
			m["number"] = append(m["number"], t)
		}
	}
	return m
}()

// typeOperator compiles $type: a type number, an alias, or an array of
// them. A leaf array is tested itself as well as element by element, so
// {$type: "array"} matches a field that holds an array (MongoDB 3.6+).
func (fc *Compiler) typeOperator(field string, arg bsoncore.Value) (matcher, error) {
	var set [256]bool
	add := func(v bsoncore.Value) error {
		switch {
		case v.Type == bsoncore.TypeString:
			s, _ := v.StringValueOK()
			ts, ok := typeAliases[s]
			if !ok {
				return mongoerr.Errorf(mongoerr.BadValue, "Unknown type name alias: %s", s)
			}
			for _, t := range ts {
				set[t] = true
			}
			return nil
		case v.IsNumber():
			i, whole, ok := truncInt64(v)
			if !ok || !whole {
				return mongoerr.Errorf(mongoerr.BadValue, "Invalid numerical type code: %s", showValue(v))
			}
			switch {
			case i == -1:
				set[bsoncore.TypeMinKey] = true
			case i == 127:
				set[bsoncore.TypeMaxKey] = true
			case i >= 1 && i <= 19:
				set[i] = true
			default:
				return mongoerr.Errorf(mongoerr.BadValue, "Invalid numerical type code: %s", showValue(v))
			}
			return nil
		}
		return mongoerr.Errorf(mongoerr.TypeMismatch, "type must be represented as a number or a string")
	}
	if arg.Type == bsoncore.TypeArray {
		arr, _ := arg.ArrayOK()
		vals, err := arr.Values()
		if err != nil {
			return nil, mongoerr.Errorf(mongoerr.BadValue, "filter is not valid BSON: %v", err)
		}
		if len(vals) == 0 {
			return nil, mongoerr.Errorf(mongoerr.FailedToParse, "%s must match at least one type", field)
		}
		for _, v := range vals {
			if err := add(v); err != nil {
				return nil, err
			}
		}
	} else if err := add(arg); err != nil {
		return nil, err
	}
	return leaf(func(v bsoncore.Value) bool { return v.Type != 0 && set[v.Type] }), nil
}

// mod compiles {$mod: [divisor, remainder]}: integers (doubles and
// decimals truncated toward zero), the remainder of C's truncated
// division.
func (fc *Compiler) mod(arg bsoncore.Value) (matcher, error) {
	if arg.Type != bsoncore.TypeArray {
		return nil, mongoerr.Errorf(mongoerr.BadValue, "malformed mod, needs to be an array")
	}
	arr, _ := arg.ArrayOK()
	vals, err := arr.Values()
	if err != nil {
		return nil, mongoerr.Errorf(mongoerr.BadValue, "filter is not valid BSON: %v", err)
	}
	switch {
	case len(vals) < 1:
		return nil, mongoerr.Errorf(mongoerr.BadValue, "malformed mod, not enough elements")
	case !vals[0].IsNumber():
		return nil, mongoerr.Errorf(mongoerr.BadValue, "malformed mod, divisor not a number")
	case len(vals) < 2:
		return nil, mongoerr.Errorf(mongoerr.BadValue, "malformed mod, not enough elements")
	case !vals[1].IsNumber():
		return nil, mongoerr.Errorf(mongoerr.BadValue, "malformed mod, remainder not a number")
	case len(vals) > 2:
		return nil, mongoerr.Errorf(mongoerr.BadValue, "malformed mod, too many elements")
	}
	div, why := coerceInt64(vals[0])
	if why != "" {
		return nil, mongoerr.Errorf(mongoerr.BadValue, "malformed mod, divisor value is invalid :: caused by :: %s", why)
	}
	rem, why := coerceInt64(vals[1])
	if why != "" {
		return nil, mongoerr.Errorf(mongoerr.BadValue, "malformed mod, remainder value is invalid :: caused by :: %s", why)
	}
	if div == 0 {
		return nil, mongoerr.Errorf(mongoerr.BadValue, "divisor cannot be 0")
	}
	return leaf(func(v bsoncore.Value) bool {
		if !v.IsNumber() {
			return false
		}
		x, _, ok := truncInt64(v)
		if !ok {
			return false // NaN, infinite, or beyond int64
		}
		if div == -1 {
			return rem == 0 // x % -1 is 0, and MinInt64 % -1 would trap
		}
		return x%div == rem
	}), nil
}

// coerceInt64 reads a number as an int64 truncated toward zero, or why
// it cannot (MongoDB's tryCoerce wording).
func coerceInt64(v bsoncore.Value) (int64, string) {
	if isNaN(v) || isInf(v) {
		return 0, "Unable to coerce NaN/Inf to integral type"
	}
	i, _, ok := truncInt64(v)
	if !ok {
		return 0, "Out of bounds coercing to integral value"
	}
	return i, ""
}

// truncInt64 reads a number truncated toward zero: the integer, whether
// the number was whole, and false when it is not a finite number within
// int64.
func truncInt64(v bsoncore.Value) (int64, bool, bool) {
	switch v.Type {
	case bsoncore.TypeInt32:
		i, ok := v.Int32OK()
		return int64(i), true, ok
	case bsoncore.TypeInt64:
		i, ok := v.Int64OK()
		return i, true, ok
	case bsoncore.TypeDouble:
		f, ok := v.DoubleOK()
		if !ok || math.IsNaN(f) || math.IsInf(f, 0) {
			return 0, false, false
		}
		t := math.Trunc(f)
		if t >= 9223372036854775808.0 || t < -9223372036854775808.0 {
			return 0, false, false
		}
		return int64(t), t == f, true
	case bsoncore.TypeDecimal128:
		h, l, ok := v.Decimal128OK()
		if !ok {
			return 0, false, false
		}
		d := bson.NewDecimal128(h, l)
		if d.IsNaN() || d.IsInf() != 0 {
			return 0, false, false
		}
		bi, exp, err := d.BigInt()
		if err != nil {
			return 0, false, false
		}
		whole := true
		if exp > 0 {
			if exp > 19 && bi.Sign() != 0 {
				return 0, false, false
			}
			bi.Mul(bi, new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(exp)), nil))
		} else if exp < 0 {
			r := new(big.Int)
			bi.QuoRem(bi, new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(-exp)), nil), r)
			whole = r.Sign() == 0
		}
		if !bi.IsInt64() {
			return 0, false, false
		}
		return bi.Int64(), whole, true
	}
	return 0, false, false
}

func isNaN(v bsoncore.Value) bool {
	switch v.Type {
	case bsoncore.TypeDouble:
		f, ok := v.DoubleOK()
		return ok && math.IsNaN(f)
	case bsoncore.TypeDecimal128:
		h, l, ok := v.Decimal128OK()
		return ok && bson.NewDecimal128(h, l).IsNaN()
	}
	return false
}

func isInf(v bsoncore.Value) bool {
	switch v.Type {
	case bsoncore.TypeDouble:
		f, ok := v.DoubleOK()
		return ok && math.IsInf(f, 0)
	case bsoncore.TypeDecimal128:
		h, l, ok := v.Decimal128OK()
		return ok && bson.NewDecimal128(h, l).IsInf() != 0
	}
	return false
}

// bits compiles $bitsAllSet, $bitsAllClear, $bitsAnySet and $bitsAnyClear.
// The operand is a non-negative integer mask, an array of bit positions,
// or a BinData whose bits (little-endian) are the mask. A number tested is
// an integer (or a whole double within int64), two's complement and sign
// extended: a position from 63 up reads the sign bit. A BinData tested is
// a little-endian bit string, clear beyond its end.
func (fc *Compiler) bits(field, op string, arg bsoncore.Value) (matcher, error) {
	var positions []uint32
	switch {
	case arg.Type == bsoncore.TypeArray:
		arr, _ := arg.ArrayOK()
		vals, err := arr.Values()
		if err != nil {
			return nil, mongoerr.Errorf(mongoerr.BadValue, "filter is not valid BSON: %v", err)
		}
		for i, v := range vals {
			if !v.IsNumber() {
				return nil, mongoerr.Errorf(mongoerr.BadValue, "Failed to parse bit position. Expected a number in: %d: %s", i, showValue(v))
			}
			n, whole, ok := truncInt64(v)
			switch {
			case !ok && !isNaN(v) && !isInf(v):
				return nil, mongoerr.Errorf(mongoerr.BadValue, "Failed to parse bit position. Cannot represent as a 64-bit integer: %d: %s", i, showValue(v))
			case !ok || !whole:
				return nil, mongoerr.Errorf(mongoerr.BadValue, "Failed to parse bit position. Expected an integer: %d: %s", i, showValue(v))
			case n < 0:
				return nil, mongoerr.Errorf(mongoerr.BadValue, "Failed to parse bit position. Expected a non-negative number in: %d: %s", i, showValue(v))
			case n > math.MaxInt32:
				return nil, mongoerr.Errorf(mongoerr.BadValue, "Failed to parse bit position. Cannot represent %d: %s in an int", i, showValue(v))
			}
			positions = append(positions, uint32(n))
		}
	case arg.IsNumber():
		n, whole, ok := truncInt64(arg)
		switch {
		case !ok && !isNaN(arg):
			return nil, mongoerr.Errorf(mongoerr.FailedToParse, "Cannot represent as a 64-bit integer: %s: %s", op, showValue(arg))
		case !ok || !whole:
			return nil, mongoerr.Errorf(mongoerr.FailedToParse, "Expected an integer: %s: %s", op, showValue(arg))
		case n < 0:
			return nil, mongoerr.Errorf(mongoerr.FailedToParse, "Expected a non-negative number in: %s: %s", op, showValue(arg))
		}
		for b := uint32(0); b < 64; b++ {
			if uint64(n)&(1<<b) != 0 {
				positions = append(positions, b)
			}
		}
	case arg.Type == bsoncore.TypeBinary:
		_, data, _ := arg.BinaryOK()
		for i, c := range data {
			for b := uint32(0); b < 8; b++ {
				if c&(1<<b) != 0 {
					positions = append(positions, uint32(i)*8+b)
				}
			}
		}
	default:
		return nil, mongoerr.Errorf(mongoerr.BadValue, "%s takes an Array, a number, or a BinData but received: %s: %s", field, op, showValue(arg))
	}
	var mask uint64 // for numbers: positions from 63 up are the sign bit
	for _, p := range positions {
		mask |= 1 << min(p, 63)
	}
	wantSet := op == "$bitsAllSet" || op == "$bitsAnySet"
	all := op == "$bitsAllSet" || op == "$bitsAllClear"
	return leaf(func(v bsoncore.Value) bool {
		if v.Type == bsoncore.TypeBinary {
			_, data, ok := v.BinaryOK()
			if !ok {
				return false
			}
			for _, p := range positions {
				set := false
				if i := int(p / 8); i < len(data) {
					set = data[i]&(1<<(p%8)) != 0
				}
				if set == wantSet {
					if !all {
						return true
					}
				} else if all {
					return false
				}
			}
			return all
		}
		x, ok := bitsNumber(v)
		if !ok {
			return false
		}
		bits := uint64(x)
		if !wantSet {
			bits = ^bits
		}
		if all {
			return bits&mask == mask
		}
		return bits&mask != 0
	}), nil
}

// bitsNumber is the integer a bit test reads in v: an int32 or int64, or a
// double (or decimal) holding a whole number within int64.
func bitsNumber(v bsoncore.Value) (int64, bool) {
	if !v.IsNumber() {
		return 0, false
	}
	x, whole, ok := truncInt64(v)
	return x, ok && whole
}

// showValue renders an operand for an error message.
func showValue(v bsoncore.Value) (s string) {
	defer func() {
		if recover() != nil {
			s = fmt.Sprintf("<%s>", v.Type)
		}
	}()
	switch v.Type {
	case bsoncore.TypeInt32, bsoncore.TypeInt64:
		if i, _, ok := truncInt64(v); ok {
			return strconv.FormatInt(i, 10)
		}
	case bsoncore.TypeDouble:
		if f, ok := v.DoubleOK(); ok {
			if f == math.Trunc(f) && !math.IsInf(f, 0) && math.Abs(f) < 1e15 {
				return strconv.FormatFloat(f, 'f', 1, 64)
			}
			return strconv.FormatFloat(f, 'g', -1, 64)
		}
	}
	if str, _ := v.StringN(200); str != "" {
		return str
	}
	return fmt.Sprintf("<%s>", v.Type)
}
