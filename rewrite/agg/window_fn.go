package agg

import (
	"math"
	"slices"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/expr"
	"github.com/tsproxy/tsproxy/rewrite/expr/value"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// The window-only functions of $setWindowFields: ranks and positions
// ($documentNumber, $rank, $denseRank, $shift), the exponential moving
// average, and the rate and area of a series over a window
// ($derivative, $integral).
var windowFunctions = map[string]bool{
	"$documentNumber": true, "$rank": true, "$denseRank": true, "$shift": true,
	"$expMovingAvg": true, "$derivative": true, "$integral": true,
}

func (o *windowOutput) readFunction(name string, v value.Value, keys []sortKey) error {
	o.fn = name
	o.acc.Arg = expr.Literal{V: value.Missing}
	args, isDoc := v.DocumentOK()
	if !isDoc {
		return value.BadValue(mongoerr.FailedToParse, "%s must be specified with an object", name)
	}
	switch name {
	case "$documentNumber", "$rank", "$denseRank":
		if len(args) != 5 {
			return value.BadValue(mongoerr.FailedToParse, "%s takes no arguments", name)
		}
		if name != "$documentNumber" && len(keys) != 1 {
			return value.BadValue(5371602, "%s must be specified with a top level sortBy expression with exactly one element", name)
		}
		if o.bounded {
			return value.BadValue(5371601, "Rank style window functions take no other arguments")
		}
		return nil
	}
	if len(keys) == 0 {
		return value.BadValue(mongoerr.FailedToParse, "%s requires a sortBy", name)
	}
	elems, _ := args.Elements()
	for _, e := range elems {
		var err error
		switch k := e.Key(); {
		case k == "output" && name == "$shift", k == "input" && name != "$shift":
			o.acc.Arg, err = expr.CompileTop(e.Value(), 1)
		case k == "by" && name == "$shift":
			kind, i, _, ok := value.Number(e.Value())
			if !ok || kind == value.KindDouble || kind == value.KindDecimal || i < math.MinInt32 || i > math.MaxInt32 {
				return value.BadValue(mongoerr.FailedToParse, "$shift's 'by' field must be an integer, but found %s", e.Value())
			}
			o.shiftBy = int(i)
		case k == "default" && name == "$shift":
			o.shiftDef, err = expr.CompileTop(e.Value(), 1)
		case k == "unit" && (name == "$derivative" || name == "$integral"):
			u, ok := e.Value().StringValueOK()
			ms, known := windowUnits[u]
			if !ok || !known {
				return value.Unsupported("the %s unit %s", name, e.Value())
			}
			o.fnUnitMs = ms
		case k == "N" && name == "$expMovingAvg":
			kind, i, _, ok := value.Number(e.Value())
			if !ok || kind == value.KindDouble || kind == value.KindDecimal || i <= 0 {
				return value.BadValue(mongoerr.FailedToParse, "'N' field must be an integer greater than zero, but found %s", e.Value())
			}
			o.alpha = 2 / (float64(i) + 1)
		case k == "alpha" && name == "$expMovingAvg":
			_, _, f, ok := value.Number(e.Value())
			if !ok || f <= 0 || f >= 1 {
				return value.BadValue(mongoerr.FailedToParse, "'alpha' must be between 0 and 1 (exclusive), found %s", e.Value())
			}
			o.alpha = f
		default:
			return value.BadValue(mongoerr.FailedToParse, "%s got an unexpected argument: %s", name, k)
		}
		if err != nil {
			return err
		}
	}
	switch name {
	case "$shift":
		if _, ok := o.acc.Arg.(expr.Literal); ok && o.acc.Arg.(expr.Literal).V.Type == 0 {
			return value.BadValue(mongoerr.FailedToParse, "$shift requires an 'output' expression")
		}
		if o.bounded {
			return value.BadValue(5424801, "$shift does not accept a 'window' field")
		}
	case "$expMovingAvg":
		if o.alpha == 0 {
			return value.BadValue(mongoerr.FailedToParse, "$expMovingAvg requires either 'N' or 'alpha'")
		}
		if o.bounded {
			return value.BadValue(5433602, "$expMovingAvg does not accept a 'window' field")
		}
	case "$derivative":
		if !o.bounded {
			return value.BadValue(5624901, "$derivative requires explicit window bounds")
		}
	}
	if (name == "$derivative" || name == "$integral") && (len(keys) != 1 || keys[0].desc) {
		return value.Unsupported("%s without exactly one ascending sortBy field", name)
	}
	return nil
}

// computeFunction is a window-only function's value for each document
// of one partition, sorted.
func (o windowOutput) computeFunction(docs []bsoncore.Document, vals []value.Value, keys []sortKey) ([]value.Value, error) {
	n := len(docs)
	out := make([]value.Value, n)
	sorter := &sortStage{keys: keys}
	switch o.fn {
	case "$documentNumber":
		for i := range out {
			out[i] = value.Int32Value(int32(i + 1))
		}
	case "$rank", "$denseRank":
		rank, dense := 1, 1
		for i := range docs {
			if i > 0 && sorter.compareDocs(docs[i-1], docs[i]) != 0 {
				rank, dense = i+1, dense+1
			}
			if o.fn == "$rank" {
				out[i] = value.Int32Value(int32(rank))
			} else {
				out[i] = value.Int32Value(int32(dense))
			}
		}
	case "$shift":
		for i, d := range docs {
			j := i + o.shiftBy
			switch {
			case j >= 0 && j < n:
				out[i] = vals[j]
				if out[i].Type == 0 {
					out[i] = value.Null
				}
			case o.shiftDef != nil:
				v, err := o.shiftDef.Eval(d)
				if err != nil {
					return nil, err
				}
				out[i] = v
			default:
				out[i] = value.Null
			}
		}
	case "$expMovingAvg":
		var ema float64
		started := false
		for i, v := range vals {
			_, iv, f, ok := value.Number(v)
			if !ok {
				out[i] = value.Null
				continue
			}
			if v.Type != bsoncore.TypeDouble {
				f = float64(iv)
			}
			if !started {
				ema, started = f, true
			} else {
				ema = o.alpha*f + (1-o.alpha)*ema
			}
			out[i] = value.DoubleValue(ema)
		}
	case "$derivative", "$integral":
		return o.rateOrArea(docs, vals, keys)
	}
	return out, nil
}

// rateOrArea is $derivative ((y_last - y_first) / (x_last - x_first)
// over the window) or $integral (the trapezoidal rule over the window),
// x being the sortBy value: ms over the unit for dates, else the number.
func (o windowOutput) rateOrArea(docs []bsoncore.Document, vals []value.Value, keys []sortKey) ([]value.Value, error) {
	n := len(docs)
	xs := make([]float64, n)
	ys := make([]float64, n)
	for i, d := range docs {
		xv := expr.LookupPath(value.Value{Type: bsoncore.TypeEmbeddedDocument, Data: d}, keys[0].path)
		switch {
		case xv.Type == bsoncore.TypeDateTime && o.fnUnitMs > 0:
			xs[i] = float64(xv.DateTime()) / float64(o.fnUnitMs)
		case xv.Type == bsoncore.TypeDateTime:
			return nil, value.BadValue(5624900, "%s where the sortBy is a Date requires a 'unit'", o.fn)
		default:
			k, iv, f, ok := value.Number(xv)
			if !ok || k == value.KindDecimal || o.fnUnitMs > 0 {
				return nil, value.BadValue(5624900, "%s with a 'unit' requires the sortBy to be a Date, and without one a number; found %s", o.fn, expr.TypeAlias(xv))
			}
			if k != value.KindDouble {
				f = float64(iv)
			}
			xs[i] = f
		}
		k, iv, f, ok := value.Number(vals[i])
		if !ok || k == value.KindDecimal {
			return nil, value.BadValue(5423901, "%s input must be numeric, found %s", o.fn, expr.TypeAlias(vals[i]))
		}
		if k != value.KindDouble {
			f = float64(iv)
		}
		ys[i] = f
	}
	out := make([]value.Value, n)
	for i := range docs {
		a, b := o.windowAt(i, n, xs)
		a, b = max(a, 0), min(b, n-1)
		if o.fn == "$derivative" {
			if b <= a || xs[b] == xs[a] {
				out[i] = value.Null
				continue
			}
			out[i] = value.DoubleValue((ys[b] - ys[a]) / (xs[b] - xs[a]))
			continue
		}
		area := 0.0
		for j := a; j < b; j++ {
			area += (xs[j+1] - xs[j]) * (ys[j] + ys[j+1]) / 2
		}
		out[i] = value.DoubleValue(area)
	}
	return out, nil
}

// windowAt is document i's window [a, b] (positions, not clamped); pos
// are the sortBy values (sorted ascending) for a range window: in the
// window's unit for an accumulator, in the function's for $derivative
// and $integral.
func (o windowOutput) windowAt(i, n int, pos []float64) (int, int) {
	if !o.bounded {
		return 0, n - 1
	}
	if o.byRange {
		// pos here is in the function's unit; range bounds are in the
		// window's unit (or plain numbers).
		scale := 1.0
		if o.unitMs > 0 && o.fnUnitMs > 0 {
			scale = float64(o.unitMs) / float64(o.fnUnitMs)
		}
		lo, hi := math.Inf(-1), math.Inf(1)
		if o.lo.current {
			lo = pos[i]
		} else if !o.lo.unbounded {
			lo = pos[i] + o.lo.n*scale
		}
		if o.hi.current {
			hi = pos[i]
		} else if !o.hi.unbounded {
			hi = pos[i] + o.hi.n*scale
		}
		a, _ := slices.BinarySearch(pos, lo)
		return a, upperBound(pos, hi) - 1
	}
	a, b := 0, n-1
	if o.lo.current {
		a = i
	} else if !o.lo.unbounded {
		a = i + int(o.lo.n)
	}
	if o.hi.current {
		b = i
	} else if !o.hi.unbounded {
		b = i + int(o.hi.n)
	}
	return a, b
}
