package value

import (
	"math"
	"strconv"
	"strings"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

func Add(vals []Value) (Value, error) {
	kind := KindInt32
	var isum int64
	var fsum float64
	dates := 0
	overflow := false
	for _, v := range vals {
		if v.Type == bsoncore.TypeDateTime {
			dates++
			if dates > 1 {
				return Missing, BadValue(16612, "only one date allowed in an $add expression")
			}
			isum += v.DateTime()
			fsum += float64(v.DateTime())
			continue
		}
		k, i, f, ok := Number(v)
		if !ok {
			return Missing, BadValue(mongoerr.TypeMismatch, "$add only supports numeric or date types, not %s", bsonutil.TypeName(v.Type))
		}
		kind = max(kind, k)
		fsum += f
		if k != KindDouble {
			s := isum + i
			if (i > 0 && s < isum) || (i < 0 && s > isum) {
				overflow = true
			}
			isum = s
		}
	}
	if dates == 1 {
		if kind == KindDouble {
			return DateValue(int64(math.Round(fsum))), nil
		}
		return DateValue(isum), nil
	}
	return NumericResult(kind, isum, fsum, overflow), nil
}

// NumericResult is an integer result widened as MongoDB widens it.
func NumericResult(kind NumKind, i int64, f float64, overflow bool) Value {
	switch {
	case kind == KindDouble || overflow:
		return DoubleValue(f)
	case kind == KindInt32 && i >= math.MinInt32 && i <= math.MaxInt32:
		return Int32Value(int32(i))
	}
	return Int64Value(i)
}

func Subtract(a, b Value) (Value, error) {
	if a.Type == bsoncore.TypeDateTime {
		if b.Type == bsoncore.TypeDateTime {
			return Int64Value(a.DateTime() - b.DateTime()), nil
		}
		k, i, f, ok := Number(b)
		if !ok {
			return Missing, BadValue(mongoerr.TypeMismatch, "can't $subtract %s from Date", bsonutil.TypeName(b.Type))
		}
		if k == KindDouble {
			return DateValue(a.DateTime() - int64(math.Round(f))), nil
		}
		return DateValue(a.DateTime() - i), nil
	}
	ka, ia, fa, aok := Number(a)
	kb, ib, fb, bok := Number(b)
	if !aok || !bok {
		return Missing, BadValue(mongoerr.TypeMismatch, "can't $subtract %s from %s", bsonutil.TypeName(b.Type), bsonutil.TypeName(a.Type))
	}
	d := ia - ib
	overflow := (ib > 0 && d > ia) || (ib < 0 && d < ia)
	return NumericResult(max(ka, kb), d, fa-fb, overflow), nil
}

func Multiply(vals []Value) (Value, error) {
	kind := KindInt32
	ip, fp := int64(1), 1.0
	overflow := false
	for _, v := range vals {
		k, i, f, ok := Number(v)
		if !ok {
			return Missing, BadValue(mongoerr.TypeMismatch, "$multiply only supports numeric types, not %s", bsonutil.TypeName(v.Type))
		}
		kind = max(kind, k)
		fp *= f
		if k != KindDouble && !overflow {
			p := ip * i
			if ip != 0 && (p/ip != i || (ip == -1 && i == math.MinInt64) || (i == -1 && ip == math.MinInt64)) {
				overflow = true
			}
			ip = p
		}
	}
	return NumericResult(kind, ip, fp, overflow), nil
}

func Mod(a, b Value) (Value, error) {
	ka, ia, fa, aok := Number(a)
	kb, ib, fb, bok := Number(b)
	if !aok || !bok {
		return Missing, BadValue(16611, "$mod only supports numeric types, not %s and %s", bsonutil.TypeName(a.Type), bsonutil.TypeName(b.Type))
	}
	if kind := max(ka, kb); kind == KindDouble {
		if fb == 0 {
			return Missing, BadValue(16610, "can't $mod by zero")
		}
		return DoubleValue(math.Mod(fa, fb)), nil
	}
	if ib == 0 {
		return Missing, BadValue(16610, "can't $mod by zero")
	}
	if ib == -1 {
		return NumericResult(max(ka, kb), 0, 0, false), nil
	}
	return NumericResult(max(ka, kb), ia%ib, 0, false), nil
}

// RoundPlaces rounds (half to even, as MongoDB's $round does) or
// truncates f to places decimal places, through its decimal text so that
// 2.675 rounds as the decimal it was written as.
func RoundPlaces(f float64, places int64, round bool) float64 {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return f
	}
	scale := math.Pow(10, float64(places))
	x := f * scale
	var r float64
	if round {
		r = math.RoundToEven(x)
	} else {
		r = math.Trunc(x)
	}
	out := r / scale
	if s := strconv.FormatFloat(out, 'f', int(max(places, 0)), 64); !strings.ContainsAny(s, "eE") {
		if p, err := strconv.ParseFloat(s, 64); err == nil {
			return p
		}
	}
	return out
}

func B2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func BadValue(code mongoerr.Code, format string, args ...any) error {
	return mongoerr.Errorf(code, format, args...)
}

// Unsupported is the error for what the engine does not implement.
func Unsupported(format string, args ...any) error {
	return mongoerr.Errorf(mongoerr.NotImplemented, format+" is not supported by the proxy's aggregation engine", args...)
}
