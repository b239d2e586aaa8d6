package agg

import (
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/expr"
	"github.com/tsproxy/tsproxy/rewrite/expr/value"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// $fill: null and missing values of each output field replaced by a
// value expression, the last value before it (locf) or a linear
// interpolation between the values around it (linear), in the order of
// sortBy within each partition; documents come out in that order.
type fillStage struct {
	by      partitionKey
	keys    []sortKey
	outputs []fillOutput
	in      buffer
	next    processor
}

type fillOutput struct {
	field  string
	method string // "locf", "linear", or "" for value
	value  expr.Expr
}

func compileFill(v value.Value, next processor, opts Options) (processor, error) {
	d, ok := v.DocumentOK()
	if !ok {
		return nil, value.BadValue(mongoerr.FailedToParse, "the $fill stage specification must be an object")
	}
	spec, err := readPartitioned("$fill", d, true)
	if err != nil {
		return nil, err
	}
	f := &fillStage{by: spec.by, keys: spec.keys, in: buffer{stage: "$fill", max: opts.MaxMemory}, next: next}
	output := spec.output
	oe, _ := output.Elements()
	for _, e := range oe {
		o := fillOutput{field: e.Key()}
		spec, ok := e.Value().DocumentOK()
		if !ok {
			return nil, value.BadValue(mongoerr.TypeMismatch, "$fill output field '%s' must be an object", e.Key())
		}
		if m, err := spec.LookupErr("method"); err == nil {
			o.method, _ = m.StringValueOK()
			if o.method != "locf" && o.method != "linear" {
				return nil, value.BadValue(6050202, "Method must be either locf or linear")
			}
			if f.keys == nil {
				return nil, value.BadValue(6050203, "sortBy required if any output field specifies a 'method'")
			}
			if o.method == "linear" && len(f.keys) != 1 {
				return nil, value.Unsupported("a linear $fill with a sortBy of more than one field")
			}
		} else if val, err := spec.LookupErr("value"); err == nil {
			x, err := expr.CompileTop(val, 1)
			if err != nil {
				return nil, err
			}
			o.value = x
		} else {
			return nil, value.BadValue(6050203, "Each fill output specification must have either 'method' or 'value'")
		}
		if len(splitPath(o.field)) > 1 {
			return nil, value.Unsupported("$fill of a dotted field")
		}
		f.outputs = append(f.outputs, o)
	}
	return f, nil
}

func (f *fillStage) push(doc bsoncore.Document) error { return f.in.Add(doc) }

func (f *fillStage) flush() error {
	by := f.by
	if f.keys == nil {
		// Only value fills (a method needs sortBy): the order and the
		// partitions do not matter, as in MongoDB's $addFields form.
		by = partitionKey{}
	}
	parts, err := by.partitions(f.in.take(), f.keys)
	if err != nil {
		return err
	}
	for _, p := range parts {
		for _, o := range f.outputs {
			if err := o.fill(p.docs, f.keys); err != nil {
				return err
			}
		}
		for _, d := range p.docs {
			if err := f.next.push(d); err != nil {
				return err
			}
		}
	}
	return f.next.flush()
}

// fill replaces the null and missing values of o's field in docs.
func (o fillOutput) fill(docs []bsoncore.Document, keys []sortKey) error {
	vals := make([]value.Value, len(docs))
	for i, d := range docs {
		vals[i] = expr.LookupPath(value.Value{Type: bsoncore.TypeEmbeddedDocument, Data: d}, []string{o.field})
	}
	switch o.method {
	case "":
		for i, d := range docs {
			if value.IsNullish(vals[i]) {
				v, err := o.value.Eval(d)
				if err != nil {
					return err
				}
				if v.Type == 0 {
					v = value.Null
				}
				docs[i] = setTopField(d, o.field, v)
			}
		}
	case "locf":
		last := value.Null
		for i, d := range docs {
			if value.IsNullish(vals[i]) {
				docs[i] = setTopField(d, o.field, last)
			} else {
				last = vals[i]
			}
		}
	case "linear":
		pos := make([]float64, len(docs))
		for i, d := range docs {
			v := expr.LookupPath(value.Value{Type: bsoncore.TypeEmbeddedDocument, Data: d}, keys[0].path)
			switch {
			case v.Type == bsoncore.TypeDateTime:
				pos[i] = float64(v.DateTime())
			default:
				k, iv, fv, ok := value.Number(v)
				if !ok || k == value.KindDecimal {
					return value.BadValue(6050106, "There can be no repeated values in the sort field, and it must be a number or a date; found a %s", expr.TypeAlias(v))
				}
				if k != value.KindDouble {
					fv = float64(iv)
				}
				pos[i] = fv
			}
			if i > 0 && pos[i] == pos[i-1] {
				return value.BadValue(6050106, "There can be no repeated values in the sort field")
			}
		}
		prev := -1
		for i := range docs {
			if value.IsNullish(vals[i]) {
				continue
			}
			_, _, y1, ok1 := value.Number(vals[i])
			if !ok1 {
				return value.BadValue(mongoerr.TypeMismatch, "Value to be filled must be numeric or nullish: found a %s", expr.TypeAlias(vals[i]))
			}
			if prev >= 0 && i-prev > 1 {
				_, _, y0, _ := value.Number(vals[prev])
				for j := prev + 1; j < i; j++ {
					y := y0 + (pos[j]-pos[prev])*(y1-y0)/(pos[i]-pos[prev])
					docs[j] = setTopField(docs[j], o.field, value.DoubleValue(y))
				}
			}
			prev = i
		}
		// Before the first value and after the last one: null.
		for i := range docs {
			if value.IsNullish(vals[i]) && docs[i].Lookup(o.field).Type != bsoncore.TypeDouble {
				docs[i] = setTopField(docs[i], o.field, value.Null)
			}
		}
	}
	return nil
}
