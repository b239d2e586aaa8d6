package query

import (
	"strconv"
	"strings"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"go.mongodb.org/mongo-driver/v2/bson"
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

// parseProjection reads a projection document; nil (no error) means no
// projection at all ({} or absent). what names it in errors ("find option
// \"projection\"" or "$project").
func (rc *Ctx) ParseProjection(spec bsoncore.Document, what string) (*Projection, error) {
	if len(spec) == 0 {
		return nil, nil
	}
	var entries []projEntry
	if err := rc.flattenProjection(&entries, "", spec, what, 0); err != nil {
		return nil, err
	}
	if len(entries) == 0 {
		if what == "$project" {
			return nil, rc.BadValue(mongoerr.BadValue, "$project specification must have at least one field")
		}
		return nil, nil
	}
	inclusion, err := rc.projectionMode(entries)
	if err != nil {
		return nil, err
	}
	p := &Projection{root: &projNode{children: map[string]*projNode{}}, Inclusion: inclusion}
	idIncluded, idGiven := true, false
	for _, en := range entries {
		if en.path == "_id" {
			idGiven, idIncluded = true, en.include
			continue
		}
		if err := rc.insertPath(p.root, en.path); err != nil {
			return nil, err
		}
	}
	if p.Inclusion {
		p.ExcludeID = idGiven && !idIncluded
		if idGiven && idIncluded && p.root.children["_id"] == nil {
			p.root.children["_id"] = &projNode{leaf: true}
		}
	} else if idGiven && !idIncluded {
		if err := rc.insertPath(p.root, "_id"); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// projEntry is one dotted path of a projection and whether it includes.
type projEntry struct {
	path    string
	include bool
}

// flattenProjection lists the projection's paths, nested documents
// spelled out as dotted paths; operators and computed fields are refused.
func (rc *Ctx) flattenProjection(out *[]projEntry, prefix string, d bsoncore.Document, what string, depth int) error {
	if depth > bsonutil.MaxDepth {
		return rc.BadValue(mongoerr.BadValue, "%s nested too deep", what)
	}
	elems, err := d.Elements()
	if err != nil {
		return rc.BadValue(mongoerr.InvalidBSON, "%s is not valid BSON: %v", what, err)
	}
	for _, e := range elems {
		k := e.Key()
		path := k
		if prefix != "" {
			path = prefix + "." + k
		}
		if strings.HasPrefix(k, "$") || strings.Contains(k, ".$") || k == "" || strings.HasPrefix(k, ".") || strings.HasSuffix(k, ".") || strings.Contains(k, "..") {
			return rc.Unsupported("%s path %q (positional or $-prefixed paths) is not supported on a bucketed namespace", what, path)
		}
		v := e.Value()
		switch v.Type {
		case bsoncore.TypeBoolean, bsoncore.TypeInt32, bsoncore.TypeInt64, bsoncore.TypeDouble, bsoncore.TypeDecimal128:
			*out = append(*out, projEntry{path, projectionTruthy(v)})
		case bsoncore.TypeEmbeddedDocument:
			sub := bsoncore.Document(v.Data)
			if se, err := sub.Elements(); err == nil && len(se) > 0 && strings.HasPrefix(se[0].Key(), "$") {
				return rc.Unsupported("%s operator %q on %q is not supported on a bucketed namespace", what, se[0].Key(), path)
			}
			if err := rc.flattenProjection(out, path, sub, what, depth+1); err != nil {
				return err
			}
		default:
			return rc.Unsupported("%s: computed field %q (a %s value) is not supported on a bucketed namespace; use 1/true or 0/false", what, path, bsonutil.TypeName(v.Type))
		}
	}
	return nil
}

// projectionTruthy reads a projection value as MongoDB does: false and
// numeric zero exclude, anything else includes.
func projectionTruthy(v bsoncore.Value) bool {
	switch v.Type {
	case bsoncore.TypeBoolean:
		return v.Boolean()
	case bsoncore.TypeDecimal128:
		if h, l, ok := v.Decimal128OK(); ok {
			if d, _, err := bson.NewDecimal128(h, l).BigInt(); err == nil && d.Sign() == 0 {
				return false
			}
		}
		return true
	}
	f, ok := v.AsFloat64OK()
	return !ok || f != 0
}

// projectionMode says whether the projection includes (true) or excludes;
// _id alone decides when it is the only path, and mixing is refused.
func (rc *Ctx) projectionMode(entries []projEntry) (bool, error) {
	mode := 0 // 0 unknown, 1 inclusion, -1 exclusion
	idIncluded := true
	for _, en := range entries {
		if en.path == "_id" {
			idIncluded = en.include
			continue
		}
		m := -1
		if en.include {
			m = 1
		}
		if mode != 0 && m != mode {
			kind, where := "exclusion", "inclusion"
			if m == 1 {
				kind, where = "inclusion", "exclusion"
			}
			return false, rc.BadValue(mongoerr.ProjectionMixed, "Cannot do %s on field %s in %s projection", kind, en.path, where)
		}
		mode = m
	}
	if mode == 0 {
		return idIncluded, nil
	}
	return mode == 1, nil
}

func (rc *Ctx) insertPath(root *projNode, path string) error {
	parts := strings.Split(path, ".")
	n := root
	for i, part := range parts {
		if n.leaf {
			return rc.BadValue(mongoerr.ProjectionCollide, "Path collision at %s remaining portion %s", path, strings.Join(parts[i:], "."))
		}
		if n.children == nil {
			n.children = map[string]*projNode{}
		}
		c := n.children[part]
		if c == nil {
			c = &projNode{}
			n.children[part] = c
		}
		n = c
	}
	if n.leaf || len(n.children) > 0 {
		return rc.BadValue(mongoerr.ProjectionCollide, "Path collision at %s", path)
	}
	n.leaf = true
	return nil
}
