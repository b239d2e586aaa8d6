package agg

import (
	"slices"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/expr"
	"github.com/tsproxy/tsproxy/rewrite/expr/value"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// The stages that see a partition's documents together ($setWindowFields,
// $densify, $fill) hold their input in a buffer, then cut it into
// partitions ordered by key.

// buffer holds a stage's input within its memory budget.
type buffer struct {
	stage string
	docs  []bsoncore.Document
	bytes int
	max   int
}

func (b *buffer) Add(doc bsoncore.Document) error {
	b.bytes += 2*len(doc) + 48
	if b.bytes > b.max {
		return exceeded(b.stage, b.max)
	}
	b.docs = append(b.docs, slices.Clone(doc))
	return nil
}

// take returns the documents held and empties the buffer.
func (b *buffer) take() []bsoncore.Document {
	docs := b.docs
	b.docs = nil
	return docs
}

// partitionKey says which partition a document is in: an expression
// (partitionBy), fields (partitionByFields), or neither (one partition).
type partitionKey struct {
	expr   expr.Expr
	fields [][]string
}

func (k partitionKey) of(doc bsoncore.Document) (value.Value, error) {
	switch {
	case k.expr != nil:
		v, err := k.expr.Eval(doc)
		if err != nil || v.Type == 0 {
			return value.Null, err
		}
		return value.Clone(v), nil
	case k.fields != nil:
		idx, arr := bsoncore.AppendArrayStart(nil)
		for i, p := range k.fields {
			v := expr.LookupPath(value.Value{Type: bsoncore.TypeEmbeddedDocument, Data: doc}, p)
			if v.Type == 0 {
				v = value.Null
			}
			arr = bsoncore.AppendValueElement(arr, bsonutil.Itoa(i), v)
		}
		arr, _ = bsoncore.AppendArrayEnd(arr, idx)
		return value.Value{Type: bsoncore.TypeArray, Data: arr}, nil
	}
	return value.Null, nil
}

// field is the value of partitionByFields' i-th field in key.
func (k partitionKey) field(key value.Value, i int) value.Value {
	v, _ := key.Array().IndexErr(uint(i))
	return v
}

type partition struct {
	key  value.Value
	docs []bsoncore.Document
}

// partitions cuts docs by k, in key order, each sorted by keys.
func (k partitionKey) partitions(docs []bsoncore.Document, keys []sortKey) ([]*partition, error) {
	byKey := map[string]int{}
	var parts []*partition
	for _, d := range docs {
		key, err := k.of(d)
		if err != nil {
			return nil, err
		}
		if err := checkSortPaths("sortBy", keys, d); err != nil {
			return nil, err
		}
		gk := string(value.GroupKey(nil, key))
		i, ok := byKey[gk]
		if !ok {
			i = len(parts)
			byKey[gk] = i
			parts = append(parts, &partition{key: key})
		}
		parts[i].docs = append(parts[i].docs, d)
	}
	slices.SortStableFunc(parts, func(a, b *partition) int { return value.Compare(a.key, b.key) })
	if len(keys) > 0 {
		sorter := &sortStage{keys: keys}
		for _, p := range parts {
			slices.SortStableFunc(p.docs, sorter.compareDocs)
		}
	}
	return parts, nil
}

// readPartitionFields reads a partitionByFields array of field paths.
func readPartitionFields(stage string, v value.Value) ([][]string, error) {
	arr, ok := v.ArrayOK()
	vals, _ := arr.Values()
	if !ok {
		return nil, value.BadValue(mongoerr.TypeMismatch, "%s 'partitionByFields' must be an array of field paths", stage)
	}
	var out [][]string
	for _, pv := range vals {
		s, ok := pv.StringValueOK()
		if !ok || s == "" || s[0] == '$' {
			return nil, value.BadValue(mongoerr.TypeMismatch, "%s 'partitionByFields' must be an array of field paths", stage)
		}
		out = append(out, splitPath(s))
	}
	return out, nil
}

// readSortBy reads a sortBy document as $sort's keys.
func readSortBy(v value.Value) ([]sortKey, error) {
	s, err := compileSort(v, nil, Options{})
	if err != nil {
		return nil, err
	}
	return s.(*sortStage).keys, nil
}

// partitioned is what $setWindowFields and $fill are given alike.
type partitioned struct {
	by     partitionKey
	keys   []sortKey
	output bsoncore.Document
}

// readPartitioned reads partitionBy (and, where fields is set,
// partitionByFields), sortBy and the required output of stage.
func readPartitioned(stage string, d bsoncore.Document, fields bool) (partitioned, error) {
	var p partitioned
	elems, _ := d.Elements()
	for _, e := range elems {
		var err error
		switch k := e.Key(); {
		case k == "partitionBy":
			p.by.expr, err = expr.CompileTop(e.Value(), 1)
		case k == "partitionByFields" && fields:
			p.by.fields, err = readPartitionFields(stage, e.Value())
		case k == "sortBy":
			p.keys, err = readSortBy(e.Value())
		case k == "output":
			o, ok := e.Value().DocumentOK()
			if !ok {
				return p, value.BadValue(mongoerr.TypeMismatch, "%s 'output' must be an object", stage)
			}
			p.output = o
		default:
			return p, value.BadValue(mongoerr.IDLUnknownField, "BSON field '%s.%s' is an unknown field.", stage, k)
		}
		if err != nil {
			return p, err
		}
	}
	if p.output == nil {
		return p, value.BadValue(mongoerr.IDLFailedToParse, "BSON field '%s.output' is missing but a required field", stage)
	}
	if p.by.expr != nil && p.by.fields != nil {
		return p, value.BadValue(6050204, "Maximum one of 'partitionBy' and 'partitionByFields' can be specified in '%s'", stage)
	}
	return p, nil
}
