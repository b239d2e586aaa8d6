package agg

import (
	"strings"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// specNode is a projection or $addFields spec as a tree: dotted paths
// and nested documents are the same thing.
type specNode struct {
	keys     []string             // children in spec order
	children map[string]*specNode // a nested spec
	include  map[string]bool      // 1/true (include) or 0/false (exclude)
	computed map[string]expr      // an expression
}

func newSpecNode() *specNode {
	return &specNode{children: map[string]*specNode{}, include: map[string]bool{}, computed: map[string]expr{}}
}

// parseSpec reads a $project ($addFields when addFields) spec.
func parseSpec(stage string, d bsoncore.Document, addFields bool, depth int) (*specNode, error) {
	if depth > bsonutil.MaxDepth {
		return nil, unsupported("a %s spec nested deeper than %d levels", stage, bsonutil.MaxDepth)
	}
	root := newSpecNode()
	elems, err := d.Elements()
	if err != nil {
		return nil, badValue(mongoerr.BadValue, "%s spec is not valid BSON: %v", stage, err)
	}
	if len(elems) == 0 {
		if addFields {
			return root, nil
		}
		return nil, badValue(51272, "Invalid $project :: caused by :: projection specification must have at least one field")
	}
	for _, e := range elems {
		path := strings.Split(e.Key(), ".")
		for _, p := range path {
			if p == "" || strings.HasPrefix(p, "$") {
				return nil, badValue(16410, "Invalid %s :: caused by :: FieldPath field names may not start with '$' or be empty: %q", stage, e.Key())
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

func (n *specNode) child(key string) *specNode {
	c := n.children[key]
	if c == nil {
		c = newSpecNode()
		n.children[key] = c
		n.keys = append(n.keys, key)
	}
	return c
}

func (n *specNode) set(stage, key string, v Value, addFields bool, depth int) error {
	if _, dup := n.computed[key]; dup {
		return badValue(31250, "Invalid %s :: caused by :: Path collision at %s", stage, key)
	}
	if d, ok := v.DocumentOK(); ok {
		first, err := d.IndexErr(0)
		if err == nil && !strings.HasPrefix(first.Key(), "$") {
			sub, err := parseSpec(stage, d, addFields, depth+1)
			if err != nil {
				return err
			}
			c := n.child(key)
			for _, k := range sub.keys {
				c.keys = append(c.keys, k)
				if sc, ok := sub.children[k]; ok {
					c.children[k] = sc
				}
				if inc, ok := sub.include[k]; ok {
					c.include[k] = inc
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
			n.include[key] = truthy(v)
			n.keys = append(n.keys, key)
			return nil
		}
	}
	e, err := compileTop(v, depth+1)
	if err != nil {
		return err
	}
	n.computed[key] = e
	n.keys = append(n.keys, key)
	return nil
}

// mode says whether a $project spec includes (true) or excludes; mixing
// is an error, as on MongoDB (_id may be excluded in an inclusion).
func (n *specNode) mode(top bool) (inclusion, exclusion bool) {
	for _, k := range n.keys {
		if top && k == "_id" {
			if _, ok := n.computed[k]; ok {
				inclusion = true
			}
			if c, ok := n.children[k]; ok {
				i, e := c.mode(false)
				inclusion, exclusion = inclusion || i, exclusion || e
			}
			continue
		}
		if inc, ok := n.include[k]; ok {
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
			i, e := c.mode(false)
			inclusion, exclusion = inclusion || i, exclusion || e
		}
	}
	return inclusion, exclusion
}

type projectStage struct {
	spec      *specNode
	inclusion bool
	next      processor
}

func compileProject(v Value, next processor, _ Options) (processor, error) {
	d, ok := v.DocumentOK()
	if !ok {
		return nil, badValue(15969, "$project specification must be an object")
	}
	spec, err := parseSpec("$project", d, false, 0)
	if err != nil {
		return nil, err
	}
	inc, exc := spec.mode(true)
	if inc && exc {
		return nil, badValue(mongoerr.ProjectionMixed, "Invalid $project :: caused by :: Cannot do exclusion on a field in inclusion projection")
	}
	if !inc && !exc {
		// Only _id: an exclusion when it is 0, else an inclusion of _id.
		inc = spec.include["_id"]
	}
	return &projectStage{spec: spec, inclusion: inc, next: next}, nil
}

func (p *projectStage) push(doc bsoncore.Document) error {
	var out bsoncore.Document
	var err error
	if p.inclusion {
		out, err = include(doc, doc, p.spec, true)
	} else {
		out = exclude(doc, p.spec)
	}
	if err != nil {
		return err
	}
	return p.next.push(out)
}

func (p *projectStage) flush() error { return p.next.flush() }

// include applies an inclusion spec to doc; expressions see root.
func include(root, doc bsoncore.Document, spec *specNode, top bool) (bsoncore.Document, error) {
	idx, out := bsoncore.AppendDocumentStart(nil)
	if top {
		if e, ok := spec.computed["_id"]; ok {
			v, err := e.eval(root)
			if err != nil {
				return nil, err
			}
			if v.Type != 0 {
				out = bsoncore.AppendValueElement(out, "_id", v)
			}
		} else if inc, ok := spec.include["_id"]; !ok || inc {
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
		if spec.include[k] {
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
			v, err := e.eval(root)
			if err != nil {
				return nil, err
			}
			if v.Type != 0 {
				out = bsoncore.AppendValueElement(out, k, v)
			}
			continue
		}
		if c, ok := spec.children[k]; ok && !present[k] && c.hasComputed() {
			sub, err := include(root, emptyDoc, c, false)
			if err != nil {
				return nil, err
			}
			out = bsoncore.AppendDocumentElement(out, k, sub)
		}
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return out, nil
}

var emptyDoc = bsoncore.NewDocumentBuilder().Build()

func (n *specNode) hasComputed() bool {
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
func includeValue(root bsoncore.Document, v Value, spec *specNode) (Value, error) {
	switch v.Type {
	case bsoncore.TypeEmbeddedDocument:
		d, err := include(root, v.Document(), spec, false)
		return Value{Type: bsoncore.TypeEmbeddedDocument, Data: d}, err
	case bsoncore.TypeArray:
		vals, _ := v.Array().Values()
		idx, arr := bsoncore.AppendArrayStart(nil)
		n := 0
		for _, el := range vals {
			got, err := includeValue(root, el, spec)
			if err != nil {
				return missing, err
			}
			if got.Type == 0 {
				continue
			}
			arr = bsoncore.AppendValueElement(arr, bsonutil.Itoa(n), got)
			n++
		}
		arr, _ = bsoncore.AppendArrayEnd(arr, idx)
		return Value{Type: bsoncore.TypeArray, Data: arr}, nil
	}
	if spec.hasComputed() {
		d, err := include(root, emptyDoc, spec, false)
		return Value{Type: bsoncore.TypeEmbeddedDocument, Data: d}, err
	}
	return missing, nil
}

// exclude applies an exclusion spec to doc.
func exclude(doc bsoncore.Document, spec *specNode) bsoncore.Document {
	idx, out := bsoncore.AppendDocumentStart(nil)
	elems, _ := doc.Elements()
	for _, e := range elems {
		k := e.Key()
		if inc, ok := spec.include[k]; ok && !inc {
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

func excludeValue(v Value, spec *specNode) Value {
	switch v.Type {
	case bsoncore.TypeEmbeddedDocument:
		return Value{Type: bsoncore.TypeEmbeddedDocument, Data: exclude(v.Document(), spec)}
	case bsoncore.TypeArray:
		vals, _ := v.Array().Values()
		idx, arr := bsoncore.AppendArrayStart(nil)
		for i, el := range vals {
			arr = bsoncore.AppendValueElement(arr, bsonutil.Itoa(i), excludeValue(el, spec))
		}
		arr, _ = bsoncore.AppendArrayEnd(arr, idx)
		return Value{Type: bsoncore.TypeArray, Data: arr}
	}
	return v
}

// $addFields and $set: every expression sees the input document; a
// field that exists is replaced where it is, a new one appended; a
// missing value removes the field.
type addFieldsStage struct {
	spec *specNode
	next processor
}

func compileAddFields(v Value, next processor, _ Options) (processor, error) {
	d, ok := v.DocumentOK()
	if !ok {
		return nil, badValue(40272, "$addFields specification stage must be an object")
	}
	spec, err := parseSpec("$addFields", d, true, 0)
	if err != nil {
		return nil, err
	}
	return &addFieldsStage{spec: spec, next: next}, nil
}

func (a *addFieldsStage) push(doc bsoncore.Document) error {
	out, err := addFields(doc, doc, a.spec)
	if err != nil {
		return err
	}
	return a.next.push(out)
}

func (a *addFieldsStage) flush() error { return a.next.flush() }

// addFieldsIn applies spec inside v, the value at a dotted path's part:
// into a document, into every element of an array (arrays inside it
// included), as MongoDB sets "a.b" in each document of an array a; any
// other value is replaced by a new document.
func addFieldsIn(root bsoncore.Document, v Value, spec *specNode) (Value, error) {
	switch v.Type {
	case bsoncore.TypeEmbeddedDocument:
		nd, err := addFields(root, v.Document(), spec)
		return Value{Type: bsoncore.TypeEmbeddedDocument, Data: nd}, err
	case bsoncore.TypeArray:
		vals, _ := v.Array().Values()
		idx, arr := bsoncore.AppendArrayStart(nil)
		for i, el := range vals {
			nv, err := addFieldsIn(root, el, spec)
			if err != nil {
				return Value{}, err
			}
			arr = bsoncore.AppendValueElement(arr, bsonutil.Itoa(i), nv)
		}
		arr, _ = bsoncore.AppendArrayEnd(arr, idx)
		return Value{Type: bsoncore.TypeArray, Data: arr}, nil
	}
	nd, err := addFields(root, emptyDoc, spec)
	return Value{Type: bsoncore.TypeEmbeddedDocument, Data: nd}, err
}

func addFields(root, doc bsoncore.Document, spec *specNode) (bsoncore.Document, error) {
	vals := map[string]Value{}
	for k, e := range spec.computed {
		v, err := e.eval(root)
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
			nd, err := addFields(root, emptyDoc, c)
			if err != nil {
				return nil, err
			}
			out = bsoncore.AppendDocumentElement(out, k, nd)
		}
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return out, nil
}

// $unset: an exclusion of the named fields.
func compileUnset(v Value, next processor, _ Options) (processor, error) {
	var names []string
	switch v.Type {
	case bsoncore.TypeString:
		names = []string{v.StringValue()}
	case bsoncore.TypeArray:
		vals, _ := v.Array().Values()
		for _, el := range vals {
			s, ok := el.StringValueOK()
			if !ok {
				return nil, badValue(31120, "$unset specification must be a string or an array containing only string values")
			}
			names = append(names, s)
		}
	default:
		return nil, badValue(31002, "$unset specification must be a string or an array")
	}
	if len(names) == 0 {
		return nil, badValue(31119, "$unset specification must be a string or an array with at least one field")
	}
	b := bsoncore.NewDocumentBuilder()
	for _, n := range names {
		b.AppendInt32(n, 0)
	}
	spec, err := parseSpec("$unset", b.Build(), false, 0)
	if err != nil {
		return nil, err
	}
	return &projectStage{spec: spec, inclusion: false, next: next}, nil
}
