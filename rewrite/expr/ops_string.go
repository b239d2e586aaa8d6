package expr

import (
	"strings"
	"unicode/utf8"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/expr/value"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// The string operators: $toUpper, $toLower, $trim, $ltrim, $rtrim,
// $strLenCP, $substrCP, $substrBytes, $split and $indexOfCP. MongoDB
// changes case of ASCII letters only.

func init() {
	operators["$toUpper"] = caseOp(strings.ToUpper)
	operators["$toLower"] = caseOp(strings.ToLower)
	operators["$strLenCP"] = unary(strLenCP)
	operators["$substrCP"] = fixed(3, substrCP)
	operators["$substrBytes"] = fixed(3, substrBytes)
	operators["$split"] = fixed(2, split)
	operators["$indexOfCP"] = indexOfCP
	for _, n := range []string{"$trim", "$ltrim", "$rtrim"} {
		rawOperators[n] = compileTrim
	}
}

// unary is a one-argument operator over its evaluated argument.
func unary(f func(name string, v value.Value) (value.Value, error)) func(string, []Expr) (Expr, error) {
	return fixed(1, func(name string, v []value.Value) (value.Value, error) { return f(name, v[0]) })
}

// fixed is an operator of exactly n evaluated arguments.
func fixed(n int, f func(name string, v []value.Value) (value.Value, error)) func(string, []Expr) (Expr, error) {
	return func(name string, args []Expr) (Expr, error) {
		if err := wantArgs(name, args, n); err != nil {
			return nil, err
		}
		return opFunc{name: name, args: args, f: func(v []value.Value) (value.Value, error) { return f(name, v) }}, nil
	}
}

// asString is v as $toUpper, $substr and $concat-like operators coerce
// it: null and missing are "", numbers, dates and strings their text.
func asString(name string, v value.Value) (string, error) {
	switch v.Type {
	case 0, bsoncore.TypeNull, bsoncore.TypeUndefined:
		return "", nil
	case bsoncore.TypeString:
		return v.StringValue(), nil
	case bsoncore.TypeInt32, bsoncore.TypeInt64, bsoncore.TypeDouble, bsoncore.TypeDateTime:
		s, err := convert("$toString", v)
		if err != nil {
			return "", err
		}
		return s.StringValue(), nil
	}
	return "", value.BadValue(16007, "%s: can't convert from BSON type %s to String", name, TypeAlias(v))
}

func asciiOnly(f func(string) string) func(string) string {
	return func(s string) string {
		b := []byte(s)
		for i, c := range b {
			if c < 0x80 {
				b[i] = f(string(c))[0]
			}
		}
		return string(b)
	}
}

func caseOp(f func(string) string) func(string, []Expr) (Expr, error) {
	ascii := asciiOnly(f)
	return unary(func(name string, v value.Value) (value.Value, error) {
		s, err := asString(name, v)
		if err != nil {
			return value.Missing, err
		}
		return value.StringValue(ascii(s)), nil
	})
}

func strLenCP(name string, v value.Value) (value.Value, error) {
	s, ok := v.StringValueOK()
	if !ok {
		return value.Missing, value.BadValue(34471, "%s requires a string argument, found: %s", name, TypeAlias(v))
	}
	return value.Int32Value(int32(utf8.RuneCountInString(s))), nil
}

// intArg reads an integral argument of name (what says which one).
func intArg(name, what string, v value.Value, code mongoerr.Code) (int64, error) {
	n, ok := bsonutil.WholeNumber(v)
	if !ok {
		return 0, value.BadValue(code, "%s: %s must be a numeric integral value, found: %s", name, what, TypeAlias(v))
	}
	return n, nil
}

func substrCP(name string, v []value.Value) (value.Value, error) {
	s, err := asString(name, v[0])
	if err != nil {
		return value.Missing, err
	}
	start, err := intArg(name, "starting index", v[1], 34450)
	if err != nil {
		return value.Missing, err
	}
	length, err := intArg(name, "length", v[2], 34452)
	if err != nil {
		return value.Missing, err
	}
	if start < 0 {
		return value.Missing, value.BadValue(34455, "%s: starting index must be non-negative (got: %d)", name, start)
	}
	if length < 0 {
		return value.Missing, value.BadValue(34454, "%s: length must be a nonnegative integer.", name)
	}
	r := []rune(s)
	start = min(start, int64(len(r)))
	return value.StringValue(string(r[start:clampEnd(start, length, int64(len(r)))])), nil
}

func substrBytes(name string, v []value.Value) (value.Value, error) {
	s, err := asString(name, v[0])
	if err != nil {
		return value.Missing, err
	}
	start, err := intArg(name, "starting index", v[1], 16034)
	if err != nil {
		return value.Missing, err
	}
	length, err := intArg(name, "length", v[2], 16035)
	if err != nil {
		return value.Missing, err
	}
	if start < 0 || start > int64(len(s)) {
		return value.StringValue(""), nil
	}
	end := int64(len(s))
	if length >= 0 {
		end = clampEnd(start, length, end)
	}
	if !onRuneStart(s, start) || !onRuneStart(s, end) {
		return value.Missing, value.BadValue(28656, "%s: Invalid range, starting index is a UTF-8 continuation byte or ending index is in the middle of a UTF-8 character.", name)
	}
	return value.StringValue(s[start:end]), nil
}

func split(name string, v []value.Value) (value.Value, error) {
	if value.IsNullish(v[0]) {
		return value.Null, nil
	}
	s, ok := v[0].StringValueOK()
	if !ok {
		return value.Missing, value.BadValue(40085, "%s requires an expression that evaluates to a string as a first argument, found: %s", name, TypeAlias(v[0]))
	}
	sep, ok := v[1].StringValueOK()
	if !ok {
		return value.Missing, value.BadValue(40086, "%s requires an expression that evaluates to a string as a second argument, found: %s", name, TypeAlias(v[1]))
	}
	if sep == "" {
		return value.Missing, value.BadValue(40087, "%s requires a non-empty separator", name)
	}
	parts := strings.Split(s, sep)
	out := make([]value.Value, len(parts))
	for i, p := range parts {
		out[i] = value.StringValue(p)
	}
	return arrayValue(out), nil
}

// indexOfCP: [string, substring, start?, end?], code points.
func indexOfCP(name string, args []Expr) (Expr, error) {
	if len(args) < 2 || len(args) > 4 {
		return nil, value.BadValue(28667, "Expression %s takes at least 2 arguments, and at most 4, but %d were passed in.", name, len(args))
	}
	return opFunc{name: name, args: args, f: func(v []value.Value) (value.Value, error) { return indexOf(name, v) }}, nil
}

func indexOf(name string, v []value.Value) (value.Value, error) {
	if value.IsNullish(v[0]) {
		return value.Null, nil
	}
	s, ok := v[0].StringValueOK()
	if !ok {
		return value.Missing, value.BadValue(40093, "%s requires a string as the first argument, found: %s", name, TypeAlias(v[0]))
	}
	sub, ok := v[1].StringValueOK()
	if !ok {
		return value.Missing, value.BadValue(40094, "%s requires a string as the second argument, found: %s", name, TypeAlias(v[1]))
	}
	r, want := []rune(s), []rune(sub)
	start, end := int64(0), int64(len(r))
	if len(v) > 2 {
		n, err := intArg(name, "starting index", v[2], 40096)
		if err != nil {
			return value.Missing, err
		}
		if n < 0 {
			return value.Missing, value.BadValue(40097, "%s requires a nonnegative start index, found: %d", name, n)
		}
		start = n
	}
	if len(v) > 3 {
		n, err := intArg(name, "ending index", v[3], 40096)
		if err != nil {
			return value.Missing, err
		}
		if n < 0 {
			return value.Missing, value.BadValue(40097, "%s requires a nonnegative end index, found: %d", name, n)
		}
		end = min(n, end)
	}
	for i := start; i+int64(len(want)) <= end; i++ {
		if string(r[i:i+int64(len(want))]) == sub {
			return value.Int32Value(int32(i)), nil
		}
	}
	return value.Int32Value(-1), nil
}

// $trim, $ltrim, $rtrim: {input, chars?}; the default chars are
// whitespace and the null character, as MongoDB's.
const trimDefault = "\x00 \t\n\v\f\r\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"

type trimExpr struct {
	name         string
	input, chars Expr
}

func compileTrim(name string, v value.Value, depth level) (Expr, error) {
	d, ok := v.DocumentOK()
	if !ok {
		return nil, value.BadValue(50696, "%s only supports an object as an argument, found: %s", name, TypeAlias(v))
	}
	t := trimExpr{name: name}
	if err := namedArgs(name, d, depth, 50694, map[string]*Expr{"input": &t.input, "chars": &t.chars}); err != nil {
		return nil, err
	}
	if t.input == nil {
		return nil, value.BadValue(50695, "%s requires an 'input' field", name)
	}
	return t, nil
}

func (t trimExpr) Eval(doc bsoncore.Document) (value.Value, error) {
	in, err := t.input.Eval(doc)
	if err != nil || value.IsNullish(in) {
		return value.Null, err
	}
	s, ok := in.StringValueOK()
	if !ok {
		return value.Missing, value.BadValue(50699, "%s requires its input to be a string, got %s (of type %s) instead.", t.name, value.Describe(in), TypeAlias(in))
	}
	chars := trimDefault
	if t.chars != nil {
		c, err := t.chars.Eval(doc)
		if err != nil || value.IsNullish(c) {
			return value.Null, err
		}
		if chars, ok = c.StringValueOK(); !ok {
			return value.Missing, value.BadValue(50700, "%s requires 'chars' to be a string, got %s (of type %s) instead.", t.name, value.Describe(c), TypeAlias(c))
		}
	}
	if t.name != "$rtrim" {
		s = strings.TrimLeft(s, chars)
	}
	if t.name != "$ltrim" {
		s = strings.TrimRight(s, chars)
	}
	return value.StringValue(s), nil
}

// onRuneStart says whether byte offset i of s is not inside a UTF-8
// character (the end of s is).
func onRuneStart(s string, i int64) bool {
	return i >= int64(len(s)) || utf8.RuneStart(s[i])
}

// clampEnd is start+length bounded by n, without overflowing.
func clampEnd(start, length, n int64) int64 {
	if length >= n-start {
		return n
	}
	return start + length
}
