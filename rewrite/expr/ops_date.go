package expr

import (
	"time"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/expr/value"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// $dateFromParts and $dateToParts, in the calendar or the ISO week form.
// Parts out of their usual range carry into the next unit (month 14 is
// February of the next year), as on MongoDB.

func init() {
	rawOperators["$dateFromParts"] = compileDateFromParts
	rawOperators["$dateToParts"] = compileDateToParts
}

var (
	calendarParts = []string{"year", "month", "day", "hour", "minute", "second", "millisecond"}
	isoParts      = []string{"isoWeekYear", "isoWeek", "isoDayOfWeek", "hour", "minute", "second", "millisecond"}
	partDefaults  = []int64{0, 1, 1, 0, 0, 0, 0}
)

type dateFromParts struct {
	iso   bool
	parts []Expr // in calendarParts or isoParts order; nil: default
	zone  Expr
}

func compileDateFromParts(name string, v value.Value, depth level) (Expr, error) {
	d, ok := v.DocumentOK()
	if !ok {
		return nil, value.BadValue(40519, "%s only supports an object as its argument", name)
	}
	f := dateFromParts{parts: make([]Expr, len(calendarParts))}
	_, f.iso = lookupAny(d, "isoWeekYear", "isoWeek", "isoDayOfWeek")
	if _, cal := lookupAny(d, "year", "month", "day"); cal && f.iso {
		return nil, value.BadValue(40489, "%s does not allow mixing natural dates with ISO dates", name)
	}
	names := calendarParts
	if f.iso {
		names = isoParts
	}
	elems, _ := d.Elements()
	for _, e := range elems {
		x, err := compileExpr(e.Value(), depth.next())
		if err != nil {
			return nil, err
		}
		if e.Key() == "timezone" {
			f.zone = x
			continue
		}
		i := indexOfString(names, e.Key())
		if i < 0 {
			return nil, value.BadValue(40518, "Unrecognized argument to %s: %s", name, e.Key())
		}
		f.parts[i] = x
	}
	if f.parts[0] == nil {
		return nil, value.BadValue(40516, "%s requires either 'year' or 'isoWeekYear' to be present", name)
	}
	return f, nil
}

func lookupAny(d bsoncore.Document, keys ...string) (string, bool) {
	for _, k := range keys {
		if _, err := d.LookupErr(k); err == nil {
			return k, true
		}
	}
	return "", false
}

func indexOfString(list []string, s string) int {
	for i, x := range list {
		if x == s {
			return i
		}
	}
	return -1
}

func (f dateFromParts) Eval(doc bsoncore.Document) (value.Value, error) {
	names := calendarParts
	if f.iso {
		names = isoParts
	}
	vals := make([]int64, len(names))
	for i, p := range f.parts {
		vals[i] = partDefaults[i]
		if p == nil {
			continue
		}
		v, err := p.Eval(doc)
		if err != nil {
			return value.Missing, err
		}
		if value.IsNullish(v) {
			return value.Null, nil
		}
		n, ok := bsonutil.WholeNumber(v)
		if !ok {
			return value.Missing, value.BadValue(40515, "'%s' must evaluate to an integer, found %s with value %s", names[i], TypeAlias(v), value.Describe(v))
		}
		if err := checkPartRange(names[i], n, i == 0); err != nil {
			return value.Missing, err
		}
		vals[i] = n
	}
	loc := utc
	if f.zone != nil {
		zv, err := f.zone.Eval(doc)
		if err != nil {
			return value.Missing, err
		}
		if value.IsNullish(zv) {
			return value.Null, nil
		}
		if loc, err = location(zv); err != nil {
			return value.Missing, err
		}
	}
	return value.DateValue(partsTime(f.iso, vals, loc).UnixMilli()), nil
}

// checkPartRange applies MongoDB's bounds: the year 1 to 9999, the other
// parts a 16-bit integer.
func checkPartRange(name string, n int64, year bool) error {
	if year && (n < 1 || n > 9999) {
		return value.BadValue(mongoerr.Code(40523), "'%s' must evaluate to an integer in the range 1 to 9999, found %d", name, n)
	}
	if !year && (n < -32768 || n > 32767) {
		return value.BadValue(mongoerr.Code(31034), "'%s' must evaluate to a value in the range [-32768, 32767]; value %d is not in range", name, n)
	}
	return nil
}

// partsTime is the parts as a wall-clock time in loc; time.Date carries
// out-of-range parts as MongoDB does.
func partsTime(iso bool, v []int64, loc *time.Location) time.Time {
	y, m, d := int(v[0]), time.Month(v[1]), int(v[2])
	if iso {
		// ISO week 1 holds January 4th; its Monday starts the ISO year.
		jan4 := time.Date(y, 1, 4, 0, 0, 0, 0, time.UTC)
		m, d = 1, 4-(int(jan4.Weekday())+6)%7+int((v[1]-1)*7+(v[2]-1))
	}
	return time.Date(y, m, d, int(v[3]), int(v[4]), int(v[5]), int(v[6])*int(time.Millisecond), loc)
}

// $dateToParts: {date, timezone?, iso8601?}.
type dateToParts struct {
	z   zoneExpr
	iso Expr
}

func compileDateToParts(name string, v value.Value, depth level) (Expr, error) {
	z, extra, err := compileZoned(name, v, depth, "iso8601")
	if err != nil {
		return nil, err
	}
	return dateToParts{z: z, iso: extra["iso8601"]}, nil
}

func (p dateToParts) Eval(doc bsoncore.Document) (value.Value, error) {
	t, isNull, err := p.z.Eval(doc)
	if err != nil || isNull {
		return value.Null, err
	}
	iso := false
	if p.iso != nil {
		v, err := p.iso.Eval(doc)
		if err != nil {
			return value.Missing, err
		}
		if value.IsNullish(v) {
			return value.Null, nil
		}
		if v.Type != bsoncore.TypeBoolean {
			return value.Missing, value.BadValue(40521, "iso8601 must evaluate to a bool, found %s", TypeAlias(v))
		}
		iso = v.Boolean()
	}
	b := bsoncore.NewDocumentBuilder()
	if iso {
		y, w := t.ISOWeek()
		b.AppendInt32("isoWeekYear", int32(y)).AppendInt32("isoWeek", int32(w)).AppendInt32("isoDayOfWeek", int32((int(t.Weekday())+6)%7+1))
	} else {
		b.AppendInt32("year", int32(t.Year())).AppendInt32("month", int32(t.Month())).AppendInt32("day", int32(t.Day()))
	}
	b.AppendInt32("hour", int32(t.Hour())).AppendInt32("minute", int32(t.Minute())).
		AppendInt32("second", int32(t.Second())).AppendInt32("millisecond", int32(t.Nanosecond()/1e6))
	return value.Value{Type: bsoncore.TypeEmbeddedDocument, Data: b.Build()}, nil
}
