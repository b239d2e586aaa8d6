package updateop

import (
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

func ext(t *testing.T, s string) bsoncore.Document {
	t.Helper()
	var d bson.D
	if err := bson.UnmarshalExtJSON([]byte(s), false, &d); err != nil {
		t.Fatalf("%s: %v", s, err)
	}
	b, err := bson.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// value parses u as a statement's u: a document, or a pipeline array.
func value(t *testing.T, s string) bsoncore.Value {
	t.Helper()
	if s[0] == '[' {
		d := ext(t, `{"p": `+s+`}`)
		return d.Lookup("p")
	}
	return bsoncore.Value{Type: bsoncore.TypeEmbeddedDocument, Data: ext(t, s)}
}

func relaxed(t *testing.T, d bsoncore.Document) string {
	t.Helper()
	b, err := bson.MarshalExtJSON(bson.Raw(d), false, false)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

var now = time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)

// TestApply: each update's result as MongoDB 8.0 gives it, field order
// included (new fields in the lexicographic order of their paths).
func TestApply(t *testing.T) {
	for _, c := range []struct{ name, doc, u, want string }{
		{"set existing and new", `{"_id": 1, "v": 1}`, `{"$set": {"v": 2, "b": 1, "a": 1}}`, `{"_id":1,"v":2,"a":1,"b":1}`},
		{"set nested creates documents", `{"_id": 1}`, `{"$set": {"a.b.c": 1}}`, `{"_id":1,"a":{"b":{"c":1}}}`},
		{"set array element pads nulls", `{"_id": 1, "a": [1]}`, `{"$set": {"a.3": 4}}`, `{"_id":1,"a":[1,null,null,4]}`},
		{"set in array element document", `{"_id": 1, "a": [{"x": 1}]}`, `{"$set": {"a.0.y": 2}}`, `{"_id":1,"a":[{"x":1,"y":2}]}`},
		{"unset", `{"_id": 1, "a": 1, "b": {"c": 1, "d": 2}}`, `{"$unset": {"a": "", "b.c": 1, "zz.y": 1}}`, `{"_id":1,"b":{"d":2}}`},
		{"unset array element leaves null", `{"_id": 1, "a": [1, 2]}`, `{"$unset": {"a.0": 1}}`, `{"_id":1,"a":[null,2]}`},
		{"inc int32 stays int32", `{"_id": 1, "n": {"$numberInt": "1"}}`, `{"$inc": {"n": {"$numberInt": "2"}}}`, `{"_id":1,"n":3}`},
		{"inc widens on overflow", `{"_id": 1, "n": {"$numberInt": "2147483647"}}`, `{"$inc": {"n": {"$numberInt": "1"}}}`, `{"_id":1,"n":2147483648}`},
		{"inc by double", `{"_id": 1, "n": {"$numberInt": "1"}}`, `{"$inc": {"n": 0.5}}`, `{"_id":1,"n":1.5}`},
		{"inc missing", `{"_id": 1}`, `{"$inc": {"n": {"$numberLong": "5"}}}`, `{"_id":1,"n":5}`},
		{"mul missing is zero", `{"_id": 1}`, `{"$mul": {"n": 2.5}}`, `{"_id":1,"n":0.0}`},
		{"mul", `{"_id": 1, "n": 3}`, `{"$mul": {"n": 2}}`, `{"_id":1,"n":6}`},
		{"min lower", `{"_id": 1, "v": 5}`, `{"$min": {"v": 3, "w": 1}}`, `{"_id":1,"v":3,"w":1}`},
		{"max not higher", `{"_id": 1, "v": 5}`, `{"$max": {"v": 3}}`, `{"_id":1,"v":5}`},
		{"rename", `{"_id": 1, "a": 1, "z": 2}`, `{"$rename": {"a": "b.c"}}`, `{"_id":1,"z":2,"b":{"c":1}}`},
		{"rename missing is nothing", `{"_id": 1}`, `{"$rename": {"a": "b"}}`, `{"_id":1}`},
		{"currentDate", `{"_id": 1}`, `{"$currentDate": {"d": true}}`, `{"_id":1,"d":{"$date":"2026-12-04T12:00:00Z"}}`},
		{"push", `{"_id": 1, "a": [1]}`, `{"$push": {"a": 2}}`, `{"_id":1,"a":[1,2]}`},
		{"push creates array", `{"_id": 1}`, `{"$push": {"a": {"x": 1}}}`, `{"_id":1,"a":[{"x":1}]}`},
		{"push each position sort slice", `{"_id": 1, "a": [5, 1]}`, `{"$push": {"a": {"$each": [3, 9], "$position": 0, "$sort": -1, "$slice": 3}}}`, `{"_id":1,"a":[9,5,3]}`},
		{"push sort by field", `{"_id": 1, "a": [{"s": 2}, {"s": 1}]}`, `{"$push": {"a": {"$each": [{"s": 0}], "$sort": {"s": 1}}}}`, `{"_id":1,"a":[{"s":0},{"s":1},{"s":2}]}`},
		{"push negative slice", `{"_id": 1, "a": [1, 2, 3]}`, `{"$push": {"a": {"$each": [4], "$slice": -2}}}`, `{"_id":1,"a":[3,4]}`},
		{"addToSet", `{"_id": 1, "a": [1, 2]}`, `{"$addToSet": {"a": {"$each": [2, 3, 3]}}}`, `{"_id":1,"a":[1,2,3]}`},
		{"pop first", `{"_id": 1, "a": [1, 2, 3]}`, `{"$pop": {"a": -1}}`, `{"_id":1,"a":[2,3]}`},
		{"pop last", `{"_id": 1, "a": [1, 2, 3]}`, `{"$pop": {"a": 1}}`, `{"_id":1,"a":[1,2]}`},
		{"pull value", `{"_id": 1, "a": [1, 2, 1]}`, `{"$pull": {"a": 1}}`, `{"_id":1,"a":[2]}`},
		{"pull condition", `{"_id": 1, "a": [1, 5, 9]}`, `{"$pull": {"a": {"$gte": 5}}}`, `{"_id":1,"a":[1]}`},
		{"pull documents by query", `{"_id": 1, "a": [{"k": "x", "n": 1}, {"k": "y"}]}`, `{"$pull": {"a": {"k": "x"}}}`, `{"_id":1,"a":[{"k":"y"}]}`},
		{"pullAll", `{"_id": 1, "a": [1, 2, 3, 2]}`, `{"$pullAll": {"a": [2, 3]}}`, `{"_id":1,"a":[1]}`},
		{"bit", `{"_id": 1, "f": {"$numberInt": "13"}}`, `{"$bit": {"f": {"and": {"$numberInt": "10"}}}}`, `{"_id":1,"f":8}`},
		{"setOnInsert not on update", `{"_id": 1}`, `{"$setOnInsert": {"a": 1}}`, `{"_id":1}`},
		{"set _id to itself", `{"_id": 1, "v": 1}`, `{"$set": {"_id": 1, "v": 2}}`, `{"_id":1,"v":2}`},
		{"replacement keeps _id first", `{"_id": 1, "a": 1}`, `{"b": 2}`, `{"_id":1,"b":2}`},
		{"empty replacement", `{"_id": 1, "a": 1}`, `{}`, `{"_id":1}`},
		{"pipeline set", `{"_id": 1, "v": 2}`, `[{"$set": {"w": {"$multiply": ["$v", 10]}}}, {"$unset": "v"}]`, `{"_id":1,"w":20}`},
		{"pipeline replaceWith keeps _id", `{"_id": 1, "m": {"x": 1}}`, `[{"$replaceWith": "$m"}]`, `{"_id":1,"x":1}`},
	} {
		u, err := Parse(value(t, c.u))
		if err != nil {
			t.Errorf("%s: parse: %v", c.name, err)
			continue
		}
		out, _, err := u.Apply(ext(t, c.doc), Options{Now: now})
		if err != nil {
			t.Errorf("%s: apply: %v", c.name, err)
			continue
		}
		if got := relaxed(t, out); got != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.name, got, c.want)
		}
	}
}

// TestChanged: nModified counts only documents an update changed.
func TestChanged(t *testing.T) {
	for _, c := range []struct {
		doc, u  string
		changed bool
	}{
		{`{"_id": 1, "v": 1}`, `{"$set": {"v": 1}}`, false},
		{`{"_id": 1, "v": 1}`, `{"$set": {"v": 2}}`, true},
		{`{"_id": 1, "a": [1]}`, `{"$addToSet": {"a": 1}}`, false},
		{`{"_id": 1}`, `{"$unset": {"x": 1}}`, false},
		{`{"_id": 1, "v": 5}`, `{"$max": {"v": 1}}`, false},
	} {
		u, err := Parse(value(t, c.u))
		if err != nil {
			t.Fatal(err)
		}
		_, changed, err := u.Apply(ext(t, c.doc), Options{Now: now})
		if err != nil || changed != c.changed {
			t.Errorf("%s on %s: changed %v (%v), want %v", c.u, c.doc, changed, err, c.changed)
		}
	}
}

// TestRefusals: MongoDB's codes for updates it refuses.
func TestRefusals(t *testing.T) {
	for _, c := range []struct {
		name, doc, u string
		code         mongoerr.Code
	}{
		{"unknown modifier", `{"_id": 1}`, `{"$foo": {"a": 1}}`, mongoerr.FailedToParse},
		{"modifier of a non-document", `{"_id": 1}`, `{"$set": 1}`, mongoerr.FailedToParse},
		{"operator in a replacement", `{"_id": 1}`, `{"a": 1, "$set": {"b": 1}}`, mongoerr.DollarPrefixedFieldName},
		{"conflict", `{"_id": 1}`, `{"$set": {"a": 1}, "$inc": {"a.b": 1}}`, mongoerr.ConflictingUpdateOperators},
		{"same path twice", `{"_id": 1}`, `{"$set": {"a": 1}, "$unset": {"a": 1}}`, mongoerr.ConflictingUpdateOperators},
		{"empty path", `{"_id": 1}`, `{"$set": {"a..b": 1}}`, mongoerr.EmptyFieldName},
		{"inc non-number", `{"_id": 1}`, `{"$inc": {"a": "x"}}`, mongoerr.TypeMismatch},
		{"inc a string", `{"_id": 1, "a": "s"}`, `{"$inc": {"a": 1}}`, mongoerr.TypeMismatch},
		{"inc overflows int64", `{"_id": 1, "a": {"$numberLong": "9223372036854775807"}}`, `{"$inc": {"a": 1}}`, mongoerr.BadValue},
		{"push on a non-array", `{"_id": 1, "a": 1}`, `{"$push": {"a": 1}}`, mongoerr.BadValue},
		{"each of a non-array", `{"_id": 1}`, `{"$push": {"a": {"$each": 1}}}`, mongoerr.BadValue},
		{"pop of 2", `{"_id": 1}`, `{"$pop": {"a": 2}}`, mongoerr.FailedToParse},
		{"change _id", `{"_id": 1}`, `{"$set": {"_id": 2}}`, mongoerr.ImmutableField},
		{"replace _id", `{"_id": 1}`, `{"_id": 2, "a": 1}`, mongoerr.ImmutableField},
		{"set through a scalar", `{"_id": 1, "a": 1}`, `{"$set": {"a.b": 1}}`, mongoerr.PathNotViable},
		{"set a name in an array", `{"_id": 1, "a": [1]}`, `{"$set": {"a.b": 1}}`, mongoerr.PathNotViable},
		{"rename through an array", `{"_id": 1, "a": [{"b": 1}]}`, `{"$rename": {"a.0.b": "c"}}`, mongoerr.BadValue},
		{"rename to itself", `{"_id": 1}`, `{"$rename": {"a": "a"}}`, mongoerr.BadValue},
		{"positional", `{"_id": 1}`, `{"$set": {"a.$": 1}}`, mongoerr.NotImplemented},
		{"pipeline $match", `{"_id": 1}`, `[{"$match": {}}]`, mongoerr.InvalidOptions},
		{"update of a number", `{"_id": 1}`, `1`, mongoerr.TypeMismatch},
	} {
		var uv bsoncore.Value
		if c.u == "1" {
			uv = bsoncore.Value{Type: bsoncore.TypeInt32, Data: bsoncore.AppendInt32(nil, 1)}
		} else {
			uv = value(t, c.u)
		}
		u, err := Parse(uv)
		if err == nil {
			_, _, err = u.Apply(ext(t, c.doc), Options{Now: now})
		}
		if got := mongoerr.CodeOf(err); got != c.code {
			t.Errorf("%s: code %v (%v), want %v", c.name, got, err, c.code)
		}
	}
}

// TestUpserted: the new document of an upsert that matched nothing.
func TestUpserted(t *testing.T) {
	for _, c := range []struct{ name, filter, u, want string }{
		{"equalities and operators", `{"meta": "s1", "n": {"$eq": 2}, "v": {"$gt": 1}}`, `{"$set": {"v": 5}, "$setOnInsert": {"x": 1}}`, `{"meta":"s1","n":2,"v":5,"x":1}`},
		{"$and and dotted", `{"$and": [{"a.b": 1}, {"c": 2}]}`, `{"$inc": {"k": 1}}`, `{"a":{"b":1},"c":2,"k":1}`},
		{"replacement takes the filter's _id", `{"_id": 7, "v": 1}`, `{"w": 2}`, `{"_id":7,"w":2}`},
		{"pipeline", `{"s": "a"}`, `[{"$set": {"t": "$s"}}]`, `{"s":"a","t":"a"}`},
	} {
		u, err := Parse(value(t, c.u))
		if err != nil {
			t.Fatal(err)
		}
		out, err := u.Upserted(ext(t, c.filter), now)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if got := relaxed(t, out); got != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.name, got, c.want)
		}
	}
}

// TestArgumentsNotShared: one argument set into many documents is copied
// into each, so a later change of one leaves the others as they were.
func TestArgumentsNotShared(t *testing.T) {
	u, _ := Parse(value(t, `{"$set": {"a": {"b": [1]}}}`))
	first, _, _ := u.Apply(ext(t, `{"_id": 1}`), Options{})
	push, _ := Parse(value(t, `{"$push": {"a.b": 2}}`))
	if _, _, err := push.Apply(first, Options{}); err != nil {
		t.Fatal(err)
	}
	second, _, _ := u.Apply(ext(t, `{"_id": 2}`), Options{})
	if got := relaxed(t, second); got != `{"_id":2,"a":{"b":[1]}}` {
		t.Fatalf("second document %s", got)
	}
}

// TestNumberTypes: $inc and $mul keep int32 where the result fits, widen
// to int64 where it does not, and make a double of a double.
func TestNumberTypes(t *testing.T) {
	for _, c := range []struct {
		doc, u string
		want   bsoncore.Type
	}{
		{`{"n": {"$numberInt": "1"}}`, `{"$inc": {"n": {"$numberInt": "2"}}}`, bsoncore.TypeInt32},
		{`{"n": {"$numberInt": "2147483647"}}`, `{"$inc": {"n": {"$numberInt": "1"}}}`, bsoncore.TypeInt64},
		{`{"n": {"$numberInt": "1"}}`, `{"$inc": {"n": {"$numberLong": "1"}}}`, bsoncore.TypeInt64},
		{`{"n": {"$numberInt": "65536"}}`, `{"$mul": {"n": {"$numberInt": "65536"}}}`, bsoncore.TypeInt64},
		{`{"n": {"$numberLong": "1"}}`, `{"$inc": {"n": 0.5}}`, bsoncore.TypeDouble},
		{`{}`, `{"$inc": {"n": {"$numberLong": "5"}}}`, bsoncore.TypeInt64},
	} {
		u, err := Parse(value(t, c.u))
		if err != nil {
			t.Fatal(err)
		}
		out, _, err := u.Apply(ext(t, c.doc), Options{})
		if err != nil {
			t.Fatal(err)
		}
		if got := out.Lookup("n").Type; got != c.want {
			t.Errorf("%s on %s: %s, want %s", c.u, c.doc, got, c.want)
		}
	}
}

// TestArrayFilters: $[] updates every element, $[<id>] those its filter
// matches; an identifier without a filter, or a filter no path uses, is
// MongoDB's error.
func TestArrayFilters(t *testing.T) {
	filters := func(s string) bsoncore.Value { return ext(t, `{"f": `+s+`}`).Lookup("f") }
	for _, c := range []struct{ name, doc, u, af, want string }{
		{"$[] of scalars", `{"_id": 1, "a": [1, 2, 3]}`, `{"$inc": {"a.$[]": 10}}`, ``, `{"_id":1,"a":[11,12,13]}`},
		{"$[] into documents", `{"_id": 1, "a": [{"v": 1}, {"v": 2}]}`, `{"$set": {"a.$[].ok": true}}`, ``, `{"_id":1,"a":[{"v":1,"ok":true},{"v":2,"ok":true}]}`},
		{"$[x] of scalars", `{"_id": 1, "a": [1, 5, 9]}`, `{"$set": {"a.$[big]": 0}}`, `[{"big": {"$gte": 5}}]`, `{"_id":1,"a":[1,0,0]}`},
		{"$[x] of documents", `{"_id": 1, "r": [{"k": "t", "v": 1}, {"k": "h", "v": 2}]}`, `{"$mul": {"r.$[e].v": 10}}`, `[{"e.k": "h"}]`, `{"_id":1,"r":[{"k":"t","v":1},{"k":"h","v":20}]}`},
	} {
		var af bsoncore.Value
		if c.af != "" {
			af = filters(c.af)
		}
		u, err := ParseWithFilters(value(t, c.u), af)
		if err != nil {
			t.Errorf("%s: parse: %v", c.name, err)
			continue
		}
		out, _, err := u.Apply(ext(t, c.doc), Options{})
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if got := relaxed(t, out); got != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.name, got, c.want)
		}
	}
	for _, c := range []struct {
		name, doc, u, af string
		code             mongoerr.Code
	}{
		{"no filter for the identifier", `{"_id": 1}`, `{"$set": {"a.$[x]": 1}}`, `[]`, mongoerr.BadValue},
		{"a filter not used", `{"_id": 1}`, `{"$set": {"a": 1}}`, `[{"x": 1}]`, mongoerr.FailedToParse},
		{"two identifiers in one filter", `{"_id": 1}`, `{"$set": {"a.$[x]": 1}}`, `[{"x": 1, "y": 2}]`, mongoerr.FailedToParse},
		{"a bad identifier", `{"_id": 1}`, `{"$set": {"a.$[X]": 1}}`, `[{"X": 1}]`, mongoerr.BadValue},
		{"$[] on a missing array", `{"_id": 1}`, `{"$set": {"a.$[]": 1}}`, ``, mongoerr.BadValue},
		{"$[] on a scalar", `{"_id": 1, "a": 3}`, `{"$set": {"a.$[]": 1}}`, ``, mongoerr.BadValue},
		{"filters on a replacement", `{"_id": 1}`, `{"a": 1}`, `[{"x": 1}]`, mongoerr.FailedToParse},
	} {
		var af bsoncore.Value
		if c.af != "" {
			af = filters(c.af)
		}
		u, err := ParseWithFilters(value(t, c.u), af)
		if err == nil {
			_, _, err = u.Apply(ext(t, c.doc), Options{})
		}
		if got := mongoerr.CodeOf(err); got != c.code {
			t.Errorf("%s: code %v (%v), want %v", c.name, got, err, c.code)
		}
	}
}
