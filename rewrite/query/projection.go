package query

import (
	"strconv"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// Projection is a find Projection (or a $project stage) of inclusions or
// exclusions, applied by the proxy to each reshaped event. Computed fields,
// positional paths and the $slice/$elemMatch/$meta operators are refused.
type Projection struct {
	Inclusion bool
	ExcludeID bool // inclusion: _id: 0 given
	root      *projNode
}

type projNode struct {
	leaf     bool
	children map[string]*projNode
}

func (n *projNode) child(name string) *projNode {
	if n == nil || n.children == nil {
		return nil
	}
	return n.children[name]
}

// apply projects one document.
func (p *Projection) Apply(doc bsoncore.Document) (bsoncore.Document, error) {
	if p == nil {
		return doc, nil
	}
	idx, out := bsoncore.AppendDocumentStart(make([]byte, 0, len(doc)))
	var err error
	if p.Inclusion {
		out, err = includeFields(out, doc, p.root, true, p.ExcludeID, 0)
	} else {
		out, err = excludeFields(out, doc, p.root, 0)
	}
	if err != nil {
		return nil, err
	}
	return bsoncore.AppendDocumentEnd(out, idx)
}

func includeFields(dst []byte, doc bsoncore.Document, n *projNode, top, excludeID bool, depth int) ([]byte, error) {
	if depth > bsonutil.MaxDepth {
		return nil, mongoerr.Errorf(mongoerr.BadValue, "document nested too deep to project")
	}
	elems, err := doc.Elements()
	if err != nil {
		return nil, err
	}
	for _, e := range elems {
		k := e.Key()
		c := n.child(k)
		if top && k == "_id" && c == nil {
			if !excludeID {
				dst = append(dst, e...)
			}
			continue
		}
		if c == nil {
			continue
		}
		if c.leaf {
			dst = append(dst, e...)
			continue
		}
		v := e.Value()
		switch v.Type {
		case bsoncore.TypeEmbeddedDocument:
			idx, out := bsoncore.AppendDocumentElementStart(dst, k)
			out, err = includeFields(out, v.Data, c, false, false, depth+1)
			if err != nil {
				return nil, err
			}
			dst, _ = bsoncore.AppendDocumentEnd(out, idx)
		case bsoncore.TypeArray:
			idx, out := bsoncore.AppendArrayElementStart(dst, k)
			out, err = includeArray(out, v.Data, c, depth+1)
			if err != nil {
				return nil, err
			}
			dst, _ = bsoncore.AppendArrayEnd(out, idx)
		}
		// Scalars under a path that goes deeper are left out.
	}
	return dst, nil
}

// includeArray projects each document of an array (and of nested arrays);
// other elements are left out, as MongoDB does.
func includeArray(dst []byte, arr []byte, n *projNode, depth int) ([]byte, error) {
	if depth > bsonutil.MaxDepth {
		return nil, mongoerr.Errorf(mongoerr.BadValue, "document nested too deep to project")
	}
	vals, err := bsoncore.Array(arr).Values()
	if err != nil {
		return nil, err
	}
	i := 0
	for _, v := range vals {
		key := strconv.Itoa(i)
		switch v.Type {
		case bsoncore.TypeEmbeddedDocument:
			idx, out := bsoncore.AppendDocumentElementStart(dst, key)
			out, err = includeFields(out, v.Data, n, false, false, depth+1)
			if err != nil {
				return nil, err
			}
			dst, _ = bsoncore.AppendDocumentEnd(out, idx)
			i++
		case bsoncore.TypeArray:
			idx, out := bsoncore.AppendArrayElementStart(dst, key)
			out, err = includeArray(out, v.Data, n, depth+1)
			if err != nil {
				return nil, err
			}
			dst, _ = bsoncore.AppendArrayEnd(out, idx)
			i++
		}
	}
	return dst, nil
}

func excludeFields(dst []byte, doc bsoncore.Document, n *projNode, depth int) ([]byte, error) {
	if depth > bsonutil.MaxDepth {
		return nil, mongoerr.Errorf(mongoerr.BadValue, "document nested too deep to project")
	}
	elems, err := doc.Elements()
	if err != nil {
		return nil, err
	}
	for _, e := range elems {
		k := e.Key()
		c := n.child(k)
		if c == nil {
			dst = append(dst, e...)
			continue
		}
		if c.leaf {
			continue
		}
		if dst, err = excludeValue(dst, k, e.Value(), c, depth); err != nil {
			return nil, err
		}
	}
	return dst, nil
}

func excludeArray(dst []byte, arr []byte, n *projNode, depth int) ([]byte, error) {
	if depth > bsonutil.MaxDepth {
		return nil, mongoerr.Errorf(mongoerr.BadValue, "document nested too deep to project")
	}
	vals, err := bsoncore.Array(arr).Values()
	if err != nil {
		return nil, err
	}
	for i, v := range vals {
		if dst, err = excludeValue(dst, strconv.Itoa(i), v, n, depth); err != nil {
			return nil, err
		}
	}
	return dst, nil
}

// excludeValue appends key: v with n's exclusions applied inside it: a
// document or an array (whose documents MongoDB projects element by
// element) is rebuilt, any other value kept as it is.
func excludeValue(dst []byte, key string, v bsoncore.Value, n *projNode, depth int) ([]byte, error) {
	var err error
	switch v.Type {
	case bsoncore.TypeEmbeddedDocument:
		idx, out := bsoncore.AppendDocumentElementStart(dst, key)
		if out, err = excludeFields(out, v.Data, n, depth+1); err != nil {
			return nil, err
		}
		dst, _ = bsoncore.AppendDocumentEnd(out, idx)
	case bsoncore.TypeArray:
		idx, out := bsoncore.AppendArrayElementStart(dst, key)
		if out, err = excludeArray(out, v.Data, n, depth+1); err != nil {
			return nil, err
		}
		dst, _ = bsoncore.AppendArrayEnd(out, idx)
	default:
		dst = bsoncore.AppendValueElement(dst, key, v)
	}
	return dst, nil
}
