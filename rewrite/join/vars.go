package join

import (
	"strings"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/agg"
	"github.com/tsproxy/tsproxy/rewrite/expr"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// Variables of a $lookup's let reach its pipeline as literals: each
// "$$name" (or "$$name.path") in an expression becomes {$literal: value}
// ($$REMOVE when the path is missing). A $match's query is an expression
// only inside $expr; elsewhere "$$name" is the string it is.

// checkVarName refuses a let name MongoDB refuses: a user variable
// starts with a lowercase ASCII letter or a non-ASCII character, and
// holds letters, digits and '_' only.
func checkVarName(name string) error {
	if name == "" {
		return mongoerr.Errorf(mongoerr.FailedToParse, "empty variable names are not allowed")
	}
	c := name[0]
	if !(c >= 'a' && c <= 'z') && c < 0x80 {
		return mongoerr.Errorf(mongoerr.FailedToParse, "'%s' starts with an invalid character for a user variable name", name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c >= 0x80) {
			return mongoerr.Errorf(mongoerr.FailedToParse, "'%s' contains an invalid character for a variable name: '%c'", name, c)
		}
	}
	return nil
}

// bindStages is stages with vars replaced by their values.
func bindStages(stages []agg.Stage, vars map[string]bsoncore.Value) ([]agg.Stage, error) {
	if len(vars) == 0 {
		return stages, nil
	}
	out := make([]agg.Stage, len(stages))
	for i, st := range stages {
		v, err := bindStage(st, vars)
		if err != nil {
			return nil, err
		}
		out[i] = agg.Stage{Name: st.Name, Value: v}
	}
	return out, nil
}

func bindStage(st agg.Stage, vars map[string]bsoncore.Value) (bsoncore.Value, error) {
	d, isDoc := st.Value.DocumentOK()
	switch {
	case st.Name == "$match" && isDoc:
		q, err := bindQuery(d, vars)
		return docValue(q), err
	case (st.Name == "$lookup" || st.Name == "$unionWith" || st.Name == "$graphLookup") && isDoc:
		return bindJoinSpec(st.Name, d, vars)
	case st.Name == "$facet" && isDoc:
		return bindFields(d, func(_ string, v bsoncore.Value) (bsoncore.Value, error) { return bindPipeline(v, vars) })
	}
	return bindExpr(st.Value, vars)
}

// bindJoinSpec binds a nested join: its let values and startWith are
// expressions, restrictSearchWithMatch a query, and its pipeline sees
// the outer variables but those its own let shadows.
func bindJoinSpec(name string, d bsoncore.Document, vars map[string]bsoncore.Value) (bsoncore.Value, error) {
	inner := vars
	if let, ok := d.Lookup("let").DocumentOK(); ok && name == "$lookup" {
		elems, _ := let.Elements()
		inner = map[string]bsoncore.Value{}
		for k, v := range vars {
			inner[k] = v
		}
		for _, e := range elems {
			delete(inner, e.Key())
		}
	}
	return bindFields(d, func(key string, v bsoncore.Value) (bsoncore.Value, error) {
		switch key {
		case "let":
			ld, ok := v.DocumentOK()
			if !ok {
				return v, nil
			}
			return bindFields(ld, func(_ string, lv bsoncore.Value) (bsoncore.Value, error) { return bindExpr(lv, vars) })
		case "startWith":
			return bindExpr(v, vars)
		case "restrictSearchWithMatch":
			if q, ok := v.DocumentOK(); ok {
				b, err := bindQuery(q, vars)
				return docValue(b), err
			}
		case "pipeline":
			return bindPipeline(v, inner)
		}
		return v, nil
	})
}

func bindPipeline(v bsoncore.Value, vars map[string]bsoncore.Value) (bsoncore.Value, error) {
	stages, err := stagesOf("a nested", v)
	if err != nil {
		return v, nil // refused where it is compiled
	}
	bound, err := bindStages(stages, vars)
	if err != nil {
		return v, err
	}
	ab := bsoncore.NewArrayBuilder()
	for _, st := range bound {
		ab.AppendDocument(bsoncore.NewDocumentBuilder().AppendValue(st.Name, st.Value).Build())
	}
	return bsoncore.Value{Type: bsoncore.TypeArray, Data: ab.Build()}, nil
}

// bindQuery binds the $expr parts of a query.
func bindQuery(q bsoncore.Document, vars map[string]bsoncore.Value) (bsoncore.Document, error) {
	v, err := bindFields(q, func(key string, v bsoncore.Value) (bsoncore.Value, error) {
		switch key {
		case "$expr":
			return bindExpr(v, vars)
		case "$and", "$or", "$nor":
			arr, ok := v.ArrayOK()
			if !ok {
				return v, nil
			}
			vals, _ := arr.Values()
			ab := bsoncore.NewArrayBuilder()
			for _, el := range vals {
				if sub, ok := el.DocumentOK(); ok {
					b, err := bindQuery(sub, vars)
					if err != nil {
						return v, err
					}
					ab.AppendDocument(b)
				} else {
					ab.AppendValue(el)
				}
			}
			return bsoncore.Value{Type: bsoncore.TypeArray, Data: ab.Build()}, nil
		}
		return v, nil
	})
	return v.Document(), err
}

// bindExpr binds an expression.
func bindExpr(v bsoncore.Value, vars map[string]bsoncore.Value) (bsoncore.Value, error) {
	switch v.Type {
	case bsoncore.TypeString:
		s := v.StringValue()
		if !strings.HasPrefix(s, "$$") {
			return v, nil
		}
		name, rest, dotted := strings.Cut(s[2:], ".")
		val, ok := vars[name]
		if !ok {
			return v, nil
		}
		if dotted {
			val = expr.FieldPath(val, strings.Split(rest, "."))
		}
		if val.Type == 0 {
			return bsoncore.Value{Type: bsoncore.TypeString, Data: bsoncore.AppendString(nil, "$$REMOVE")}, nil
		}
		return docValue(bsoncore.NewDocumentBuilder().AppendValue("$literal", val).Build()), nil
	case bsoncore.TypeEmbeddedDocument:
		d := v.Document()
		if first, err := d.IndexErr(0); err == nil {
			switch first.Key() {
			case "$literal":
				return v, nil
			case "$let", "$map", "$filter", "$reduce", "$sortArray":
				if name, ok := shadowed(first.Key(), first.Value(), vars); ok {
					return v, unsupported("a %s variable %q named as a $lookup let variable", first.Key(), name)
				}
			}
		}
		return bindFields(d, func(_ string, ev bsoncore.Value) (bsoncore.Value, error) { return bindExpr(ev, vars) })
	case bsoncore.TypeArray:
		vals, _ := v.Array().Values()
		ab := bsoncore.NewArrayBuilder()
		for _, el := range vals {
			b, err := bindExpr(el, vars)
			if err != nil {
				return v, err
			}
			ab.AppendValue(b)
		}
		return bsoncore.Value{Type: bsoncore.TypeArray, Data: ab.Build()}, nil
	}
	return v, nil
}

// shadowed is a variable an operator defines that is one of vars: its
// uses inside would be bound wrongly, so such a pipeline is refused.
func shadowed(op string, arg bsoncore.Value, vars map[string]bsoncore.Value) (string, bool) {
	d, ok := arg.DocumentOK()
	if !ok {
		return "", false
	}
	var names []string
	switch op {
	case "$let":
		if vd, ok := d.Lookup("vars").DocumentOK(); ok {
			elems, _ := vd.Elements()
			for _, e := range elems {
				names = append(names, e.Key())
			}
		}
	case "$map", "$filter":
		as, ok := d.Lookup("as").StringValueOK()
		if !ok {
			as = "this"
		}
		names = append(names, as)
	case "$reduce":
		names = append(names, "this", "value")
	}
	for _, n := range names {
		if _, ok := vars[n]; ok {
			return n, true
		}
	}
	return "", false
}

// bindFields is d with each field's value mapped by f.
func bindFields(d bsoncore.Document, f func(key string, v bsoncore.Value) (bsoncore.Value, error)) (bsoncore.Value, error) {
	elems, _ := d.Elements()
	idx, out := bsoncore.AppendDocumentStart(nil)
	for _, e := range elems {
		v, err := f(e.Key(), e.Value())
		if err != nil {
			return docValue(d), err
		}
		out = bsoncore.AppendValueElement(out, e.Key(), v)
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return docValue(out), nil
}
