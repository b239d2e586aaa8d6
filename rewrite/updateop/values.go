package updateop

import (
	"math"
	"strconv"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
)

// Values are what bson.Unmarshal makes of a document into bson.D: bson.D
// for documents, bson.A for arrays, int32, int64, float64,
// bson.Decimal128, string, bool, nil and the driver's types for the rest.

func isNumber(v any) bool {
	switch v.(type) {
	case int32, int64, float64, bson.Decimal128:
		return true
	}
	return false
}

func toFloat(v any) (float64, bool) {
	switch n := v.(type) {
	case int32:
		return float64(n), true
	case int64:
		return float64(n), true
	case float64:
		return n, true
	}
	return 0, false
}

// toInt reads an integral number (a double of an integral value too).
func toInt(v any) (int64, bool) {
	switch n := v.(type) {
	case int32:
		return int64(n), true
	case int64:
		return n, true
	case float64:
		if n == math.Trunc(n) && !math.IsInf(n, 0) {
			return int64(n), true
		}
	}
	return 0, false
}

func lookupD(d bson.D, key string) (any, bool) {
	for _, e := range d {
		if e.Key == key {
			return e.Value, true
		}
	}
	return nil, false
}

// core is v as a bsoncore value (for comparisons and messages).
func core(v any) bsoncore.Value {
	t, data, err := bson.MarshalValue(v)
	if err != nil {
		return bsoncore.Value{Type: bsoncore.TypeNull}
	}
	return bsoncore.Value{Type: bsoncore.Type(t), Data: data}
}

// compare orders two values as MongoDB does (bsonutil.Compare).
func compare(a, b any) int { return bsonutil.Compare(core(a), core(b)) }

func show(v any) string {
	if s, ok := v.(string); ok {
		return strconv.Quote(s)
	}
	return core(v).String()
}

func typeName(v any) string { return bsonutil.TypeName(core(v).Type) }

// clone deep-copies a value, so that one argument set into many
// documents is never shared by two.
func clone(v any) any {
	switch x := v.(type) {
	case bson.D:
		out := make(bson.D, len(x))
		for i, e := range x {
			out[i] = bson.E{Key: e.Key, Value: clone(e.Value)}
		}
		return out
	case bson.A:
		out := make(bson.A, len(x))
		for i, e := range x {
			out[i] = clone(e)
		}
		return out
	}
	return v
}

// arrayIndex reads a path component as an array index.
func arrayIndex(s string) (int, bool) {
	if s == "" || (len(s) > 1 && s[0] == '0') {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, false
	}
	return n, true
}
