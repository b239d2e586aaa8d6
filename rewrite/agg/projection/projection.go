package projection

import (
	"strings"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/expr"
	"github.com/tsproxy/tsproxy/rewrite/expr/value"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// SpecNode is a projection or $addFields spec as a tree: dotted paths
// and nested documents are the same thing.
type SpecNode struct {
	keys     []string             // children in spec order
	children map[string]*SpecNode // a nested spec
	Include  map[string]bool      // 1/true (include) or 0/false (exclude)
	computed map[string]expr.Expr // an expression
}

func newSpecNode() *SpecNode {
	return &SpecNode{children: map[string]*SpecNode{}, Include: map[string]bool{}, computed: map[string]expr.Expr{}}
}

// ParseSpec reads a $project ($addFields when addFields) spec.
func ParseSpec(stage string, d bsoncore.Document, addFields bool, depth int) (*SpecNode, error) {
	if depth > bsonutil.MaxDepth {
		return nil, value.Unsupported("a %s spec nested deeper than %d levels", stage, bsonutil.MaxDepth)
	}
	root := newSpecNode()
	elems, err := d.Elements()
	if err != nil {
		return nil, value.BadValue(mongoerr.BadValue, "%s spec is not valid BSON: %v", stage, err)
	}
	if len(elems) == 0 {
		if addFields {
			return root, nil
		}
		return nil, value.BadValue(51272, "Invalid $project :: caused by :: projection specification must have at least one field")
	}
	for _, e := range elems {
		path := strings.Split(e.Key(), ".")
		for _, p := range path {
			if p == "" || strings.HasPrefix(p, "$") {
				return nil, value.BadValue(16410, "Invalid %s :: caused by :: FieldPath field names may not start with '$' or be empty: %q", stage, e.Key())
			}
		}
		n := root
		for _, p := range path[:len(path)-1] {
			n = n.child(p)
		}
		leaf := path[len(path)-1]
		if err := n.set(stage, leaf, e.Value(), addFields, depth); err != nil {
			return nil, err
		}
	}
	return root, nil
}

func (n *SpecNode) child(key string) *SpecNode {
	c := n.children[key]
	if c == nil {
		c = newSpecNode()
		n.children[key] = c
		n.keys = append(n.keys, key)
	}
	return c
}

func (n *SpecNode) set(stage, key string, v value.Value, addFields bool, depth int) error {
	if _, dup := n.computed[key]; dup {
		return value.BadValue(31250, "Invalid %s :: caused by :: Path collision at %s", stage, key)
	}
	if d, ok := v.DocumentOK(); ok {
		first, err := d.IndexErr(0)
		if err == nil && !strings.HasPrefix(first.Key(), "$") {
			sub, err := ParseSpec(stage, d, addFields, depth+1)
			if err != nil {
				return err
			}
			c := n.child(key)
			for _, k := range sub.keys {
				c.keys = append(c.keys, k)
				if sc, ok := sub.children[k]; ok {
					c.children[k] = sc
				}
				if inc, ok := sub.Include[k]; ok {
					c.Include[k] = inc
				}
				if ce, ok := sub.computed[k]; ok {
					c.computed[k] = ce
				}
			}
			return nil
		}
	}
	if !addFields {
		switch v.Type {
		case bsoncore.TypeBoolean, bsoncore.TypeInt32, bsoncore.TypeInt64, bsoncore.TypeDouble, bsoncore.TypeDecimal128:
			n.Include[key] = value.Truthy(v)
			n.keys = append(n.keys, key)
			return nil
		}
	}
	e, err := expr.CompileTop(v, depth+1)
	if err != nil {
		return err
	}
	n.computed[key] = e
	n.keys = append(n.keys, key)
	return nil
}

// Mode says whether a $project spec includes (true) or excludes; mixing
// is an error, as on MongoDB (_id may be excluded in an inclusion).
func (n *SpecNode) Mode(top bool) (inclusion, exclusion bool) {
	for _, k := range n.keys {
		if top && k == "_id" {
			if _, ok := n.computed[k]; ok {
				inclusion = true
			}
			if c, ok := n.children[k]; ok {
				i, e := c.Mode(false)
				inclusion, exclusion = inclusion || i, exclusion || e
			}
			continue
		}
		if inc, ok := n.Include[k]; ok {
			if inc {
				inclusion = true
			} else {
				exclusion = true
			}
		}
		if _, ok := n.computed[k]; ok {
			inclusion = true
		}
		if c, ok := n.children[k]; ok {
			i, e := c.Mode(false)
			inclusion, exclusion = inclusion || i, exclusion || e
		}
	}
	return inclusion, exclusion
}

// Include applies an inclusion spec to doc; expressions see root.
func Include(root, doc bsoncore.Document, spec *SpecNode, top bool) (bsoncore.Document, error) {
	idx, out := bsoncore.AppendDocumentStart(nil)
	if top {
		if e, ok := spec.computed["_id"]; ok {
			v, err := e.Eval(root)
			if err != nil {
				return nil, err
			}
			if v.Type != 0 {
				out = bsoncore.AppendValueElement(out, "_id", v)
			}
		} else if inc, ok := spec.Include["_id"]; !ok || inc {
			if v, err := doc.LookupErr("_id"); err == nil {
				out = bsoncore.AppendValueElement(out, "_id", v)
			}
		}
	}
	elems, _ := doc.Elements()
	present := map[string]bool{}
	for _, e := range elems {
		k := e.Key()
		if top && k == "_id" {
			continue
		}
		if _, ok := spec.computed[k]; ok {
			continue
		}
		if spec.Include[k] {
			out = bsoncore.AppendValueElement(out, k, e.Value())
			continue
		}
		c, ok := spec.children[k]
		if !ok {
			continue
		}
		present[k] = true
		v, err := includeValue(root, e.Value(), c)
		if err != nil {
			return nil, err
		}
		if v.Type != 0 {
			out = bsoncore.AppendValueElement(out, k, v)
		}
	}
	for _, k := range spec.keys {
		if top && k == "_id" {
			continue
		}
		if e, ok := spec.computed[k]; ok {
			v, err := e.Eval(root)
			if err != nil {
				return nil, err
			}
			if v.Type != 0 {
				out = bsoncore.AppendValueElement(out, k, v)
			}
			continue
		}
		if c, ok := spec.children[k]; ok && !present[k] && c.hasComputed() {
			sub, err := Include(root, emptyDoc, c, false)
			if err != nil {
				return nil, err
			}
			out = bsoncore.AppendDocumentElement(out, k, sub)
		}
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return out, nil
}

func (n *SpecNode) hasComputed() bool {
	if len(n.computed) > 0 {
		return true
	}
	for _, c := range n.children {
		if c.hasComputed() {
			return true
		}
	}
	return false
}

// includeValue applies a nested inclusion spec to a field's value: into
// a document, over an array's documents; other values are dropped.
func includeValue(root bsoncore.Document, v value.Value, spec *SpecNode) (value.Value, error) {
	switch v.Type {
	case bsoncore.TypeEmbeddedDocument:
		d, err := Include(root, v.Document(), spec, false)
		return value.Value{Type: bsoncore.TypeEmbeddedDocument, Data: d}, err
	case bsoncore.TypeArray:
		vals, _ := v.Array().Values()
		idx, arr := bsoncore.AppendArrayStart(nil)
		n := 0
		for _, el := range vals {
			got, err := includeValue(root, el, spec)
			if err != nil {
				return value.Missing, err
			}
			if got.Type == 0 {
				continue
			}
			arr = bsoncore.AppendValueElement(arr, bsonutil.Itoa(n), got)
			n++
		}
		arr, _ = bsoncore.AppendArrayEnd(arr, idx)
		return value.Value{Type: bsoncore.TypeArray, Data: arr}, nil
	}
	if spec.hasComputed() {
		d, err := Include(root, emptyDoc, spec, false)
		return value.Value{Type: bsoncore.TypeEmbeddedDocument, Data: d}, err
	}
	return value.Missing, nil
}

// Exclude applies an exclusion spec to doc.
func Exclude(doc bsoncore.Document, spec *SpecNode) bsoncore.Document {
	idx, out := bsoncore.AppendDocumentStart(nil)
	elems, _ := doc.Elements()
	for _, e := range elems {
		k := e.Key()
		if inc, ok := spec.Include[k]; ok && !inc {
			continue
		}
		if c, ok := spec.children[k]; ok {
			out = bsoncore.AppendValueElement(out, k, excludeValue(e.Value(), c))
			continue
		}
		out = bsoncore.AppendValueElement(out, k, e.Value())
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return out
}

func excludeValue(v value.Value, spec *SpecNode) value.Value {
	switch v.Type {
	case bsoncore.TypeEmbeddedDocument:
		return value.Value{Type: bsoncore.TypeEmbeddedDocument, Data: Exclude(v.Document(), spec)}
	case bsoncore.TypeArray:
		vals, _ := v.Array().Values()
		idx, arr := bsoncore.AppendArrayStart(nil)
		for i, el := range vals {
			arr = bsoncore.AppendValueElement(arr, bsonutil.Itoa(i), excludeValue(el, spec))
		}
		arr, _ = bsoncore.AppendArrayEnd(arr, idx)
		return value.Value{Type: bsoncore.TypeArray, Data: arr}
	}
	return v
}

// addFieldsIn applies spec inside v, the value at a dotted path's part:
// into a document, into every element of an array (arrays inside it
// included), as MongoDB sets "a.b" in each document of an array a; any
// other value is replaced by a new document.
func addFieldsIn(root bsoncore.Document, v value.Value, spec *SpecNode) (value.Value, error) {
	switch v.Type {
	case bsoncore.TypeEmbeddedDocument:
		nd, err := AddFields(root, v.Document(), spec)
		return value.Value{Type: bsoncore.TypeEmbeddedDocument, Data: nd}, err
	case bsoncore.TypeArray:
		vals, _ := v.Array().Values()
		idx, arr := bsoncore.AppendArrayStart(nil)
		for i, el := range vals {
			nv, err := addFieldsIn(root, el, spec)
			if err != nil {
				return value.Value{}, err
			}
			arr = bsoncore.AppendValueElement(arr, bsonutil.Itoa(i), nv)
		}
		arr, _ = bsoncore.AppendArrayEnd(arr, idx)
		return value.Value{Type: bsoncore.TypeArray, Data: arr}, nil
	}
	nd, err := AddFields(root, emptyDoc, spec)
	return value.Value{Type: bsoncore.TypeEmbeddedDocument, Data: nd}, err
}

func AddFields(root, doc bsoncore.Document, spec *SpecNode) (bsoncore.Document, error) {
	vals := map[string]value.Value{}
	for k, e := range spec.computed {
		v, err := e.Eval(root)
		if err != nil {
			return nil, err
		}
		vals[k] = v
	}
	idx, out := bsoncore.AppendDocumentStart(nil)
	done := map[string]bool{}
	elems, _ := doc.Elements()
	for _, e := range elems {
		k := e.Key()
		if v, ok := vals[k]; ok {
			done[k] = true
			if v.Type != 0 {
				out = bsoncore.AppendValueElement(out, k, v)
			}
			continue
		}
		if c, ok := spec.children[k]; ok {
			done[k] = true
			nv, err := addFieldsIn(root, e.Value(), c)
			if err != nil {
				return nil, err
			}
			out = bsoncore.AppendValueElement(out, k, nv)
			continue
		}
		out = bsoncore.AppendValueElement(out, k, e.Value())
	}
	for _, k := range spec.keys {
		if done[k] {
			continue
		}
		if v, ok := vals[k]; ok {
			if v.Type != 0 {
				out = bsoncore.AppendValueElement(out, k, v)
			}
			continue
		}
		if c, ok := spec.children[k]; ok {
			nd, err := AddFields(root, emptyDoc, c)
			if err != nil {
				return nil, err
			}
			out = bsoncore.AppendDocumentElement(out, k, nd)
		}
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return out, nil
}

var emptyDoc = bsoncore.NewDocumentBuilder().Build()
