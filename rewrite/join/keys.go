package join

import (
	"strings"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/expr"
)

var nullValue = bsoncore.Value{Type: bsoncore.TypeNull}

func splitPath(p string) []string { return strings.Split(p, ".") }

func docValue(doc bsoncore.Document) bsoncore.Value {
	return bsoncore.Value{Type: bsoncore.TypeEmbeddedDocument, Data: doc}
}

// localValues are the values a local document joins by at path: through
// arrays of documents, a leaf array's elements (one level: a nested array
// is a value); none (a missing field, an empty array) is null, which
// matches null and missing foreign fields.
func localValues(doc bsoncore.Document, path []string) []bsoncore.Value {
	var out []bsoncore.Value
	var walk func(v bsoncore.Value, parts []string)
	walk = func(v bsoncore.Value, parts []string) {
		if len(parts) == 0 {
			if v.Type == bsoncore.TypeArray {
				vals, _ := v.Array().Values()
				out = append(out, vals...)
				return
			}
			out = append(out, v)
			return
		}
		switch v.Type {
		case bsoncore.TypeEmbeddedDocument:
			next, err := v.Document().LookupErr(parts[0])
			if err == nil {
				walk(next, parts[1:])
			}
		case bsoncore.TypeArray:
			vals, _ := v.Array().Values()
			for _, el := range vals {
				if el.Type == bsoncore.TypeEmbeddedDocument {
					walk(el, parts)
				}
			}
		}
	}
	walk(docValue(doc), path)
	if len(out) == 0 {
		out = append(out, nullValue)
	}
	return out
}

// foreignKeys are the keys a foreign document is found by at path, as a
// query {path: value} finds it: a leaf array by each element and as a
// whole (an empty array by itself only), a missing field (also in a
// document of an array on the path) as null.
func foreignKeys(doc bsoncore.Document, path []string) []string {
	var out []string
	var walk func(v bsoncore.Value, parts []string, inArray bool)
	walk = func(v bsoncore.Value, parts []string, inArray bool) {
		if len(parts) == 0 {
			if v.Type == bsoncore.TypeArray {
				vals, _ := v.Array().Values()
				for _, el := range vals {
					out = append(out, expr.Key(el))
				}
			}
			out = append(out, expr.Key(v))
			return
		}
		switch v.Type {
		case bsoncore.TypeEmbeddedDocument:
			next, err := v.Document().LookupErr(parts[0])
			if err != nil {
				out = append(out, expr.Key(nullValue))
				return
			}
			walk(next, parts[1:], false)
		case bsoncore.TypeArray:
			vals, _ := v.Array().Values()
			for _, el := range vals {
				if el.Type == bsoncore.TypeEmbeddedDocument {
					walk(el, parts, true)
				}
			}
		default:
			if !inArray {
				out = append(out, expr.Key(nullValue))
			}
		}
	}
	walk(docValue(doc), path, false)
	return out
}

// keySet is a set of values by expr.Key, keeping the first value of each
// key in order (the $in list of a foreign read).
type keySet struct {
	has    map[string]bool
	values []bsoncore.Value
}

func (s *keySet) add(v bsoncore.Value) string {
	k := expr.Key(v)
	if s.has == nil {
		s.has = map[string]bool{}
	}
	if !s.has[k] {
		s.has[k] = true
		s.values = append(s.values, v)
	}
	return k
}

// inFilter is {path: {$in: values}} and'ed with extra (nil: none).
func inFilter(path string, values []bsoncore.Value, extra bsoncore.Document) bsoncore.Document {
	ab := bsoncore.NewArrayBuilder()
	for _, v := range values {
		ab.AppendValue(v)
	}
	in := bsoncore.NewDocumentBuilder().AppendDocument(path, bsoncore.NewDocumentBuilder().AppendArray("$in", ab.Build()).Build()).Build()
	return andFilters(in, extra)
}

// andFilters is the conjunction of the filters given (nil ones left out).
func andFilters(filters ...bsoncore.Document) bsoncore.Document {
	var keep []bsoncore.Document
	for _, f := range filters {
		if elems, _ := f.Elements(); len(elems) > 0 {
			keep = append(keep, f)
		}
	}
	switch len(keep) {
	case 0:
		return nil
	case 1:
		return keep[0]
	}
	ab := bsoncore.NewArrayBuilder()
	for _, f := range keep {
		ab.AppendDocument(f)
	}
	return bsoncore.NewDocumentBuilder().AppendArray("$and", ab.Build()).Build()
}

// setPath is doc with the field at dotted path set to v: in place where
// it is, else appended; a part of the path that is not a document is
// replaced by one, as $lookup's "as" does.
func setPath(doc bsoncore.Document, path []string, v bsoncore.Value) bsoncore.Document {
	idx, out := bsoncore.AppendDocumentStart(nil)
	elems, _ := doc.Elements()
	set := false
	for _, e := range elems {
		if e.Key() != path[0] {
			out = bsoncore.AppendValueElement(out, e.Key(), e.Value())
			continue
		}
		set = true
		out = bsoncore.AppendValueElement(out, path[0], nested(e.Value(), path[1:], v))
	}
	if !set {
		out = bsoncore.AppendValueElement(out, path[0], nested(bsoncore.Value{}, path[1:], v))
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return out
}

func nested(cur bsoncore.Value, rest []string, v bsoncore.Value) bsoncore.Value {
	if len(rest) == 0 {
		return v
	}
	var sub bsoncore.Document
	if d, ok := cur.DocumentOK(); ok {
		sub = d
	} else {
		sub = bsoncore.NewDocumentBuilder().Build()
	}
	return docValue(setPath(sub, rest, v))
}

// docsArray is docs as an array value.
func docsArray(docs []bsoncore.Document) bsoncore.Value {
	ab := bsoncore.NewArrayBuilder()
	for _, d := range docs {
		ab.AppendDocument(d)
	}
	return bsoncore.Value{Type: bsoncore.TypeArray, Data: ab.Build()}
}
