package agg

import (
	"math"
	"slices"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/expr"
	"github.com/tsproxy/tsproxy/rewrite/expr/value"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// $densify: the documents, ordered by partition and field, with a new
// document {<partition fields>, <field>: v} for each value v of the step
// grid that no document of the partition has. The grid starts at the
// lowest value of all documents ("full"), of each partition
// ("partition"), or at a given lower bound (bounds [lo, hi), hi
// excluded); dates step by a unit up to weeks (calendar months are not
// supported).
type densifyStage struct {
	field  []string
	by     partitionKey // by fields
	step   float64
	unitMs int64 // 0: numbers
	bounds string
	lo, hi float64
	// stepKind and loKind are the number types of the step and of an
	// explicit lower bound: a generated number has the type $add gives
	// the grid's start plus the step, as MongoDB makes it.
	stepKind, loKind value.NumKind
	in               buffer
	next             processor
	// generatedDocs counts what the stage made (maxDensifyDocs at most).
	generatedDocs int
}

// maxDensifyDocs bounds the documents one $densify generates, as
// MongoDB's internalQueryMaxDensifyDocs (500,000) does.
const maxDensifyDocs = 500_000

func compileDensify(v value.Value, next processor, opts Options) (processor, error) {
	d, ok := v.DocumentOK()
	if !ok {
		return nil, value.BadValue(mongoerr.FailedToParse, "the $densify stage specification must be an object")
	}
	s := &densifyStage{in: buffer{stage: "$densify", max: opts.MaxMemory}, next: next}
	elems, _ := d.Elements()
	var rangeDoc bsoncore.Document
	for _, e := range elems {
		switch e.Key() {
		case "field":
			f, ok := e.Value().StringValueOK()
			if !ok || f == "" || f[0] == '$' {
				return nil, value.BadValue(mongoerr.FailedToParse, "$densify 'field' must be a field path without '$'")
			}
			s.field = splitPath(f)
		case "partitionByFields":
			fields, err := readPartitionFields("$densify", e.Value())
			if err != nil {
				return nil, err
			}
			s.by.fields = fields
		case "range":
			r, ok := e.Value().DocumentOK()
			if !ok {
				return nil, value.BadValue(mongoerr.TypeMismatch, "$densify 'range' must be an object")
			}
			rangeDoc = r
		default:
			return nil, value.BadValue(mongoerr.IDLUnknownField, "BSON field '$densify.%s' is an unknown field.", e.Key())
		}
	}
	if s.field == nil || rangeDoc == nil {
		return nil, value.BadValue(mongoerr.IDLFailedToParse, "$densify needs 'field' and 'range'")
	}
	if len(s.field) > 1 {
		return nil, value.Unsupported("$densify of a dotted field")
	}
	for _, p := range s.by.fields {
		if len(p) > 1 {
			return nil, value.Unsupported("$densify partitioned by a dotted field")
		}
	}
	var boundsV value.Value
	re, _ := rangeDoc.Elements()
	for _, e := range re {
		switch e.Key() {
		case "step":
			k, i, f, ok := value.Number(e.Value())
			if !ok || k == value.KindDecimal {
				return nil, value.BadValue(5733401, "the step parameter in a range statement must be a whole number when densifying a date range")
			}
			if k != value.KindDouble {
				f = float64(i)
			}
			if f <= 0 {
				return nil, value.BadValue(5733401, "the step parameter in a range statement must be a strictly positive numeric value")
			}
			s.step, s.stepKind = f, k
		case "unit":
			u, ok := e.Value().StringValueOK()
			ms, known := windowUnits[u]
			if !ok || !known {
				return nil, value.Unsupported("the $densify unit %s", e.Value())
			}
			s.unitMs = ms
		case "bounds":
			boundsV = e.Value()
		default:
			return nil, value.BadValue(mongoerr.IDLUnknownField, "BSON field '$densify.range.%s' is an unknown field.", e.Key())
		}
	}
	if s.step == 0 || boundsV.Type == 0 {
		return nil, value.BadValue(mongoerr.IDLFailedToParse, "$densify 'range' needs 'step' and 'bounds'")
	}
	if s.unitMs > 0 && s.step != math.Trunc(s.step) {
		return nil, value.BadValue(5733401, "the step parameter in a range statement must be a whole number when densifying a date range")
	}
	if b, ok := boundsV.StringValueOK(); ok {
		if b != "full" && b != "partition" {
			return nil, value.BadValue(5946802, "$densify bounds must be 'full', 'partition' or an array of two values, not %q", b)
		}
		s.bounds = b
	} else {
		arr, ok := boundsV.ArrayOK()
		vals, _ := arr.Values()
		if !ok || len(vals) != 2 {
			return nil, value.BadValue(5733403, "a bounding array in a range statement must have exactly two elements")
		}
		var err error
		if s.lo, err = s.position(vals[0]); err != nil {
			return nil, err
		}
		s.loKind, _, _, _ = value.Number(vals[0])
		if s.hi, err = s.position(vals[1]); err != nil {
			return nil, err
		}
		if s.lo > s.hi {
			return nil, value.BadValue(5733402, "a bounding array must be an ascending array of either two dates or two numbers")
		}
		s.bounds = "explicit"
	}
	return s, nil
}

// position is a field value on the grid's axis: ms for dates, the number
// otherwise; a value of the other kind is an error.
func (s *densifyStage) position(v value.Value) (float64, error) {
	if s.unitMs > 0 {
		if v.Type != bsoncore.TypeDateTime {
			return 0, value.BadValue(5733409, "$densify: a value of %q is a %s, expected a date (the range has a unit)", s.field[0], expr.TypeAlias(v))
		}
		return float64(v.DateTime()), nil
	}
	k, i, f, ok := value.Number(v)
	if !ok || k == value.KindDecimal {
		return 0, value.BadValue(5733201, "$densify: a value of %q is a %s, expected a number (the range has no unit)", s.field[0], expr.TypeAlias(v))
	}
	if k != value.KindDouble {
		f = float64(i)
	}
	return f, nil
}

// value is a generated value at pos of a grid of numbers of kind.
func (s *densifyStage) value(pos float64, kind value.NumKind) value.Value {
	switch {
	case s.unitMs > 0:
		return value.DateValue(int64(pos))
	case kind == value.KindInt32 && math.Abs(pos) < 1<<31:
		return value.Int32Value(int32(pos))
	case kind == value.KindInt32 || kind == value.KindInt64:
		// $add of int32s past int32's range gives a long.
		return value.Value{Type: bsoncore.TypeInt64, Data: bsoncore.AppendInt64(nil, int64(pos))}
	}
	return value.DoubleValue(pos)
}

// gridKind is the number type of a grid starting at a value of kind
// start: what $add of it and the step gives (a double with either, else
// a long with either, else an int32).
func (s *densifyStage) gridKind(start value.NumKind) value.NumKind {
	switch {
	case start == value.KindDouble || s.stepKind == value.KindDouble:
		return value.KindDouble
	case start == value.KindInt64 || s.stepKind == value.KindInt64:
		return value.KindInt64
	}
	return value.KindInt32
}

func (s *densifyStage) push(doc bsoncore.Document) error { return s.in.Add(doc) }

func (s *densifyStage) flush() error {
	docs := s.in.take()
	parts, err := s.by.partitions(docs, nil)
	if err != nil {
		return err
	}
	gmin, gmax := math.Inf(1), math.Inf(-1)
	var gminKind value.NumKind
	items := make([][]densifyItem, len(parts))
	for pi, p := range parts {
		for _, d := range p.docs {
			it := densifyItem{doc: d}
			if v := expr.LookupPath(value.Value{Type: bsoncore.TypeEmbeddedDocument, Data: d}, s.field); !value.IsNullish(v) {
				pos, err := s.position(v)
				if err != nil {
					return err
				}
				it.pos, it.has = pos, true
				it.kind, _, _, _ = value.Number(v)
				if pos < gmin {
					gminKind = it.kind
				}
				gmin, gmax = min(gmin, pos), max(gmax, pos)
			}
			items[pi] = append(items[pi], it)
		}
	}
	step := s.step
	if s.unitMs > 0 {
		step *= float64(s.unitMs)
	}
	for pi, p := range parts {
		slices.SortStableFunc(items[pi], func(a, b densifyItem) int {
			switch {
			case !a.has && !b.has:
				return 0
			case !a.has:
				return -1
			case !b.has:
				return 1
			}
			return cmpFloat(a.pos, b.pos)
		})
		start, end, inclusive, startKind := s.lo, s.hi, false, s.loKind
		switch s.bounds {
		case "full":
			start, end, inclusive, startKind = gmin, gmax, true, gminKind
		case "partition":
			start, end, inclusive = math.Inf(1), math.Inf(-1), true
			for _, it := range items[pi] {
				if it.has {
					if it.pos < start {
						startKind = it.kind
					}
					start, end = min(start, it.pos), max(end, it.pos)
				}
			}
		}
		if err := s.mergeGrid(p.key, items[pi], grid{start: start, end: end, inclusive: inclusive, step: step, kind: s.gridKind(startKind)}); err != nil {
			return err
		}
	}
	return s.next.flush()
}

type densifyItem struct {
	doc  bsoncore.Document
	pos  float64
	kind value.NumKind // of a number
	has  bool          // the field holds a value (else it sorts first, untouched)
}

// grid is the values a partition's documents are densified to: start,
// then each value plus step, up to end.
type grid struct {
	start, end, step float64
	inclusive        bool          // end is a value of the grid
	kind             value.NumKind // of its numbers
}

// mergeGrid pushes a partition's documents (sorted) with a generated
// document for each grid value up to end that none has. Values are made
// by adding the step to the one before, as MongoDB does: start + k*step
// differs from it in doubles (0.1 ten times is not 1).
func (s *densifyStage) mergeGrid(key value.Value, items []densifyItem, g grid) error {
	start, end, inclusive, step := g.start, g.end, g.inclusive, g.step
	hasGrid := !math.IsInf(start, 0)
	if hasGrid && start+step == start {
		return value.BadValue(5733401, "$densify: the step %v is too small for values around %v (adding it changes nothing)", step, start)
	}
	next := start
	inRange := func() bool { return hasGrid && (next < end || (inclusive && next == end)) }
	advance := func() { next += step }
	emit := func() error {
		s.in.bytes += 64
		s.generatedDocs++
		if s.in.bytes > s.in.max {
			return exceeded("$densify", s.in.max)
		}
		if s.generatedDocs > maxDensifyDocs {
			return value.BadValue(5897900, "$densify would generate more than %d documents", maxDensifyDocs)
		}
		err := s.generated(key, s.value(next, g.kind))
		advance()
		return err
	}
	for _, it := range items {
		if it.has {
			for inRange() && next < it.pos {
				if err := emit(); err != nil {
					return err
				}
			}
			if inRange() && next == it.pos {
				advance()
			}
		}
		if err := s.next.push(it.doc); err != nil {
			return err
		}
	}
	for inRange() {
		if err := emit(); err != nil {
			return err
		}
	}
	return nil
}

// generated pushes {<field>: pos, <partition fields>...}, the order of
// the generated documents in MongoDB's $densify examples.
func (s *densifyStage) generated(key value.Value, v value.Value) error {
	idx, out := bsoncore.AppendDocumentStart(nil)
	out = bsoncore.AppendValueElement(out, s.field[0], v)
	for i, p := range s.by.fields {
		if v := s.by.field(key, i); !value.IsNullish(v) {
			out = bsoncore.AppendValueElement(out, p[0], v)
		}
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return s.next.push(out)
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
