package agg

import (
	"math"
	"slices"
	"strings"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/expr"
	"github.com/tsproxy/tsproxy/rewrite/expr/value"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// $setWindowFields: every input document, ordered by partition then by
// sortBy (MongoDB sorts so too), with each output field the accumulator
// over its window: the whole partition, a range of positions
// (documents: [lo, hi]) or of sortBy values (range: [lo, hi], with a
// unit for dates). The window is summed afresh for each document
// (time grows with the window's size).
type windowStage struct {
	by      partitionKey
	keys    []sortKey
	outputs []windowOutput
	in      buffer
	next    processor
}

type windowBound struct {
	unbounded, current bool
	n                  float64 // positions, or sortBy units
}

type windowOutput struct {
	field   string
	acc     expr.AccumulatorSpec // an accumulator's; for the other functions, acc.arg is their input
	fn      string               // "" for an accumulator, else the window-only function
	byRange bool
	bounded bool // a documents or range window (else the whole partition)
	lo, hi  windowBound
	unitMs  int64 // a range window's unit over dates; 0: numbers
	// Of the window-only functions: $shift's offset and default,
	// $derivative's and $integral's unit (0: the sortBy is a number),
	// $expMovingAvg's alpha.
	shiftBy  int
	shiftDef expr.Expr
	fnUnitMs int64
	alpha    float64
}

var windowUnits = map[string]int64{"millisecond": 1, "second": 1000, "minute": 60_000, "hour": 3_600_000, "day": 86_400_000, "week": 7 * 86_400_000}

func compileWindowFields(v value.Value, next processor, opts Options) (processor, error) {
	d, ok := v.DocumentOK()
	if !ok {
		return nil, value.BadValue(mongoerr.FailedToParse, "the $setWindowFields stage specification must be an object")
	}
	spec, err := readPartitioned("$setWindowFields", d, false)
	if err != nil {
		return nil, err
	}
	w := &windowStage{by: spec.by, keys: spec.keys, in: buffer{stage: "$setWindowFields", max: opts.MaxMemory}, next: next}
	output := spec.output
	oe, _ := output.Elements()
	for _, e := range oe {
		out, err := compileWindowOutput(e.Key(), e.Value(), w.keys)
		if err != nil {
			return nil, err
		}
		w.outputs = append(w.outputs, out)
	}
	return w, nil
}

func compileWindowOutput(field string, v value.Value, keys []sortKey) (windowOutput, error) {
	out := windowOutput{field: field}
	if strings.Contains(field, ".") || strings.HasPrefix(field, "$") {
		return out, value.Unsupported("a $setWindowFields output field named %q", field)
	}
	d, ok := v.DocumentOK()
	if !ok {
		return out, value.BadValue(mongoerr.FailedToParse, "$setWindowFields output field '%s' must be an object", field)
	}
	var accElem *bsoncore.Element
	elems, _ := d.Elements()
	for i, e := range elems {
		switch {
		case e.Key() == "window":
			if err := out.readWindow(e.Value(), keys); err != nil {
				return out, err
			}
		case strings.HasPrefix(e.Key(), "$"):
			if accElem != nil {
				return out, value.BadValue(mongoerr.FailedToParse, "$setWindowFields output field '%s' names two functions", field)
			}
			accElem = &elems[i]
		default:
			return out, value.BadValue(mongoerr.FailedToParse, "'window' field is the only allowed field in a $setWindowFields output besides the function, found %q", e.Key())
		}
	}
	if accElem == nil {
		return out, value.BadValue(mongoerr.FailedToParse, "$setWindowFields output field '%s' needs a window function", field)
	}
	if windowFunctions[accElem.Key()] {
		return out, out.readFunction(accElem.Key(), accElem.Value(), keys)
	}
	accDoc := bsoncore.NewDocumentBuilder().AppendValue(accElem.Key(), accElem.Value()).Build()
	spec, err := expr.CompileAccumulator(field, value.Value{Type: bsoncore.TypeEmbeddedDocument, Data: accDoc})
	if err != nil {
		if mongoerr.CodeOf(err) == mongoerr.NotImplemented {
			return out, value.Unsupported("the window function %q", accElem.Key())
		}
		return out, err
	}
	out.acc = spec
	return out, nil
}

func (o *windowOutput) readWindow(v value.Value, keys []sortKey) error {
	d, ok := v.DocumentOK()
	if !ok {
		return value.BadValue(mongoerr.FailedToParse, "'window' field must be an object")
	}
	var unit string
	elems, _ := d.Elements()
	for _, e := range elems {
		switch e.Key() {
		case "documents", "range":
			if o.bounded {
				return value.BadValue(mongoerr.FailedToParse, "'window' field can only specify one of 'documents' or 'range'")
			}
			o.bounded, o.byRange = true, e.Key() == "range"
			arr, ok := e.Value().ArrayOK()
			vals, _ := arr.Values()
			if !ok || len(vals) != 2 {
				return value.BadValue(mongoerr.FailedToParse, "Window bounds must be a 2-element array: %s", e.Value())
			}
			var err error
			if o.lo, err = readBound(vals[0], o.byRange); err != nil {
				return err
			}
			if o.hi, err = readBound(vals[1], o.byRange); err != nil {
				return err
			}
		case "unit":
			s, ok := e.Value().StringValueOK()
			if _, known := windowUnits[s]; !ok || !known {
				return value.Unsupported("the window unit %s", e.Value())
			}
			unit = s
		default:
			return value.BadValue(mongoerr.FailedToParse, "'window' has an unexpected field %q", e.Key())
		}
	}
	if unit != "" {
		if !o.byRange {
			return value.BadValue(mongoerr.FailedToParse, "Window bounds can only specify 'unit' with range-based bounds.")
		}
		o.unitMs = windowUnits[unit]
	}
	if o.bounded && !(o.lo.unbounded && o.hi.unbounded) && len(keys) == 0 {
		return value.BadValue(5339901, "Document-based bounds require a sortBy")
	}
	if o.byRange && (len(keys) != 1 || keys[0].desc) {
		return value.Unsupported("a range window without exactly one ascending sortBy field")
	}
	return nil
}

func readBound(v value.Value, byRange bool) (windowBound, error) {
	if s, ok := v.StringValueOK(); ok {
		switch s {
		case "unbounded":
			return windowBound{unbounded: true}, nil
		case "current":
			return windowBound{current: true}, nil
		}
		return windowBound{}, value.BadValue(mongoerr.FailedToParse, "Window bounds must be 'unbounded', 'current', or a number: %q", s)
	}
	k, i, f, ok := value.Number(v)
	if !ok || k == value.KindDecimal {
		return windowBound{}, value.BadValue(mongoerr.FailedToParse, "Window bounds must be 'unbounded', 'current', or a number: %s", v)
	}
	if k != value.KindDouble {
		f = float64(i)
	} else if !byRange && f != math.Trunc(f) {
		return windowBound{}, value.BadValue(mongoerr.FailedToParse, "Numeric document-based bounds must be an integer: %v", f)
	}
	return windowBound{n: f}, nil
}

func (w *windowStage) push(doc bsoncore.Document) error { return w.in.Add(doc) }

func (w *windowStage) flush() error {
	parts, err := w.by.partitions(w.in.take(), w.keys)
	if err != nil {
		return err
	}
	for _, p := range parts {
		cols := make([][]value.Value, len(w.outputs))
		for j, o := range w.outputs {
			cols[j] = make([]value.Value, len(p.docs))
			for i, d := range p.docs {
				v, err := o.acc.Arg.Eval(d)
				if err != nil {
					return err
				}
				cols[j][i] = v
			}
		}
		results := make([][]value.Value, len(w.outputs))
		for j, o := range w.outputs {
			res, err := o.compute(p.docs, cols[j], w.keys)
			if err != nil {
				return err
			}
			results[j] = res
		}
		for i, d := range p.docs {
			out := d
			for j, o := range w.outputs {
				out = setTopField(out, o.field, results[j][i])
			}
			if err := w.next.push(out); err != nil {
				return err
			}
		}
	}
	return w.next.flush()
}

// compute is the output's value for each document of one partition.
func (o windowOutput) compute(docs []bsoncore.Document, vals []value.Value, keys []sortKey) ([]value.Value, error) {
	if o.fn != "" {
		return o.computeFunction(docs, vals, keys)
	}
	n := len(docs)
	out := make([]value.Value, n)
	window := func(a, b int) (value.Value, error) {
		acc := o.acc.Make()
		for j := max(a, 0); j <= min(b, n-1); j++ {
			acc.Add(vals[j])
		}
		return acc.Result()
	}
	if !o.bounded || (o.lo.unbounded && o.hi.unbounded) {
		v, err := window(0, n-1)
		for i := range out {
			out[i] = v
		}
		return out, err
	}
	var pos []float64 // sortBy values, for range windows
	if o.byRange {
		pos = make([]float64, n)
		for i, d := range docs {
			v := expr.LookupPath(value.Value{Type: bsoncore.TypeEmbeddedDocument, Data: d}, keys[0].path)
			switch {
			case o.unitMs > 0 && v.Type == bsoncore.TypeDateTime:
				pos[i] = float64(v.DateTime()) / float64(o.unitMs)
			case o.unitMs == 0 && v.Type != bsoncore.TypeDateTime:
				k, iv, f, ok := value.Number(v)
				if !ok || k == value.KindDecimal {
					return nil, value.BadValue(5429414, "Invalid range: Expected the sortBy field to be a number, but it was %s", expr.TypeAlias(v))
				}
				if k != value.KindDouble {
					f = float64(iv)
				}
				pos[i] = f
			case o.unitMs > 0:
				return nil, value.BadValue(5429513, "Invalid range: Expected the sortBy field to be a Date, but it was %s", expr.TypeAlias(v))
			default:
				return nil, value.BadValue(5429414, "Invalid range: Expected the sortBy field to be a number, but it was %s", expr.TypeAlias(v))
			}
		}
	}
	for i := range docs {
		a, b := o.windowAt(i, n, pos)
		v, err := window(a, b)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

// upperBound is the first index whose value is above x.
func upperBound(sorted []float64, x float64) int {
	i, found := slices.BinarySearch(sorted, x)
	for found && i < len(sorted) && sorted[i] == x {
		i++
	}
	return i
}

// setTopField is doc with field set to v: in place where it is, else
// appended.
func setTopField(doc bsoncore.Document, field string, v value.Value) bsoncore.Document {
	idx, out := bsoncore.AppendDocumentStart(nil)
	elems, _ := doc.Elements()
	set := false
	for _, e := range elems {
		if e.Key() == field {
			out = bsoncore.AppendValueElement(out, field, v)
			set = true
			continue
		}
		out = bsoncore.AppendValueElement(out, e.Key(), e.Value())
	}
	if !set {
		out = bsoncore.AppendValueElement(out, field, v)
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return out
}
