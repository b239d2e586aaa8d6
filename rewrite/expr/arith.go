package expr

import (
	"math"
	"strconv"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/expr/value"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// arithmetic is $add, $subtract, $multiply, $divide and $mod, with
// MongoDB's widening: int32, then int64 on overflow, then double; a date
// plus (or minus) milliseconds is a date, a date minus a date a long.
func arithmetic(name string, args []Expr) (Expr, error) {
	switch name {
	case "$subtract", "$divide", "$mod":
		if err := wantArgs(name, args, 2); err != nil {
			return nil, err
		}
	}
	return opFunc{name: name, args: args, f: func(vals []value.Value) (value.Value, error) { return arith(name, vals) }}, nil
}

func arith(name string, vals []value.Value) (value.Value, error) {
	for _, v := range vals {
		if value.IsNullish(v) {
			return value.Null, nil
		}
		if v.Type == bsoncore.TypeDecimal128 {
			return value.Missing, value.Unsupported("%s of a decimal128 value", name)
		}
	}
	switch name {
	case "$add":
		return value.Add(vals)
	case "$subtract":
		return value.Subtract(vals[0], vals[1])
	case "$multiply":
		return value.Multiply(vals)
	case "$divide":
		_, _, a, aok := value.Number(vals[0])
		_, _, b, bok := value.Number(vals[1])
		if !aok || !bok {
			return value.Missing, value.BadValue(mongoerr.TypeMismatch, "$divide only supports numeric types, not %s and %s", bsonutil.TypeName(vals[0].Type), bsonutil.TypeName(vals[1].Type))
		}
		if b == 0 {
			return value.Missing, value.BadValue(mongoerr.BadValue, "can't $divide by zero")
		}
		return value.DoubleValue(a / b), nil
	case "$mod":
		return value.Mod(vals[0], vals[1])
	}
	return value.Missing, value.Unsupported("the operator %q", name)
}

// mathUnary is $abs, $floor, $ceil, $sqrt, $ln, $log10, $exp, $trunc and
// $round (with an optional place count).
func mathUnary(name string, args []Expr) (Expr, error) {
	if (name == "$round" || name == "$trunc") && (len(args) == 1 || len(args) == 2) {
	} else if err := wantArgs(name, args, 1); err != nil {
		return nil, err
	}
	return opFunc{name: name, args: args, f: func(vals []value.Value) (value.Value, error) { return mathOf(name, vals) }}, nil
}

func mathOf(name string, vals []value.Value) (value.Value, error) {
	v := vals[0]
	if value.IsNullish(v) {
		return value.Null, nil
	}
	k, i, f, ok := value.Number(v)
	if !ok || k == value.KindDecimal {
		if k == value.KindDecimal {
			return value.Missing, value.Unsupported("%s of a decimal128 value", name)
		}
		return value.Missing, value.BadValue(28765, "%s only supports numeric types, not %s", name, bsonutil.TypeName(v.Type))
	}
	switch name {
	case "$abs":
		if k == value.KindDouble {
			return value.DoubleValue(math.Abs(f)), nil
		}
		if i == math.MinInt64 {
			return value.Missing, value.BadValue(28680, "can't take $abs of long long min")
		}
		if i < 0 {
			i = -i
		}
		return value.NumericResult(k, i, float64(i), false), nil
	case "$floor", "$ceil":
		if k != value.KindDouble {
			return v, nil
		}
		if name == "$floor" {
			return value.DoubleValue(math.Floor(f)), nil
		}
		return value.DoubleValue(math.Ceil(f)), nil
	case "$sqrt":
		if f < 0 {
			return value.Missing, value.BadValue(28714, "$sqrt's argument must be greater than or equal to 0")
		}
		return value.DoubleValue(math.Sqrt(f)), nil
	case "$ln":
		if f <= 0 {
			return value.Missing, value.BadValue(28766, "$ln's argument must be a positive number, but is %v", f)
		}
		return value.DoubleValue(math.Log(f)), nil
	case "$log10":
		if f <= 0 {
			return value.Missing, value.BadValue(28761, "$log10's argument must be a positive number, but is %v", f)
		}
		return value.DoubleValue(math.Log10(f)), nil
	case "$exp":
		return value.DoubleValue(math.Exp(f)), nil
	case "$round", "$trunc":
		places := int64(0)
		if len(vals) == 2 {
			if value.IsNullish(vals[1]) {
				return value.Null, nil
			}
			pk, pi, pf, ok := value.Number(vals[1])
			if !ok || (pk == value.KindDouble && pf != math.Trunc(pf)) {
				return value.Missing, value.BadValue(51082, "precision argument to %s must be a integral value", name)
			}
			if pk == value.KindDouble {
				pi = int64(pf)
			}
			if pi < -20 || pi > 100 {
				return value.Missing, value.BadValue(51083, "cannot apply %s with precision value %d value must be in [-20, 100]", name, pi)
			}
			places = pi
		}
		if k != value.KindDouble {
			if places >= 0 {
				return v, nil
			}
			return value.Missing, value.Unsupported("%s of an integer to a negative place", name)
		}
		return value.DoubleValue(value.RoundPlaces(f, places, name == "$round")), nil
	}
	return value.Missing, value.Unsupported("the operator %q", name)
}

// comparison is $eq, $ne, $gt, $gte, $lt, $lte and $cmp, in BSON order.
func comparison(name string, args []Expr) (Expr, error) {
	if err := wantArgs(name, args, 2); err != nil {
		return nil, err
	}
	return opFunc{name: name, args: args, f: func(v []value.Value) (value.Value, error) {
		c := value.Compare(v[0], v[1])
		switch name {
		case "$eq":
			return value.BoolValue(c == 0), nil
		case "$ne":
			return value.BoolValue(c != 0), nil
		case "$gt":
			return value.BoolValue(c > 0), nil
		case "$gte":
			return value.BoolValue(c >= 0), nil
		case "$lt":
			return value.BoolValue(c < 0), nil
		case "$lte":
			return value.BoolValue(c <= 0), nil
		}
		return value.Int32Value(int32(c)), nil
	}}, nil
}

// conversion is $toDouble, $toInt, $toLong, $toString, $toBool and
// $toDate of the values a dashboard converts (numbers, strings, dates,
// booleans); others are refused.
func conversion(name string, args []Expr) (Expr, error) {
	if err := wantArgs(name, args, 1); err != nil {
		return nil, err
	}
	return opFunc{name: name, args: args, f: func(vals []value.Value) (value.Value, error) { return convert(name, vals[0]) }}, nil
}

func convert(name string, v value.Value) (value.Value, error) {
	if value.IsNullish(v) {
		return value.Null, nil
	}
	if v.Type == bsoncore.TypeDecimal128 {
		return value.Missing, value.Unsupported("%s of a decimal128 value", name)
	}
	k, i, f, isNum := value.Number(v)
	fail := func() (value.Value, error) {
		return value.Missing, value.BadValue(241, "Unsupported conversion from %s to %s in $convert with no onError value", TypeAlias(v), strings.TrimPrefix(strings.ToLower(name), "$to"))
	}
	switch name {
	case "$toDouble":
		switch {
		case isNum:
			return value.DoubleValue(f), nil
		case v.Type == bsoncore.TypeBoolean:
			return value.DoubleValue(value.B2f(v.Boolean())), nil
		case v.Type == bsoncore.TypeDateTime:
			return value.DoubleValue(float64(v.DateTime())), nil
		case v.Type == bsoncore.TypeString:
			p, err := strconv.ParseFloat(strings.TrimSpace(v.StringValue()), 64)
			if err != nil {
				return value.Missing, value.BadValue(241, "Failed to parse number '%s' in $convert with no onError value", v.StringValue())
			}
			return value.DoubleValue(p), nil
		}
	case "$toInt", "$toLong":
		lo, hi := int64(math.MinInt32), int64(math.MaxInt32)
		if name == "$toLong" {
			lo, hi = math.MinInt64, math.MaxInt64
		}
		var n int64
		switch {
		case isNum && k == value.KindDouble:
			if math.IsNaN(f) || math.IsInf(f, 0) || f < float64(lo) || f >= -float64(lo) {
				return value.Missing, value.BadValue(241, "Conversion would overflow target type in $convert with no onError value: %v", f)
			}
			n = int64(f)
		case isNum:
			n = i
		case v.Type == bsoncore.TypeBoolean:
			n = int64(value.B2f(v.Boolean()))
		case v.Type == bsoncore.TypeDateTime && name == "$toLong":
			n = v.DateTime()
		case v.Type == bsoncore.TypeString:
			p, err := strconv.ParseInt(strings.TrimSpace(v.StringValue()), 10, 64)
			if err != nil {
				return value.Missing, value.BadValue(241, "Failed to parse number '%s' in $convert with no onError value", v.StringValue())
			}
			n = p
		default:
			return fail()
		}
		if n < lo || n > hi {
			return value.Missing, value.BadValue(241, "Conversion would overflow target type in $convert with no onError value: %d", n)
		}
		if name == "$toInt" {
			return value.Int32Value(int32(n)), nil
		}
		return value.Int64Value(n), nil
	case "$toString":
		switch {
		case v.Type == bsoncore.TypeString:
			return v, nil
		case isNum && k == value.KindDouble:
			return value.StringValue(strconv.FormatFloat(f, 'g', -1, 64)), nil
		case isNum:
			return value.StringValue(strconv.FormatInt(i, 10)), nil
		case v.Type == bsoncore.TypeBoolean:
			return value.StringValue(strconv.FormatBool(v.Boolean())), nil
		case v.Type == bsoncore.TypeDateTime:
			return value.StringValue(formatDate(v.DateTime(), defaultDateFormat, utc)), nil
		case v.Type == bsoncore.TypeObjectID:
			return value.StringValue(bson.ObjectID(v.ObjectID()).Hex()), nil
		}
	case "$toBool":
		return value.BoolValue(value.Truthy(v)), nil
	case "$toDate":
		switch {
		case v.Type == bsoncore.TypeDateTime:
			return v, nil
		case isNum && k == value.KindDouble:
			return value.DateValue(int64(f)), nil
		case isNum && k == value.KindInt64:
			return value.DateValue(i), nil
		case v.Type == bsoncore.TypeObjectID:
			return value.DateValue(bson.ObjectID(v.ObjectID()).Timestamp().UnixMilli()), nil
		}
	}
	return fail()
}

// concat is $concat: strings joined; null when any is null or missing.
func concat(name string, args []Expr) (Expr, error) {
	return opFunc{name: name, args: args, f: func(vals []value.Value) (value.Value, error) {
		var sb strings.Builder
		for _, v := range vals {
			if value.IsNullish(v) {
				return value.Null, nil
			}
			if v.Type != bsoncore.TypeString {
				return value.Missing, value.BadValue(16702, "$concat only supports strings, not %s", TypeAlias(v))
			}
			sb.WriteString(v.StringValue())
		}
		return value.StringValue(sb.String()), nil
	}}, nil
}
