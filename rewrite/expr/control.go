package expr

import (
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/expr/value"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// The control operators: $ifNull, $and, $or, $cond and $switch, which
// evaluate their arguments lazily.

type ifNull struct{ args []Expr }

func (n ifNull) Eval(doc bsoncore.Document) (value.Value, error) {
	for i, a := range n.args {
		v, err := a.Eval(doc)
		if err != nil {
			return value.Missing, err
		}
		if !value.IsNullish(v) || i == len(n.args)-1 {
			return v, nil
		}
	}
	return value.Null, nil
}

type logic struct {
	and  bool
	args []Expr
}

func (l logic) Eval(doc bsoncore.Document) (value.Value, error) {
	for _, a := range l.args {
		v, err := a.Eval(doc)
		if err != nil {
			return value.Missing, err
		}
		if value.Truthy(v) != l.and {
			return value.BoolValue(!l.and), nil
		}
	}
	return value.BoolValue(l.and), nil
}

type cond struct{ c, then, els Expr }

func (c cond) Eval(doc bsoncore.Document) (value.Value, error) {
	v, err := c.c.Eval(doc)
	if err != nil {
		return value.Missing, err
	}
	if value.Truthy(v) {
		return c.then.Eval(doc)
	}
	return c.els.Eval(doc)
}

func compileCond(v value.Value, depth level) (Expr, error) {
	if v.Type == bsoncore.TypeEmbeddedDocument {
		var c cond
		elems, _ := bsoncore.Document(v.Data).Elements()
		for _, e := range elems {
			x, err := compileExpr(e.Value(), depth.next())
			if err != nil {
				return nil, err
			}
			switch e.Key() {
			case "if":
				c.c = x
			case "then":
				c.then = x
			case "else":
				c.els = x
			default:
				return nil, value.BadValue(17083, "Unrecognized parameter to $cond: %s", e.Key())
			}
		}
		switch {
		case c.c == nil:
			return nil, value.BadValue(17080, "Missing 'if' parameter to $cond")
		case c.then == nil:
			return nil, value.BadValue(17081, "Missing 'then' parameter to $cond")
		case c.els == nil:
			return nil, value.BadValue(17082, "Missing 'else' parameter to $cond")
		}
		return c, nil
	}
	args, err := operatorArgs("$cond", v, depth)
	if err != nil {
		return nil, err
	}
	if err := wantArgs("$cond", args, 3); err != nil {
		return nil, err
	}
	return cond{c: args[0], then: args[1], els: args[2]}, nil
}

// switchExpr is $switch: the first branch whose case is true, else the
// default (an error without one, as on MongoDB).
type switchExpr struct {
	cases, thens []Expr
	def          Expr
}

func (s switchExpr) Eval(doc bsoncore.Document) (value.Value, error) {
	for i, c := range s.cases {
		v, err := c.Eval(doc)
		if err != nil {
			return value.Missing, err
		}
		if value.Truthy(v) {
			return s.thens[i].Eval(doc)
		}
	}
	if s.def == nil {
		return value.Missing, value.BadValue(mongoerr.NoBucketBranch, "$switch could not find a matching branch for an input, and no default was specified.")
	}
	return s.def.Eval(doc)
}

func compileSwitch(v value.Value, depth level) (Expr, error) {
	d, ok := v.DocumentOK()
	if !ok {
		return nil, value.BadValue(40060, "$switch requires an object as an argument, found: %s", TypeAlias(v))
	}
	var s switchExpr
	elems, _ := d.Elements()
	for _, e := range elems {
		switch e.Key() {
		case "branches":
			arr, ok := e.Value().ArrayOK()
			if !ok {
				return nil, value.BadValue(40061, "$switch expected an array for 'branches', found: %s", TypeAlias(e.Value()))
			}
			vals, _ := arr.Values()
			for _, bv := range vals {
				bd, ok := bv.DocumentOK()
				if !ok {
					return nil, value.BadValue(40062, "$switch expected each branch to be an object, found: %s", TypeAlias(bv))
				}
				var c, then Expr
				be, _ := bd.Elements()
				for _, x := range be {
					ce, err := compileExpr(x.Value(), depth.next())
					if err != nil {
						return nil, err
					}
					switch x.Key() {
					case "case":
						c = ce
					case "then":
						then = ce
					default:
						return nil, value.BadValue(40063, "$switch found an unknown argument to a branch: %s", x.Key())
					}
				}
				if c == nil {
					return nil, value.BadValue(40064, "$switch requires each branch have a 'case' expression")
				}
				if then == nil {
					return nil, value.BadValue(40065, "$switch requires each branch have a 'then' expression.")
				}
				s.cases, s.thens = append(s.cases, c), append(s.thens, then)
			}
		case "default":
			def, err := compileExpr(e.Value(), depth.next())
			if err != nil {
				return nil, err
			}
			s.def = def
		default:
			return nil, value.BadValue(40067, "$switch found an unknown argument: %s", e.Key())
		}
	}
	if len(s.cases) == 0 {
		return nil, value.BadValue(40068, "$switch requires at least one branch.")
	}
	return s, nil
}
