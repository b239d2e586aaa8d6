package expr

import (
	"strings"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/expr/value"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// Variables ($let's names, $map's and $filter's "as", $reduce's $$this
// and $$value) are bound at compile time to a slot: the binding operator
// writes the slot before evaluating its body and restores it after, so
// nested and recursive bindings see their own value. The compile-time
// scope travels with the nesting level through every compile function.

type varSlot struct{ v value.Value }

type binding struct {
	name string
	slot *varSlot
}

// level is an expression's nesting depth and the variables in scope.
type level struct {
	n     int
	scope *[]binding
}

func (l level) next() level { return level{n: l.n + 1, scope: l.scope} }

func (l level) lookup(name string) *varSlot {
	if l.scope == nil {
		return nil
	}
	sc := *l.scope
	for i := len(sc) - 1; i >= 0; i-- {
		if sc[i].name == name {
			return sc[i].slot
		}
	}
	return nil
}

// CompileTop compiles a top-level expression with an empty variable scope.
func CompileTop(v value.Value, depth int) (Expr, error) {
	return compileExpr(v, level{n: depth, scope: new([]binding)})
}

// withVars compiles v with names bound to fresh slots, returned in order.
func withVars(v value.Value, depth level, names ...string) (Expr, []*varSlot, error) {
	if depth.scope == nil {
		depth.scope = new([]binding)
	}
	slots := make([]*varSlot, len(names))
	n := len(*depth.scope)
	for i, name := range names {
		slots[i] = &varSlot{}
		*depth.scope = append(*depth.scope, binding{name: name, slot: slots[i]})
	}
	defer func() { *depth.scope = (*depth.scope)[:n] }()
	e, err := compileExpr(v, depth.next())
	return e, slots, err
}

// varRef is $$name(.path).
type varRef struct {
	slot  *varSlot
	parts []string
}

func (r varRef) Eval(bsoncore.Document) (value.Value, error) {
	return LookupPath(r.slot.v, r.parts), nil
}

// bindEval evaluates body with the slots set to vals, restoring them after.
func bindEval(body Expr, doc bsoncore.Document, slots []*varSlot, vals ...value.Value) (value.Value, error) {
	saved := make([]value.Value, len(slots))
	for i, s := range slots {
		saved[i], s.v = s.v, vals[i]
	}
	defer func() {
		for i, s := range slots {
			s.v = saved[i]
		}
	}()
	return body.Eval(doc)
}

func validVarName(name string) bool {
	if name == "" || !(name[0] >= 'a' && name[0] <= 'z' || name[0] >= 0x80) {
		return false
	}
	return !strings.ContainsAny(name, ".$ ")
}

// $let: {vars: {name: expr}, in: expr}.
type letExpr struct {
	exprs []Expr
	slots []*varSlot
	in    Expr
}

func (l letExpr) Eval(doc bsoncore.Document) (value.Value, error) {
	vals, err := evalAll(l.exprs, doc)
	if err != nil {
		return value.Missing, err
	}
	return bindEval(l.in, doc, l.slots, vals...)
}

func compileLet(v value.Value, depth level) (Expr, error) {
	d, ok := v.DocumentOK()
	if !ok {
		return nil, value.BadValue(16874, "$let only supports an object as its argument")
	}
	vars, okVars := d.Lookup("vars").DocumentOK()
	in, err := d.LookupErr("in")
	if !okVars {
		return nil, value.BadValue(16876, "Missing 'vars' parameter to $let")
	}
	if err != nil {
		return nil, value.BadValue(16877, "Missing 'in' parameter to $let")
	}
	var l letExpr
	var names []string
	elems, _ := vars.Elements()
	for _, e := range elems {
		if !validVarName(e.Key()) {
			return nil, value.BadValue(16867, "$let: '%s' is not a valid variable name", e.Key())
		}
		x, err := compileExpr(e.Value(), depth.next())
		if err != nil {
			return nil, err
		}
		l.exprs, names = append(l.exprs, x), append(names, e.Key())
	}
	l.in, l.slots, err = withVars(in, depth, names...)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// arrayArg evaluates e as the array input of op: its values, isNull for
// null or missing, an error for any other type.
func arrayArg(op string, code mongoerr.Code, e Expr, doc bsoncore.Document) (vals []value.Value, isNull bool, err error) {
	v, err := e.Eval(doc)
	if err != nil {
		return nil, false, err
	}
	if value.IsNullish(v) {
		return nil, true, nil
	}
	arr, ok := v.ArrayOK()
	if !ok {
		return nil, false, value.BadValue(code, "input to %s must be an array not %s", op, TypeAlias(v))
	}
	vals, err = arr.Values()
	if err != nil {
		return nil, false, value.BadValue(mongoerr.BadValue, "%s: input is not valid BSON: %v", op, err)
	}
	return vals, false, nil
}

func arrayValue(vals []value.Value) value.Value {
	idx, out := bsoncore.AppendArrayStart(nil)
	for i, v := range vals {
		if v.Type == 0 {
			v = value.Null
		}
		out = bsoncore.AppendValueElement(out, bsonutil.Itoa(i), v)
	}
	out, _ = bsoncore.AppendArrayEnd(out, idx)
	return value.Value{Type: bsoncore.TypeArray, Data: out}
}

// iterSpec reads $map's or $filter's {input, as, in|cond, ...}.
type iterSpec struct {
	input Expr
	body  Expr
	slot  *varSlot
	limit Expr
}

func compileIter(op, bodyKey string, v value.Value, depth level) (iterSpec, error) {
	var s iterSpec
	d, ok := v.DocumentOK()
	if !ok {
		return s, value.BadValue(16878, "%s only supports an object as its argument", op)
	}
	inV, err := d.LookupErr("input")
	if err != nil {
		return s, value.BadValue(16880, "Missing 'input' parameter to %s", op)
	}
	bodyV, err := d.LookupErr(bodyKey)
	if err != nil {
		return s, value.BadValue(16882, "Missing '%s' parameter to %s", bodyKey, op)
	}
	as := "this"
	if a, err := d.LookupErr("as"); err == nil {
		if as, ok = a.StringValueOK(); !ok || !validVarName(as) {
			return s, value.BadValue(16867, "%s: 'as' must be a valid variable name", op)
		}
	}
	elems, _ := d.Elements()
	for _, e := range elems {
		switch e.Key() {
		case "input", "as", bodyKey:
		case "limit":
			if op != "$filter" {
				return s, value.BadValue(16879, "Unrecognized parameter to %s: %s", op, e.Key())
			}
			if s.limit, err = compileExpr(e.Value(), depth.next()); err != nil {
				return s, err
			}
		default:
			return s, value.BadValue(16879, "Unrecognized parameter to %s: %s", op, e.Key())
		}
	}
	if s.input, err = compileExpr(inV, depth.next()); err != nil {
		return s, err
	}
	body, slots, err := withVars(bodyV, depth, as)
	if err != nil {
		return s, err
	}
	s.body, s.slot = body, slots[0]
	return s, nil
}

type mapExpr struct{ iterSpec }

func (m mapExpr) Eval(doc bsoncore.Document) (value.Value, error) {
	vals, isNull, err := arrayArg("$map", 16883, m.input, doc)
	if err != nil || isNull {
		return value.Null, err
	}
	out := make([]value.Value, len(vals))
	for i, el := range vals {
		if out[i], err = bindEval(m.body, doc, []*varSlot{m.slot}, el); err != nil {
			return value.Missing, err
		}
	}
	return arrayValue(out), nil
}

type filterExpr struct{ iterSpec }

func (f filterExpr) Eval(doc bsoncore.Document) (value.Value, error) {
	vals, isNull, err := arrayArg("$filter", 28651, f.input, doc)
	if err != nil || isNull {
		return value.Null, err
	}
	limit := int64(len(vals))
	if f.limit != nil {
		lv, err := f.limit.Eval(doc)
		if err != nil {
			return value.Missing, err
		}
		if !value.IsNullish(lv) {
			n, ok := bsonutil.WholeNumber(lv)
			if !ok || n <= 0 {
				return value.Missing, value.BadValue(327391, "$filter: limit must be a positive whole number, found: %s", TypeAlias(lv))
			}
			limit = n
		}
	}
	var out []value.Value
	for _, el := range vals {
		if int64(len(out)) >= limit {
			break
		}
		keep, err := bindEval(f.body, doc, []*varSlot{f.slot}, el)
		if err != nil {
			return value.Missing, err
		}
		if value.Truthy(keep) {
			out = append(out, el)
		}
	}
	return arrayValue(out), nil
}

// $reduce: {input, initialValue, in} with $$value and $$this.
type reduceExpr struct {
	input, initial, in Expr
	slots              []*varSlot
}

func (r reduceExpr) Eval(doc bsoncore.Document) (value.Value, error) {
	vals, isNull, err := arrayArg("$reduce", 40080, r.input, doc)
	if err != nil || isNull {
		return value.Null, err
	}
	acc, err := r.initial.Eval(doc)
	if err != nil {
		return value.Missing, err
	}
	for _, el := range vals {
		if acc, err = bindEval(r.in, doc, r.slots, acc, el); err != nil {
			return value.Missing, err
		}
	}
	return acc, nil
}

func compileReduce(v value.Value, depth level) (Expr, error) {
	d, ok := v.DocumentOK()
	if !ok {
		return nil, value.BadValue(40075, "$reduce only supports an object as its argument, found: %s", TypeAlias(v))
	}
	var r reduceExpr
	var inV value.Value
	elems, _ := d.Elements()
	for _, e := range elems {
		var err error
		switch e.Key() {
		case "input":
			r.input, err = compileExpr(e.Value(), depth.next())
		case "initialValue":
			r.initial, err = compileExpr(e.Value(), depth.next())
		case "in":
			inV = e.Value()
		default:
			return nil, value.BadValue(40076, "$reduce found an unknown argument: %s", e.Key())
		}
		if err != nil {
			return nil, err
		}
	}
	switch {
	case r.input == nil:
		return nil, value.BadValue(40077, "$reduce requires 'input' to be specified")
	case r.initial == nil:
		return nil, value.BadValue(40078, "$reduce requires 'initialValue' to be specified")
	case inV.Type == 0:
		return nil, value.BadValue(40079, "$reduce requires 'in' to be specified")
	}
	var err error
	r.in, r.slots, err = withVars(inV, depth, "value", "this")
	if err != nil {
		return nil, err
	}
	return r, nil
}

// compileBinding compiles the operators that bind variables; ok is false
// for any other name.
func compileBinding(name string, v value.Value, depth level) (e Expr, ok bool, err error) {
	switch name {
	case "$let":
		e, err = compileLet(v, depth)
	case "$map":
		var s iterSpec
		s, err = compileIter(name, "in", v, depth)
		e = mapExpr{s}
	case "$filter":
		var s iterSpec
		s, err = compileIter(name, "cond", v, depth)
		e = filterExpr{s}
	case "$reduce":
		e, err = compileReduce(v, depth)
	default:
		return nil, false, nil
	}
	return e, true, err
}

// rawOperators compile their argument themselves (named arguments,
// lazily evaluated): filled by the ops_*.go files.
var rawOperators = map[string]func(name string, v value.Value, depth level) (Expr, error){}

// namedArgs compiles an operator's object of named arguments: each key of
// slots into its slot, in the object's order; a key not in slots is
// refused with code unknown, as MongoDB refuses it.
func namedArgs(name string, d bsoncore.Document, depth level, unknown mongoerr.Code, slots map[string]*Expr) error {
	elems, _ := d.Elements()
	for _, e := range elems {
		slot, ok := slots[e.Key()]
		if !ok {
			return value.BadValue(unknown, "%s found an unknown argument: %s", name, e.Key())
		}
		x, err := compileExpr(e.Value(), depth.next())
		if err != nil {
			return err
		}
		*slot = x
	}
	return nil
}
