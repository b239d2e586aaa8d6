package agg

import (
	"math"
	"strconv"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// arithmetic is $add, $subtract, $multiply, $divide and $mod, with
// MongoDB's widening: int32, then int64 on overflow, then double; a date
// plus (or minus) milliseconds is a date, a date minus a date a long.
func arithmetic(name string, args []expr) (expr, error) {
	switch name {
	case "$subtract", "$divide", "$mod":
		if err := wantArgs(name, args, 2); err != nil {
			return nil, err
		}
	}
	return opFunc{name: name, args: args, f: func(vals []Value) (Value, error) { return arith(name, vals) }}, nil
}

func arith(name string, vals []Value) (Value, error) {
	for _, v := range vals {
		if isNullish(v) {
			return null, nil
		}
		if v.Type == bsoncore.TypeDecimal128 {
			return missing, unsupported("%s of a decimal128 value", name)
		}
	}
	switch name {
	case "$add":
		return add(vals)
	case "$subtract":
		return subtract(vals[0], vals[1])
	case "$multiply":
		return multiply(vals)
	case "$divide":
		_, _, a, aok := number(vals[0])
		_, _, b, bok := number(vals[1])
		if !aok || !bok {
			return missing, badValue(mongoerr.TypeMismatch, "$divide only supports numeric types, not %s and %s", bsonutil.TypeName(vals[0].Type), bsonutil.TypeName(vals[1].Type))
		}
		if b == 0 {
			return missing, badValue(mongoerr.BadValue, "can't $divide by zero")
		}
		return doubleValue(a / b), nil
	case "$mod":
		return mod(vals[0], vals[1])
	}
	return missing, unsupported("the operator %q", name)
}

func add(vals []Value) (Value, error) {
	kind := kindInt32
	var isum int64
	var fsum float64
	dates := 0
	overflow := false
	for _, v := range vals {
		if v.Type == bsoncore.TypeDateTime {
			dates++
			if dates > 1 {
				return missing, badValue(16612, "only one date allowed in an $add expression")
			}
			isum += v.DateTime()
			fsum += float64(v.DateTime())
			continue
		}
		k, i, f, ok := number(v)
		if !ok {
			return missing, badValue(mongoerr.TypeMismatch, "$add only supports numeric or date types, not %s", bsonutil.TypeName(v.Type))
		}
		kind = max(kind, k)
		fsum += f
		if k != kindDouble {
			s := isum + i
			if (i > 0 && s < isum) || (i < 0 && s > isum) {
				overflow = true
			}
			isum = s
		}
	}
	if dates == 1 {
		if kind == kindDouble {
			return dateValue(int64(math.Round(fsum))), nil
		}
		return dateValue(isum), nil
	}
	return numericResult(kind, isum, fsum, overflow), nil
}

// numericResult is an integer result widened as MongoDB widens it.
func numericResult(kind numKind, i int64, f float64, overflow bool) Value {
	switch {
	case kind == kindDouble || overflow:
		return doubleValue(f)
	case kind == kindInt32 && i >= math.MinInt32 && i <= math.MaxInt32:
		return int32Value(int32(i))
	}
	return int64Value(i)
}

func subtract(a, b Value) (Value, error) {
	if a.Type == bsoncore.TypeDateTime {
		if b.Type == bsoncore.TypeDateTime {
			return int64Value(a.DateTime() - b.DateTime()), nil
		}
		k, i, f, ok := number(b)
		if !ok {
			return missing, badValue(mongoerr.TypeMismatch, "can't $subtract %s from Date", bsonutil.TypeName(b.Type))
		}
		if k == kindDouble {
			return dateValue(a.DateTime() - int64(math.Round(f))), nil
		}
		return dateValue(a.DateTime() - i), nil
	}
	ka, ia, fa, aok := number(a)
	kb, ib, fb, bok := number(b)
	if !aok || !bok {
		return missing, badValue(mongoerr.TypeMismatch, "can't $subtract %s from %s", bsonutil.TypeName(b.Type), bsonutil.TypeName(a.Type))
	}
	d := ia - ib
	overflow := (ib > 0 && d > ia) || (ib < 0 && d < ia)
	return numericResult(max(ka, kb), d, fa-fb, overflow), nil
}

func multiply(vals []Value) (Value, error) {
	kind := kindInt32
	ip, fp := int64(1), 1.0
	overflow := false
	for _, v := range vals {
		k, i, f, ok := number(v)
		if !ok {
			return missing, badValue(mongoerr.TypeMismatch, "$multiply only supports numeric types, not %s", bsonutil.TypeName(v.Type))
		}
		kind = max(kind, k)
		fp *= f
		if k != kindDouble && !overflow {
			p := ip * i
			if ip != 0 && (p/ip != i || (ip == -1 && i == math.MinInt64) || (i == -1 && ip == math.MinInt64)) {
				overflow = true
			}
			ip = p
		}
	}
	return numericResult(kind, ip, fp, overflow), nil
}

func mod(a, b Value) (Value, error) {
	ka, ia, fa, aok := number(a)
	kb, ib, fb, bok := number(b)
	if !aok || !bok {
		return missing, badValue(16611, "$mod only supports numeric types, not %s and %s", bsonutil.TypeName(a.Type), bsonutil.TypeName(b.Type))
	}
	if kind := max(ka, kb); kind == kindDouble {
		if fb == 0 {
			return missing, badValue(16610, "can't $mod by zero")
		}
		return doubleValue(math.Mod(fa, fb)), nil
	}
	if ib == 0 {
		return missing, badValue(16610, "can't $mod by zero")
	}
	if ib == -1 {
		return numericResult(max(ka, kb), 0, 0, false), nil
	}
	return numericResult(max(ka, kb), ia%ib, 0, false), nil
}

// mathUnary is $abs, $floor, $ceil, $sqrt, $ln, $log10, $exp, $trunc and
// $round (with an optional place count).
func mathUnary(name string, args []expr) (expr, error) {
	if (name == "$round" || name == "$trunc") && (len(args) == 1 || len(args) == 2) {
	} else if err := wantArgs(name, args, 1); err != nil {
		return nil, err
	}
	return opFunc{name: name, args: args, f: func(vals []Value) (Value, error) { return mathOf(name, vals) }}, nil
}

func mathOf(name string, vals []Value) (Value, error) {
	v := vals[0]
	if isNullish(v) {
		return null, nil
	}
	k, i, f, ok := number(v)
	if !ok || k == kindDecimal {
		if k == kindDecimal {
			return missing, unsupported("%s of a decimal128 value", name)
		}
		return missing, badValue(28765, "%s only supports numeric types, not %s", name, bsonutil.TypeName(v.Type))
	}
	switch name {
	case "$abs":
		if k == kindDouble {
			return doubleValue(math.Abs(f)), nil
		}
		if i == math.MinInt64 {
			return missing, badValue(28680, "can't take $abs of long long min")
		}
		if i < 0 {
			i = -i
		}
		return numericResult(k, i, float64(i), false), nil
	case "$floor", "$ceil":
		if k != kindDouble {
			return v, nil
		}
		if name == "$floor" {
			return doubleValue(math.Floor(f)), nil
		}
		return doubleValue(math.Ceil(f)), nil
	case "$sqrt":
		if f < 0 {
			return missing, badValue(28714, "$sqrt's argument must be greater than or equal to 0")
		}
		return doubleValue(math.Sqrt(f)), nil
	case "$ln":
		if f <= 0 {
			return missing, badValue(28766, "$ln's argument must be a positive number, but is %v", f)
		}
		return doubleValue(math.Log(f)), nil
	case "$log10":
		if f <= 0 {
			return missing, badValue(28761, "$log10's argument must be a positive number, but is %v", f)
		}
		return doubleValue(math.Log10(f)), nil
	case "$exp":
		return doubleValue(math.Exp(f)), nil
	case "$round", "$trunc":
		places := int64(0)
		if len(vals) == 2 {
			if isNullish(vals[1]) {
				return null, nil
			}
			pk, pi, pf, ok := number(vals[1])
			if !ok || (pk == kindDouble && pf != math.Trunc(pf)) {
				return missing, badValue(51082, "precision argument to %s must be a integral value", name)
			}
			if pk == kindDouble {
				pi = int64(pf)
			}
			if pi < -20 || pi > 100 {
				return missing, badValue(51083, "cannot apply %s with precision value %d value must be in [-20, 100]", name, pi)
			}
			places = pi
		}
		if k != kindDouble {
			if places >= 0 {
				return v, nil
			}
			return missing, unsupported("%s of an integer to a negative place", name)
		}
		return doubleValue(roundPlaces(f, places, name == "$round")), nil
	}
	return missing, unsupported("the operator %q", name)
}

// roundPlaces rounds (half to even, as MongoDB's $round does) or
// truncates f to places decimal places, through its decimal text so that
// 2.675 rounds as the decimal it was written as.
func roundPlaces(f float64, places int64, round bool) float64 {
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

// comparison is $eq, $ne, $gt, $gte, $lt, $lte and $cmp, in BSON order.
func comparison(name string, args []expr) (expr, error) {
	if err := wantArgs(name, args, 2); err != nil {
		return nil, err
	}
	return opFunc{name: name, args: args, f: func(v []Value) (Value, error) {
		c := compare(v[0], v[1])
		switch name {
		case "$eq":
			return boolValue(c == 0), nil
		case "$ne":
			return boolValue(c != 0), nil
		case "$gt":
			return boolValue(c > 0), nil
		case "$gte":
			return boolValue(c >= 0), nil
		case "$lt":
			return boolValue(c < 0), nil
		case "$lte":
			return boolValue(c <= 0), nil
		}
		return int32Value(int32(c)), nil
	}}, nil
}

// conversion is $toDouble, $toInt, $toLong, $toString, $toBool and
// $toDate of the values a dashboard converts (numbers, strings, dates,
// booleans); others are refused.
func conversion(name string, args []expr) (expr, error) {
	if err := wantArgs(name, args, 1); err != nil {
		return nil, err
	}
	return opFunc{name: name, args: args, f: func(vals []Value) (Value, error) { return convert(name, vals[0]) }}, nil
}

func convert(name string, v Value) (Value, error) {
	if isNullish(v) {
		return null, nil
	}
	if v.Type == bsoncore.TypeDecimal128 {
		return missing, unsupported("%s of a decimal128 value", name)
	}
	k, i, f, isNum := number(v)
	fail := func() (Value, error) {
		return missing, badValue(241, "Unsupported conversion from %s to %s in $convert with no onError value", typeAlias(v), strings.TrimPrefix(strings.ToLower(name), "$to"))
	}
	switch name {
	case "$toDouble":
		switch {
		case isNum:
			return doubleValue(f), nil
		case v.Type == bsoncore.TypeBoolean:
			return doubleValue(b2f(v.Boolean())), nil
		case v.Type == bsoncore.TypeDateTime:
			return doubleValue(float64(v.DateTime())), nil
		case v.Type == bsoncore.TypeString:
			p, err := strconv.ParseFloat(strings.TrimSpace(v.StringValue()), 64)
			if err != nil {
				return missing, badValue(241, "Failed to parse number '%s' in $convert with no onError value", v.StringValue())
			}
			return doubleValue(p), nil
		}
	case "$toInt", "$toLong":
		lo, hi := int64(math.MinInt32), int64(math.MaxInt32)
		if name == "$toLong" {
			lo, hi = math.MinInt64, math.MaxInt64
		}
		var n int64
		switch {
		case isNum && k == kindDouble:
			if math.IsNaN(f) || math.IsInf(f, 0) || f < float64(lo) || f >= -float64(lo) {
				return missing, badValue(241, "Conversion would overflow target type in $convert with no onError value: %v", f)
			}
			n = int64(f)
		case isNum:
			n = i
		case v.Type == bsoncore.TypeBoolean:
			n = int64(b2f(v.Boolean()))
		case v.Type == bsoncore.TypeDateTime && name == "$toLong":
			n = v.DateTime()
		case v.Type == bsoncore.TypeString:
			p, err := strconv.ParseInt(strings.TrimSpace(v.StringValue()), 10, 64)
			if err != nil {
				return missing, badValue(241, "Failed to parse number '%s' in $convert with no onError value", v.StringValue())
			}
			n = p
		default:
			return fail()
		}
		if n < lo || n > hi {
			return missing, badValue(241, "Conversion would overflow target type in $convert with no onError value: %d", n)
		}
		if name == "$toInt" {
			return int32Value(int32(n)), nil
		}
		return int64Value(n), nil
	case "$toString":
		switch {
		case v.Type == bsoncore.TypeString:
			return v, nil
		case isNum && k == kindDouble:
			return stringValue(strconv.FormatFloat(f, 'g', -1, 64)), nil
		case isNum:
			return stringValue(strconv.FormatInt(i, 10)), nil
		case v.Type == bsoncore.TypeBoolean:
			return stringValue(strconv.FormatBool(v.Boolean())), nil
		case v.Type == bsoncore.TypeDateTime:
			return stringValue(formatDate(v.DateTime(), defaultDateFormat, utc)), nil
		case v.Type == bsoncore.TypeObjectID:
			return stringValue(bson.ObjectID(v.ObjectID()).Hex()), nil
		}
	case "$toBool":
		return boolValue(truthy(v)), nil
	case "$toDate":
		switch {
		case v.Type == bsoncore.TypeDateTime:
			return v, nil
		case isNum && k == kindDouble:
			return dateValue(int64(f)), nil
		case isNum && k == kindInt64:
			return dateValue(i), nil
		case v.Type == bsoncore.TypeObjectID:
			return dateValue(bson.ObjectID(v.ObjectID()).Timestamp().UnixMilli()), nil
		}
	}
	return fail()
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// concat is $concat: strings joined; null when any is null or missing.
func concat(name string, args []expr) (expr, error) {
	return opFunc{name: name, args: args, f: func(vals []Value) (Value, error) {
		var sb strings.Builder
		for _, v := range vals {
			if isNullish(v) {
				return null, nil
			}
			if v.Type != bsoncore.TypeString {
				return missing, badValue(16702, "$concat only supports strings, not %s", typeAlias(v))
			}
			sb.WriteString(v.StringValue())
		}
		return stringValue(sb.String()), nil
	}}, nil
}
