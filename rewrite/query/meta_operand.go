package query

import (
	"bytes"
	"strconv"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/match"
)

// A bucket keeps its series' meta in the stored form (bucket.StoredMeta:
// field names FerretDB cannot store escaped), so a predicate on the
// metaField compares its values in that form too.

// storedMetaPath is the bucket path of metaField path rest (".x.y", or
// "" for the metaField itself).
func storedMetaPath(rest string) string {
	return bucket.FieldMeta + bucket.EscapeMetaPath(rest)
}

// storedMetaOperand is a predicate's operand on a metaField path (a value
// or an operator document) with the values it compares in the stored
// form; v itself when none changes.
func storedMetaOperand(v bsoncore.Value) bsoncore.Value {
	ops, isOps := match.IsOperatorDoc(v)
	if !isOps {
		return bucket.EscapeMeta(v)
	}
	elems, err := ops.Elements()
	if err != nil {
		return v
	}
	idx, out := bsoncore.AppendDocumentStart(nil)
	for _, e := range elems {
		out = bsoncore.AppendValueElement(out, e.Key(), storedOperatorValue(e.Key(), e.Value()))
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	if bytes.Equal(out, ops) {
		return v
	}
	return bsoncore.Value{Type: bsoncore.TypeEmbeddedDocument, Data: out}
}

// storedOperatorValue is the operand of one query operator in the
// stored form: the compared value or values of the comparison operators,
// $not's operators; the others compare no document ($exists, $type,
// $size, $regex, ...) and stay as they are. $elemMatch's operand is a
// filter: names inside it are compared as written.
func storedOperatorValue(op string, v bsoncore.Value) bsoncore.Value {
	switch op {
	case "$eq", "$ne", "$gt", "$gte", "$lt", "$lte":
		return bucket.EscapeMeta(v)
	case "$in", "$nin", "$all":
		arr, ok := v.ArrayOK()
		if !ok {
			return v
		}
		vals, err := arr.Values()
		if err != nil {
			return v
		}
		idx, out := bsoncore.AppendArrayStart(nil)
		for i, x := range vals {
			out = bsoncore.AppendValueElement(out, strconv.Itoa(i), bucket.EscapeMeta(x))
		}
		out, _ = bsoncore.AppendArrayEnd(out, idx)
		return bsoncore.Value{Type: bsoncore.TypeArray, Data: out}
	case "$not":
		if _, isOps := match.IsOperatorDoc(v); isOps {
			return storedMetaOperand(v)
		}
	}
	return v
}
