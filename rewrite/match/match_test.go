package match_test

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
	"github.com/tsproxy/tsproxy/rewrite/match"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

type D = bson.D
type E = bson.E
type A = bson.A

// d builds a document from key, value pairs.
func d(kv ...any) D {
	out := make(D, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, E{Key: kv[i].(string), Value: kv[i+1]})
	}
	return out
}

func re(pattern, options string) bson.Regex { return bson.Regex{Pattern: pattern, Options: options} }

func dec(t *testing.T, s string) bson.Decimal128 {
	v, err := bson.ParseDecimal128(s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func compiler() *match.Compiler {
	return &match.Compiler{Unsupported: func(f string, a ...any) error {
		return mongoerr.Errorf(mongoerr.NotImplemented, f, a...)
	}}
}

// TestMatch checks the proxy's matcher against MongoDB's find semantics.
// The rules each case relies on are MongoDB's (src/mongo/db/matcher:
// path.cpp for the traversal of arrays, expression_leaf.cpp and
// expression_array.cpp for the operators) and its documentation.
func TestMatch(t *testing.T) {
	nan := math.NaN()
	bin := func(b ...byte) bson.Binary { return bson.Binary{Subtype: 0, Data: b} }
	cases := []struct {
		name   string
		doc    D
		filter D
		want   bool
	}{
		// Equality, element-wise on arrays.
		{"scalar eq", d("a", 1), d("a", 1), true},
		{"eq numbers across types", d("a", int64(5)), d("a", 5.0), true},
		{"eq any element", d("a", A{1, 2}), d("a", 2), true},
		{"eq whole array", d("a", A{1, 2}), d("a", A{1, 2}), true},
		{"eq array order matters", d("a", A{1, 2}), d("a", A{2, 1}), false},
		{"eq not inside nested array", d("a", A{A{1, 2}}), d("a", 1), false},
		{"eq nested array element", d("a", A{A{1, 2}}), d("a", A{1, 2}), true},
		{"eq document exact", d("a", A{d("b", 1, "c", 2)}), d("a", d("b", 1, "c", 2)), true},
		{"eq document field order", d("a", d("b", 1, "c", 2)), d("a", d("c", 2, "b", 1)), false},
		{"$eq operator on array", d("a", A{1, 2}), d("a", d("$eq", 2)), true},

		// Dotted paths through arrays.
		{"dotted into array of docs", d("a", A{d("b", 1), d("b", 2)}), d("a.b", 2), true},
		{"dotted into array of docs no match", d("a", A{d("b", 1), d("b", 2)}), d("a.b", 3), false},
		{"dotted leaf array", d("a", d("b", A{1, 2})), d("a.b", 2), true},
		{"dotted array then leaf array", d("a", A{d("b", A{1, 2})}), d("a.b", 2), true},
		{"dotted does not enter nested arrays", d("a", A{A{d("b", 1)}}), d("a.b", 1), false},
		{"dotted through scalar", d("a", 5), d("a.b", 5), false},
		{"numeric index", d("a", A{5, 6}), d("a.1", 6), true},
		{"numeric index other element", d("a", A{5, 6}), d("a.1", 5), false},
		{"numeric index then field", d("a", A{d("b", 1), d("b", 2)}), d("a.1.b", 2), true},
		{"numeric index then field wrong element", d("a", A{d("b", 1), d("b", 2)}), d("a.0.b", 2), false},
		{"numeric component as field name in array doc", d("a", A{d("0", 7)}), d("a.0", 7), true},
		{"numeric component as index yields the doc", d("a", A{d("0", 7)}), d("a.0", d("0", 7)), true},
		{"numeric component of a document", d("a", d("0", d("b", 1))), d("a.0.b", 1), true},
		{"index into nested array then field", d("a", A{A{d("b", 1)}}), d("a.0.b", 1), true},
		{"indexed nested array is whole", d("a", A{A{1, 2}, A{3}}), d("a.1", A{3}), true},
		{"index out of range", d("a", A{5, 6}), d("a.2", 5), false},

		// Null and missing.
		{"null matches missing", d("b", 1), d("a", nil), true},
		{"null matches null", d("a", nil), d("a", nil), true},
		{"null matches array holding null", d("a", A{1, nil}), d("a", nil), true},
		{"null does not match array without null", d("a", A{1, 2}), d("a", nil), false},
		{"null on missing subfield in array of docs", d("a", A{d("b", 1), d("c", 2)}), d("a.b", nil), true},
		{"null when every array doc has the subfield", d("a", A{d("b", 1), d("b", 2)}), d("a.b", nil), false},
		{"null through scalar", d("a", 5), d("a.b", nil), true},
		{"$gte null on missing", d(), d("a", d("$gte", nil)), true},
		{"$gt null on missing", d(), d("a", d("$gt", nil)), false},

		// $ne and $nin negate the element-wise test.
		{"$ne any element equal", d("a", A{1, 2}), d("a", d("$ne", 1)), false},
		{"$ne no element equal", d("a", A{1, 2}), d("a", d("$ne", 3)), true},
		{"$ne null on missing", d(), d("a", d("$ne", nil)), false},
		{"$ne null with a doc missing the subfield", d("a", A{d("b", 1), d("c", 1)}), d("a.b", d("$ne", nil)), false},
		{"$nin any element in", d("a", A{1, 2}), d("a", d("$nin", A{2, 3})), false},
		{"$nin none in", d("a", A{1, 2}), d("a", d("$nin", A{3, 4})), true},
		{"$nin regex", d("a", "banana"), d("a", d("$nin", A{re("^ap", "")})), true},

		// Comparisons and type brackets.
		{"$gt any element", d("a", A{1, 10}), d("a", d("$gt", 5)), true},
		{"$gt no element", d("a", A{1, 2}), d("a", d("$gt", 5)), false},
		{"$gt never matches a string", d("a", "10"), d("a", d("$gt", 5)), false},
		{"$gt never matches a date", d("a", rwtest.DT(10)), d("a", d("$gt", 5)), false},
		{"$gt array operand compares the array", d("a", A{1, 2}), d("a", d("$gt", A{1})), true},
		{"$lt array operand compares the array", d("a", A{1, 2}), d("a", d("$lt", A{1})), false},
		{"$gt and $lt hold on different elements", d("a", A{0, 10}), d("a", d("$gt", 1, "$lt", 5)), true},
		{"$gte across numeric types", d("a", int32(5)), d("a", d("$gte", 4.5)), true},
		{"$lte string order", d("a", "abc"), d("a", d("$lte", "abd")), true},
		{"NaN is not less than a number", d("a", nan), d("a", d("$lt", 5)), false},
		{"NaN $gte NaN", d("a", nan), d("a", d("$gte", nan)), true},
		{"NaN equals NaN", d("a", nan), d("a", nan), true},
		{"NaN is not greater than NaN", d("a", nan), d("a", d("$gt", nan)), false},
		{"$lt MaxKey across types", d("a", "x"), d("a", d("$lt", bson.MaxKey{})), true},
		{"$gt MinKey across types", d("a", 5), d("a", d("$gt", bson.MinKey{})), true},
		{"$gt MaxKey", d("a", 5), d("a", d("$gt", bson.MaxKey{})), false},

		// $in.
		{"$in any element", d("a", A{1, 2}), d("a", d("$in", A{2, 3})), true},
		{"$in none", d("a", A{1, 2}), d("a", d("$in", A{3})), false},
		{"$in null matches missing", d(), d("a", d("$in", A{nil})), true},
		{"$in regex", d("a", "apple"), d("a", d("$in", A{re("^ap", "")})), true},
		{"$in whole array", d("a", A{A{1, 2}}), d("a", d("$in", A{A{1, 2}})), true},
		{"$in empty", d("a", 1), d("a", d("$in", A{})), false},

		// $exists.
		{"$exists on some array doc", d("a", A{d("b", 1), d("c", 1)}), d("a.b", d("$exists", true)), true},
		{"$exists on no array doc", d("a", A{d("c", 1)}), d("a.b", d("$exists", true)), false},
		{"$exists empty array", d("a", A{}), d("a", d("$exists", true)), true},
		{"$exists false through scalar array", d("a", A{1}), d("a.b", d("$exists", false)), true},
		{"$exists null value", d("a", nil), d("a", d("$exists", true)), true},
		{"$exists 0 is false", d("a", 1), d("a", d("$exists", 0)), false},

		// $not.
		{"$not of element-wise $gt", d("a", A{1, 2}), d("a", d("$not", d("$gt", 1))), false},
		{"$not regex", d("a", "abc"), d("a", d("$not", re("^b", ""))), true},
		{"$not on missing", d(), d("a", d("$not", d("$gt", 1))), true},
		{"$not $regex operator", d("a", "abc"), d("a", d("$not", d("$regex", "^A", "$options", "i"))), false},

		// $size.
		{"$size", d("a", A{1, 2}), d("a", d("$size", 2)), true},
		{"$size not of nested arrays", d("a", A{A{1, 2}}), d("a", d("$size", 2)), false},
		{"$size through array of docs", d("a", A{d("b", A{1, 2})}), d("a.b", d("$size", 2)), true},
		{"$size of a string", d("a", "ab"), d("a", d("$size", 2)), false},
		{"$size 0", d("a", A{}), d("a", d("$size", 0)), true},
		{"$size whole double", d("a", A{1}), d("a", d("$size", 1.0)), true},

		// $all.
		{"$all present", d("a", A{1, 2, 3}), d("a", d("$all", A{1, 3})), true},
		{"$all one missing", d("a", A{1, 2, 3}), d("a", d("$all", A{1, 4})), false},
		{"$all on a scalar", d("a", 1), d("a", d("$all", A{1})), true},
		{"$all empty matches nothing", d("a", A{1}), d("a", d("$all", A{})), false},
		{"$all through array of docs", d("a", A{d("b", 1), d("b", 2)}), d("a.b", d("$all", A{1, 2})), true},
		{"$all with regex", d("a", A{"apple", "kiwi"}), d("a", d("$all", A{re("^k", ""), "apple"})), true},
		{"$all of $elemMatch", d("a", A{d("x", 1, "y", 2), d("x", 2, "y", 1)}),
			d("a", d("$all", A{d("$elemMatch", d("x", 1, "y", 2)), d("$elemMatch", d("x", 2))})), true},
		{"$all of $elemMatch one fails", d("a", A{d("x", 1, "y", 2)}),
			d("a", d("$all", A{d("$elemMatch", d("x", 1)), d("$elemMatch", d("x", 2))})), false},

		// $elemMatch.
		{"$elemMatch value form needs one element", d("a", A{0, 10}), d("a", d("$elemMatch", d("$gt", 1, "$lt", 5))), false},
		{"$elemMatch value form", d("a", A{0, 3}), d("a", d("$elemMatch", d("$gt", 1, "$lt", 5))), true},
		{"$elemMatch on a scalar", d("a", 5), d("a", d("$elemMatch", d("$gt", 1))), false},
		{"$elemMatch query form needs one element", d("a", A{d("x", 1, "y", 1), d("x", 2, "y", 2)}), d("a", d("$elemMatch", d("x", 1, "y", 2))), false},
		{"dotted fields may hold on different elements", d("a", A{d("x", 1, "y", 1), d("x", 2, "y", 2)}), d("a.x", 1, "a.y", 2), true},
		{"$elemMatch query form", d("a", A{d("x", 1, "y", 2)}), d("a", d("$elemMatch", d("x", 1, "y", 2))), true},
		{"$elemMatch query form with array field", d("a", A{d("x", A{1, 5})}), d("a", d("$elemMatch", d("x", d("$gt", 4)))), true},
		{"$elemMatch query form led by $or", d("a", A{d("x", 1), d("x", 3)}), d("a", d("$elemMatch", d("$or", A{d("x", 3), d("x", 5)}))), true},
		{"$elemMatch empty on scalars", d("a", A{1, 2}), d("a", d("$elemMatch", d())), false},
		{"$elemMatch empty on a document", d("a", A{d()}), d("a", d("$elemMatch", d())), true},
		{"$elemMatch nested", d("a", A{A{1, 2}, A{3}}), d("a", d("$elemMatch", d("$elemMatch", d("$gt", 2)))), true},
		{"$elemMatch $type", d("a", A{1, "x"}), d("a", d("$elemMatch", d("$type", "string"))), true},
		{"$elemMatch $ne", d("a", A{1, 2}), d("a", d("$elemMatch", d("$ne", 1))), true},
		{"$elemMatch $ne every element", d("a", A{1, 1}), d("a", d("$elemMatch", d("$ne", 1))), false},
		{"$elemMatch query form on array elements", d("a", A{A{1, 2}}), d("a", d("$elemMatch", d("0", 1))), true},
		{"$elemMatch through array of docs", d("a", A{d("b", A{d("c", 1)})}), d("a.b", d("$elemMatch", d("c", 1))), true},

		// $type.
		{"$type array", d("a", A{1, 2}), d("a", d("$type", "array")), true},
		{"$type array on scalar", d("a", 1), d("a", d("$type", "array")), false},
		{"$type array of nested arrays", d("a", A{A{1}}), d("a", d("$type", "array")), true},
		{"$type element", d("a", A{1, "x"}), d("a", d("$type", "string")), true},
		{"$type number", d("a", int32(1)), d("a", d("$type", "number")), true},
		{"$type number not a string", d("a", "1"), d("a", d("$type", "number")), false},
		{"$type long by number", d("a", int64(1)), d("a", d("$type", 18)), true},
		{"$type long by name", d("a", int64(1)), d("a", d("$type", "long")), true},
		{"$type int is not long", d("a", int64(1)), d("a", d("$type", "int")), false},
		{"$type double code as double", d("a", 2.5), d("a", d("$type", 1.0)), true},
		{"$type null", d("a", nil), d("a", d("$type", "null")), true},
		{"$type null on missing", d(), d("a", d("$type", "null")), false},
		{"$type list", d("a", "x"), d("a", d("$type", A{"int", "string"})), true},
		{"$type object", d("a", d("b", 1)), d("a", d("$type", "object")), true},
		{"$type minKey by number", d("a", bson.MinKey{}), d("a", d("$type", -1)), true},
		{"$type maxKey by name", d("a", bson.MaxKey{}), d("a", d("$type", "maxKey")), true},
		{"$type decimal", d("a", dec(t, "1.5")), d("a", d("$type", "decimal")), true},
		{"$type binData", d("a", bin(1)), d("a", d("$type", 5)), true},
		{"$type regex", d("a", re("x", "")), d("a", d("$type", "regex")), true},
		{"$type bool", d("a", false), d("a", d("$type", "bool")), true},
		{"$type date", d("a", rwtest.DT(1)), d("a", d("$type", 9)), true},

		// $regex.
		{"regex literal", d("a", "Hello"), d("a", re("^Hel", "")), true},
		{"regex case", d("a", "Hello"), d("a", re("^hel", "")), false},
		{"regex i", d("a", "Hello"), d("a", re("^hel", "i")), true},
		{"$regex with $options", d("a", "Hello"), d("a", d("$regex", "^hel", "$options", "i")), true},
		{"$options before $regex", d("a", "Hello"), d("a", d("$options", "i", "$regex", "^hel")), true},
		{"$regex of a regex value", d("a", "Hello"), d("a", d("$regex", re("^hel", "i"))), true},
		{"regex m", d("a", "a\nb"), d("a", d("$regex", "^b", "$options", "m")), true},
		{"regex without m", d("a", "a\nb"), d("a", d("$regex", "^b")), false},
		{"regex s", d("a", "a\nb"), d("a", d("$regex", "a.b", "$options", "s")), true},
		{"regex without s", d("a", "a\nb"), d("a", d("$regex", "a.b")), false},
		{"regex x", d("a", "abc"), d("a", d("$regex", "a b c # a comment", "$options", "x")), true},
		{"regex x escaped space", d("a", "a b"), d("a", d("$regex", `a\ b`, "$options", "x")), true},
		{"regex x class keeps space and #", d("a", "a#b"), d("a", d("$regex", "a[# ]b", "$options", "x")), true},
		{"regex x multi-line comment", d("a", "ab"), d("a", d("$regex", "a # one\n b # two", "$options", "x")), true},
		{"regex $ before final newline", d("a", "abc\n"), d("a", re("abc$", "")), true},
		{"regex $ not before inner newline", d("a", "abc\nd"), d("a", re("abc$", "")), false},
		{"regex $ in alternatives", d("a", "x\n"), d("a", re("^(y|x$)", "")), true},
		{"regex \\s includes vertical tab", d("a", "a\vb"), d("a", re(`a\sb`, "")), true},
		{"regex \\S", d("a", "a\vb"), d("a", re(`a\Sb`, "")), false},
		{"regex any array element", d("a", A{"x", "yz"}), d("a", re("^y", "")), true},
		{"regex never matches a number", d("a", 5), d("a", re("5", "")), false},
		{"regex matches a symbol", d("a", bson.Symbol("abc")), d("a", re("b", "")), true},
		{"regex equal to a regex value", d("a", re("x", "i")), d("a", re("x", "i")), true},
		{"regex other flags than a regex value", d("a", re("x", "")), d("a", re("x", "i")), false},
		{"$eq regex is regex equality", d("a", re("x", "")), d("a", d("$eq", re("x", ""))), true},
		{"$eq regex does not match strings", d("a", "x"), d("a", d("$eq", re("x", ""))), false},
		{"regex u accepted", d("a", "é"), d("a", re("^.$", "u")), true},
		{"regex non-capturing group and class", d("a", "ab12"), d("a", re(`^(?:ab)[0-9]{2}$`, "")), true},

		// $mod.
		{"$mod", d("a", 10), d("a", d("$mod", A{4, 2})), true},
		{"$mod negative dividend", d("a", -5), d("a", d("$mod", A{4, -1})), true},
		{"$mod negative dividend positive remainder", d("a", -5), d("a", d("$mod", A{4, 3})), false},
		{"$mod negative divisor", d("a", 5), d("a", d("$mod", A{-4, 1})), true},
		{"$mod truncates the value", d("a", 5.9), d("a", d("$mod", A{5, 0})), true},
		{"$mod truncates the operands", d("a", 7), d("a", d("$mod", A{4.7, 3.2})), true},
		{"$mod any element", d("a", A{1, 6}), d("a", d("$mod", A{5, 1})), true},
		{"$mod of a string", d("a", "6"), d("a", d("$mod", A{5, 1})), false},
		{"$mod of NaN", d("a", nan), d("a", d("$mod", A{5, 0})), false},
		{"$mod of a long", d("a", int64(1)<<40+3), d("a", d("$mod", A{int64(1) << 40, 3})), true},

		// Bit tests (54 is 0b110110).
		{"$bitsAllSet positions", d("a", 54), d("a", d("$bitsAllSet", A{1, 2})), true},
		{"$bitsAllSet positions one clear", d("a", 54), d("a", d("$bitsAllSet", A{0, 1})), false},
		{"$bitsAllSet mask", d("a", 54), d("a", d("$bitsAllSet", 6)), true},
		{"$bitsAnySet", d("a", 54), d("a", d("$bitsAnySet", A{0, 1})), true},
		{"$bitsAllClear", d("a", 54), d("a", d("$bitsAllClear", A{0, 3})), true},
		{"$bitsAnyClear none clear", d("a", 54), d("a", d("$bitsAnyClear", A{1, 2})), false},
		{"$bitsAnyClear", d("a", 54), d("a", d("$bitsAnyClear", 3)), true},
		{"bits beyond 63 read the sign: set", d("a", -1), d("a", d("$bitsAllSet", A{100})), true},
		{"bits beyond 63 read the sign: clear", d("a", 1), d("a", d("$bitsAllSet", A{100})), false},
		{"bits beyond 63 of a negative are not clear", d("a", -1), d("a", d("$bitsAllClear", A{100})), false},
		{"bits of a whole double", d("a", 54.0), d("a", d("$bitsAllSet", 6)), true},
		{"bits of a fractional double", d("a", 54.5), d("a", d("$bitsAllSet", 6)), false},
		{"bits of BinData", d("a", bin(0x36)), d("a", d("$bitsAllSet", A{1, 2})), true},
		{"bits of BinData beyond its end are clear", d("a", bin(0x36)), d("a", d("$bitsAnySet", A{8})), false},
		{"bits of BinData beyond its end: all clear", d("a", bin(0x36)), d("a", d("$bitsAllClear", A{8, 9})), true},
		{"BinData mask", d("a", 54), d("a", d("$bitsAllSet", bin(0x06))), true},
		{"bits of a string", d("a", "54"), d("a", d("$bitsAllSet", 6)), false},
		{"bits any element", d("a", A{1, 54}), d("a", d("$bitsAllSet", 6)), true},
		{"bits empty positions all", d("a", 0), d("a", d("$bitsAllSet", A{})), true},
		{"bits empty positions any", d("a", 0), d("a", d("$bitsAnySet", A{})), false},

		// Logical operators and $comment.
		{"$or", d("a", A{1, 2}), d("$or", A{d("a", 3), d("a", 2)}), true},
		{"$nor", d("a", A{1, 2}), d("$nor", A{d("a", 2)}), false},
		{"$and", d("a", A{1, 2}), d("$and", A{d("a", 1), d("a", 2)}), true},
		{"$comment is ignored", d("a", 1), d("$comment", "why", "a", 1), true},
		{"DBRef literal", d("a", d("$ref", "c", "$id", 1)), d("a", d("$ref", "c", "$id", 1)), true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := compiler().Compile(rwtest.Doc(t, c.filter), 0)
			if err != nil {
				t.Fatalf("%v: %v", c.filter, err)
			}
			if got := p(rwtest.Doc(t, c.doc)); got != c.want {
				t.Errorf("%s on %s: got %v, want %v", rwtest.JSON(rwtest.Doc(t, c.filter)), rwtest.JSON(rwtest.Doc(t, c.doc)), got, c.want)
			}
		})
	}
	if len(cases) < 80 {
		t.Fatalf("only %d cases", len(cases))
	}
}

func TestMatchErrors(t *testing.T) {
	cases := []struct {
		filter D
		code   mongoerr.Code
		want   string
	}{
		{d("$where", "this.a"), mongoerr.NotImplemented, "$where"},
		{d("$expr", d("$eq", A{"$a", 1})), mongoerr.NotImplemented, "$expr"},
		{d("$text", d("$search", "x")), mongoerr.NotImplemented, "$text"},
		{d("$jsonSchema", d()), mongoerr.NotImplemented, "$jsonSchema"},
		{d("loc", d("$near", A{0, 0})), mongoerr.NotImplemented, "$near"},
		{d("loc", d("$geoWithin", d())), mongoerr.NotImplemented, "$geoWithin"},
		{d("a", d("$elemMatch", d("$where", "1"))), mongoerr.NotImplemented, "$where"},
		{d("a", d("$mod", A{0, 1})), mongoerr.BadValue, "divisor cannot be 0"},
		{d("a", d("$mod", A{1})), mongoerr.BadValue, "malformed mod, not enough elements"},
		{d("a", d("$mod", A{})), mongoerr.BadValue, "malformed mod, not enough elements"},
		{d("a", d("$mod", A{1, 2, 3})), mongoerr.BadValue, "malformed mod, too many elements"},
		{d("a", d("$mod", "x")), mongoerr.BadValue, "malformed mod, needs to be an array"},
		{d("a", d("$mod", A{"x", 1})), mongoerr.BadValue, "malformed mod, divisor not a number"},
		{d("a", d("$mod", A{1, "x"})), mongoerr.BadValue, "malformed mod, remainder not a number"},
		{d("a", d("$mod", A{math.NaN(), 1})), mongoerr.BadValue, "malformed mod, divisor value is invalid :: caused by :: Unable to coerce NaN/Inf to integral type"},
		{d("a", d("$mod", A{1, 1e300})), mongoerr.BadValue, "malformed mod, remainder value is invalid :: caused by :: Out of bounds coercing to integral value"},
		{d("a", d("$regex", "x", "$options", "g")), 51108, "invalid flag in regex options: g"},
		{d("a", re("x", "q")), 51108, "invalid flag in regex options: q"},
		{d("a", d("$regex", re("x", "i"), "$options", "m")), 51075, "options set in both $regex and $options"},
		{d("a", d("$options", "i")), mongoerr.BadValue, "$options needs a $regex"},
		{d("a", d("$regex", 5)), mongoerr.BadValue, "$regex has to be a string"},
		{d("a", d("$regex", "a\x00b")), 51091, "embedded null byte"},
		{d("a", re(`(a)\1`, "")), mongoerr.NotImplemented, `regular expression /(a)\1/`},
		{d("a", re(`a(?=b)`, "")), mongoerr.NotImplemented, `regular expression /a(?=b)/`},
		{d("a", re(`a++`, "")), mongoerr.NotImplemented, `regular expression /a++/`},
		{d("a", re(`a$\n`, "")), mongoerr.NotImplemented, `regular expression /a$\n/`},
		{d("a", re(`(?m)a$`, "")), mongoerr.NotImplemented, `regular expression /(?m)a$/`},
		{d("a", d("$regex", "x", "$options", "a\x00")), 51108, "invalid flag in regex options"},
		{d("a", d("$in", A{re(`(?<=a)b`, "")})), mongoerr.NotImplemented, `regular expression`},
		{d("a", d("$type", "foo")), mongoerr.BadValue, "Unknown type name alias: foo"},
		{d("a", d("$type", 42)), mongoerr.BadValue, "Invalid numerical type code: 42"},
		{d("a", d("$type", A{})), mongoerr.FailedToParse, "a must match at least one type"},
		{d("a", d("$type", true)), mongoerr.TypeMismatch, "type must be represented as a number or a string"},
		{d("a", d("$size", "2")), mongoerr.BadValue, "$size needs a number"},
		{d("a", d("$size", -1)), mongoerr.BadValue, "$size may not be negative"},
		{d("a", d("$size", 1.5)), mongoerr.BadValue, "$size must be a whole number"},
		{d("a", d("$elemMatch", 1)), mongoerr.BadValue, "$elemMatch needs an Object"},
		{d("a", d("$all", 1)), mongoerr.BadValue, "$all needs an array"},
		{d("a", d("$all", A{d("$elemMatch", d("x", 1)), 1})), mongoerr.BadValue, "$all/$elemMatch has to be consistent"},
		{d("a", d("$all", A{d("$gt", 1)})), mongoerr.BadValue, "no $ expressions in $all"},
		{d("a", d("$in", A{d("$gt", 1)})), mongoerr.BadValue, "cannot nest $ under $in"},
		{d("a", d("$in", 1)), mongoerr.BadValue, `$in of "a" needs an array`},
		{d("a", d("$not", 5)), mongoerr.BadValue, "$not needs a regex or a document"},
		{d("a", d("$not", d())), mongoerr.BadValue, "$not cannot be empty"},
		{d("a", d("$ne", re("x", ""))), mongoerr.BadValue, "Can't have regex as arg to $ne."},
		{d("a", d("$gt", re("x", ""))), mongoerr.NotImplemented, "$gt with a regular expression"},
		{d("a", d("$bitsAllSet", "x")), mongoerr.BadValue, "a takes an Array, a number, or a BinData but received: $bitsAllSet"},
		{d("a", d("$bitsAllSet", -1)), mongoerr.FailedToParse, "Expected a non-negative number in: $bitsAllSet: -1"},
		{d("a", d("$bitsAllSet", 1.5)), mongoerr.FailedToParse, "Expected an integer: $bitsAllSet"},
		{d("a", d("$bitsAnySet", A{-1})), mongoerr.BadValue, "Failed to parse bit position. Expected a non-negative number in: 0"},
		{d("a", d("$bitsAnySet", A{"x"})), mongoerr.BadValue, "Failed to parse bit position. Expected a number in: 0"},
		{d("a", d("$foo", 1)), mongoerr.NotImplemented, "$foo"},
		{d("$or", A{}), mongoerr.BadValue, "nonempty array"},
		{d("$and", 1), mongoerr.BadValue, "$and must be an array"},
		{d("a", d("$eq", bson.Undefined{})), mongoerr.BadValue, "cannot compare to undefined"},
	}
	for _, c := range cases {
		_, err := compiler().Compile(rwtest.Doc(t, c.filter), 0)
		var me *mongoerr.Error
		if !errors.As(err, &me) || me.Code != c.code || !strings.Contains(me.Msg, c.want) {
			t.Errorf("%s: got %v (code %v), want code %v and %q", rwtest.JSON(rwtest.Doc(t, c.filter)), err, mongoerr.CodeOf(err), c.code, c.want)
		}
	}
}

// TestMatchDeepAndMalformed checks that no document, however deep or
// broken, makes a compiled filter panic.
func TestMatchDeepAndMalformed(t *testing.T) {
	filters := []D{
		d("a.b.c", 1),
		d("a.0.b", nil),
		d("a", d("$elemMatch", d("b", d("$gt", 1)))),
		d("a", d("$size", 1)),
		d("a.b", d("$regex", "x")),
		d("a", d("$bitsAllSet", 3)),
		d("a", d("$mod", A{2, 0})),
		d("a", d("$type", "array")),
		d("a.b", d("$exists", false)),
		d("a", d("$all", A{1, 2})),
		d(strings.Repeat("a.", 500)+"a", nil),
	}
	docs := []D{
		d("a", A{d("b", A{1, d("c", 1)}), A{A{d("b", 2)}}, "x"}),
		d("a", d("b", d("c", A{1, 2}))),
		d("a", A{bson.Binary{Data: []byte{1}}, 2.0, re("x", "")}),
	}
	// A document nested as deep as the wire allows, with arrays.
	var deep any = 1
	for i := 0; i < 180; i++ {
		if i%2 == 0 {
			deep = A{d("a", deep)}
		} else {
			deep = d("a", deep)
		}
	}
	docs = append(docs, d("a", deep))
	for _, f := range filters {
		p, err := compiler().Compile(rwtest.Doc(t, f), 0)
		if err != nil {
			t.Fatalf("%v: %v", f, err)
		}
		for _, doc := range docs {
			raw := rwtest.Doc(t, doc)
			p(raw)
			// Every truncation and a byte flipped at every offset.
			for n := 0; n < len(raw); n++ {
				p(bsoncore.Document(raw[:n]))
				b := append([]byte(nil), raw...)
				b[n] ^= 0xff
				p(bsoncore.Document(b))
			}
		}
	}
}

func FuzzMatch(f *testing.F) {
	f.Add([]byte(rwtest.JSON(nil)), []byte{})
	// $options holding a null byte once panicked.
	f.Add([]byte(" \x00\x00\x00\x03\x00%\x00\x00\x00\x02$regex\x00\x03\x00\x00\x00000\x02$options\x00\x04\x00\x00\x0000\x000"), []byte("0"))
	for _, c := range []struct{ filter, doc D }{
		{d("a.b", 1), d("a", A{d("b", 1)})},
		{d("a", d("$elemMatch", d("$gt", 1))), d("a", A{1, 2})},
		{d("a", d("$regex", "^x", "$options", "imx")), d("a", "x")},
		{d("a", d("$bitsAnySet", bson.Binary{Data: []byte{3}})), d("a", 3)},
	} {
		fb, _ := bson.Marshal(c.filter)
		db, _ := bson.Marshal(c.doc)
		f.Add(fb, db)
	}
	f.Fuzz(func(t *testing.T, filter, doc []byte) {
		p, err := compiler().Compile(bsoncore.Document(filter), 0)
		if err != nil {
			return
		}
		p(bsoncore.Document(doc))
	})
}
