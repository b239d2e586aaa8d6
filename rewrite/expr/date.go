package expr

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
	_ "time/tzdata" // $dateTrunc and the date parts take Olson time zones

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/expr/value"
)

var utc = time.UTC

// dateOperators are the date parts: each reads its date in a time zone.
var dateOperators = map[string]func(t time.Time) int64{
	"$year":        func(t time.Time) int64 { return int64(t.Year()) },
	"$month":       func(t time.Time) int64 { return int64(t.Month()) },
	"$dayOfMonth":  func(t time.Time) int64 { return int64(t.Day()) },
	"$hour":        func(t time.Time) int64 { return int64(t.Hour()) },
	"$minute":      func(t time.Time) int64 { return int64(t.Minute()) },
	"$second":      func(t time.Time) int64 { return int64(t.Second()) },
	"$millisecond": func(t time.Time) int64 { return int64(t.Nanosecond() / 1e6) },
	"$dayOfWeek":   func(t time.Time) int64 { return int64(t.Weekday()) + 1 },
	"$dayOfYear":   func(t time.Time) int64 { return int64(t.YearDay()) },
	"$week":        func(t time.Time) int64 { return int64((t.YearDay() - 1 + 7 - int(t.Weekday())) / 7) },
	"$isoWeek":     func(t time.Time) int64 { _, w := t.ISOWeek(); return int64(w) },
	"$isoWeekYear": func(t time.Time) int64 { y, _ := t.ISOWeek(); return int64(y) },
	"$isoDayOfWeek": func(t time.Time) int64 {
		return int64((int(t.Weekday())+6)%7 + 1)
	},
}

// zoneExpr is a date and its time zone ("UTC" when none is given).
type zoneExpr struct {
	date, zone Expr
}

func (z zoneExpr) Eval(doc bsoncore.Document) (t time.Time, isNull bool, err error) {
	d, err := z.date.Eval(doc)
	if err != nil {
		return time.Time{}, false, err
	}
	if value.IsNullish(d) {
		return time.Time{}, true, nil
	}
	ms, err := dateOf(d)
	if err != nil {
		return time.Time{}, false, err
	}
	loc := utc
	if z.zone != nil {
		zv, err := z.zone.Eval(doc)
		if err != nil {
			return time.Time{}, false, err
		}
		if value.IsNullish(zv) {
			return time.Time{}, true, nil
		}
		if loc, err = location(zv); err != nil {
			return time.Time{}, false, err
		}
	}
	return time.UnixMilli(ms).In(loc), false, nil
}

// dateOf reads a date, a Timestamp or an ObjectId's time, in ms.
func dateOf(v value.Value) (int64, error) {
	switch v.Type {
	case bsoncore.TypeDateTime:
		return v.DateTime(), nil
	case bsoncore.TypeObjectID:
		return bson.ObjectID(v.ObjectID()).Timestamp().UnixMilli(), nil
	case bsoncore.TypeTimestamp:
		t, _ := v.Timestamp()
		return int64(t) * 1000, nil
	}
	return 0, value.BadValue(16006, "can't convert from BSON type %s to Date", TypeAlias(v))
}

var offsetZone = regexp.MustCompile(`^([+-])(\d{2}):?(\d{2})?$`)

// location reads a time zone: an Olson name or a UTC offset.
func location(v value.Value) (*time.Location, error) {
	if v.Type != bsoncore.TypeString {
		return nil, value.BadValue(40517, "timezone must evaluate to a string, found %s", TypeAlias(v))
	}
	s := v.StringValue()
	if m := offsetZone.FindStringSubmatch(s); m != nil {
		h, _ := strconv.Atoi(m[2])
		mins := 0
		if m[3] != "" {
			mins, _ = strconv.Atoi(m[3])
		}
		off := (h*60 + mins) * 60
		if m[1] == "-" {
			off = -off
		}
		return time.FixedZone(s, off), nil
	}
	loc, err := time.LoadLocation(s)
	if err != nil || s == "" || s == "Local" {
		return nil, value.BadValue(40485, "unrecognized time zone identifier: \"%s\"", s)
	}
	return loc, nil
}

// compileZoned reads a date operator's argument: a date expression, or
// {date, timezone} (and, for $dateTrunc and $dateToString, more fields,
// returned in extra).
func compileZoned(name string, v value.Value, depth level, allowed ...string) (zoneExpr, map[string]Expr, error) {
	var z zoneExpr
	if v.Type == bsoncore.TypeEmbeddedDocument {
		elems, _ := bsoncore.Document(v.Data).Elements()
		if len(elems) > 0 && !strings.HasPrefix(elems[0].Key(), "$") {
			extra := map[string]Expr{}
			for _, e := range elems {
				x, err := compileExpr(e.Value(), depth.next())
				if err != nil {
					return z, nil, err
				}
				switch k := e.Key(); {
				case k == "date":
					z.date = x
				case k == "timezone":
					z.zone = x
				case contains(allowed, k):
					extra[k] = x
				default:
					return z, nil, value.BadValue(40535, "unrecognized option to %s: \"%s\"", name, k)
				}
			}
			if z.date == nil {
				return z, nil, value.BadValue(40539, "missing 'date' argument to %s, provided: %s", name, bsoncore.Document(v.Data))
			}
			return z, extra, nil
		}
	}
	if len(allowed) > 0 {
		return z, nil, value.BadValue(18628, "%s only supports an object as its argument", name)
	}
	if v.Type == bsoncore.TypeArray {
		args, err := operatorArgs(name, v, depth)
		if err != nil {
			return z, nil, err
		}
		if err := wantArgs(name, args, 1); err != nil {
			return z, nil, err
		}
		z.date = args[0]
		return z, nil, nil
	}
	d, err := compileExpr(v, depth.next())
	z.date = d
	return z, nil, err
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

type datePart struct {
	z zoneExpr
	f func(time.Time) int64
}

func (p datePart) Eval(doc bsoncore.Document) (value.Value, error) {
	t, isNull, err := p.z.Eval(doc)
	if err != nil || isNull {
		return value.Null, err
	}
	return value.Int32Value(int32(p.f(t))), nil
}

func compileDatePart(name string, v value.Value, depth level, f func(time.Time) int64) (Expr, error) {
	z, _, err := compileZoned(name, v, depth)
	if err != nil {
		return nil, err
	}
	return datePart{z: z, f: f}, nil
}

// dateTrunc is $dateTrunc: bins of binSize units, aligned as MongoDB
// aligns them (on 2000-01-01T00:00:00 in the time zone).
type dateTrunc struct {
	z                          zoneExpr
	unit, binSize, startOfWeek Expr
}

func compileDateTrunc(v value.Value, depth level) (Expr, error) {
	z, extra, err := compileZoned("$dateTrunc", v, depth, "unit", "binSize", "startOfWeek")
	if err != nil {
		return nil, err
	}
	if extra["unit"] == nil {
		return nil, value.BadValue(5439101, "$dateTrunc requires 'unit' parameter")
	}
	return dateTrunc{z: z, unit: extra["unit"], binSize: extra["binSize"], startOfWeek: extra["startOfWeek"]}, nil
}

func (d dateTrunc) Eval(doc bsoncore.Document) (value.Value, error) {
	t, isNull, err := d.z.Eval(doc)
	if err != nil || isNull {
		return value.Null, err
	}
	uv, err := d.unit.Eval(doc)
	if err != nil {
		return value.Missing, err
	}
	if value.IsNullish(uv) {
		return value.Null, nil
	}
	if uv.Type != bsoncore.TypeString {
		return value.Missing, value.BadValue(5439103, "$dateTrunc parameter 'unit' value must be a string")
	}
	unit := uv.StringValue()
	bin := int64(1)
	if d.binSize != nil {
		bv, err := d.binSize.Eval(doc)
		if err != nil {
			return value.Missing, err
		}
		if value.IsNullish(bv) {
			return value.Null, nil
		}
		i, ok := bsonutil.WholeNumber(bv)
		if !ok {
			return value.Missing, value.BadValue(5439017, "$dateTrunc requires 'binSize' to be a 64-bit integer, but got value '%s' of type %s", bv, TypeAlias(bv))
		}
		if i <= 0 || i > maxBinSize {
			return value.Missing, value.BadValue(5439018, "$dateTrunc requires 'binSize' to be greater than 0 and at most %d, but got value %d", int64(maxBinSize), i)
		}
		bin = i
	}
	startOfWeek := time.Sunday
	if d.startOfWeek != nil && unit == "week" {
		sv, err := d.startOfWeek.Eval(doc)
		if err != nil {
			return value.Missing, err
		}
		if value.IsNullish(sv) {
			return value.Null, nil
		}
		w, ok := weekday(sv)
		if !ok {
			return value.Missing, value.BadValue(5439016, "$dateTrunc parameter 'startOfWeek' value cannot be recognized as a day of a week: %s", sv)
		}
		startOfWeek = w
	}
	ms, err := truncate(t, unit, bin, startOfWeek)
	if err != nil {
		return value.Missing, err
	}
	return value.DateValue(ms), nil
}

func weekday(v value.Value) (time.Weekday, bool) {
	if v.Type != bsoncore.TypeString {
		return 0, false
	}
	s := strings.ToLower(v.StringValue())
	for d := time.Sunday; d <= time.Saturday; d++ {
		name := strings.ToLower(d.String())
		if s == name || s == name[:3] {
			return d, true
		}
	}
	return 0, false
}

// maxBinSize bounds $dateTrunc's binSize (MongoDB's bound), so that a
// bin's length in milliseconds fits an int64.
const maxBinSize = 100_000_000_000

// The years of the dates a BSON date holds (milliseconds since 1970 in
// an int64: about 292 million years either way), a little inside them.
const (
	minDateYear = 1970 - 292_000_000
	maxDateYear = 1970 + 292_000_000
)

// truncate is t's bin start (ms): fixed units by their length from the
// reference; days, weeks, months, quarters and years by the calendar in
// t's zone.
func truncate(t time.Time, unit string, bin int64, startOfWeek time.Weekday) (int64, error) {
	loc := t.Location()
	ref := time.Date(2000, 1, 1, 0, 0, 0, 0, loc)
	fixed := map[string]time.Duration{"millisecond": time.Millisecond, "second": time.Second, "minute": time.Minute, "hour": time.Hour}
	if u, ok := fixed[unit]; ok {
		size := bin * u.Milliseconds()
		diff := t.UnixMilli() - ref.UnixMilli()
		return ref.UnixMilli() + floorDiv(diff, size)*size, nil
	}
	civil := func(tt time.Time) int64 { // days since 2000-01-01 on the calendar
		y, m, d := tt.Date()
		return int64(time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Sub(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)) / (24 * time.Hour))
	}
	// A bin of many days or years may start before the dates a BSON date
	// holds: MongoDB's dateAdd of the bin start fails (5166406), and the
	// start wrapped.
	overflowed := value.BadValue(5166406, "$dateTrunc: the bin start is outside the range of dates (dateAdd overflowed)")
	dayStart := func(days int64) (int64, error) {
		if days < (minDateYear-2000)*366 || days > (maxDateYear-2000)*366 {
			return 0, overflowed
		}
		return time.Date(2000, 1, 1+int(days), 0, 0, 0, 0, loc).UnixMilli(), nil
	}
	switch unit {
	case "day":
		return dayStart(floorDiv(civil(t), bin) * bin)
	case "week":
		// The reference week starts on the first startOfWeek on or
		// after 2000-01-01 (a Saturday).
		first := int64((int(startOfWeek) - int(time.Saturday) + 7) % 7)
		return dayStart(first + floorDiv(civil(t)-first, 7*bin)*7*bin)
	case "month", "quarter", "year":
		months := map[string]int64{"month": 1, "quarter": 3, "year": 12}[unit] * bin
		y, m, _ := t.Date()
		n := int64(y-2000)*12 + int64(m-1)
		n = floorDiv(n, months) * months
		year := 2000 + floorDiv(n, 12)
		if year < minDateYear || year > maxDateYear {
			return 0, overflowed
		}
		return time.Date(int(year), time.Month(n-floorDiv(n, 12)*12+1), 1, 0, 0, 0, 0, loc).UnixMilli(), nil
	}
	return 0, value.BadValue(5439014, "$dateTrunc parameter 'unit' value cannot be recognized as a time unit: %s", unit)
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

const defaultDateFormat = "%Y-%m-%dT%H:%M:%S.%LZ"

// dateToString is $dateToString.
type dateToString struct {
	z              zoneExpr
	format, onNull Expr
}

func compileDateToString(v value.Value, depth level) (Expr, error) {
	z, extra, err := compileZoned("$dateToString", v, depth, "format", "onNull")
	if err != nil {
		return nil, err
	}
	return dateToString{z: z, format: extra["format"], onNull: extra["onNull"]}, nil
}

func (d dateToString) Eval(doc bsoncore.Document) (value.Value, error) {
	t, isNull, err := d.z.Eval(doc)
	if err != nil {
		return value.Missing, err
	}
	if isNull {
		if d.onNull != nil {
			return d.onNull.Eval(doc)
		}
		return value.Null, nil
	}
	format := defaultDateFormat
	if d.z.zone != nil && d.format == nil {
		format = "%Y-%m-%dT%H:%M:%S.%L"
	}
	if d.format != nil {
		fv, err := d.format.Eval(doc)
		if err != nil {
			return value.Missing, err
		}
		if value.IsNullish(fv) {
			return value.Null, nil
		}
		if fv.Type != bsoncore.TypeString {
			return value.Missing, value.BadValue(18533, "$dateToString requires that 'format' be a string, found: %s with value %s", TypeAlias(fv), fv)
		}
		format = fv.StringValue()
	}
	if err := checkDateFormat(format); err != nil {
		return value.Missing, err
	}
	return value.StringValue(formatDate(t.UnixMilli(), format, t.Location())), nil
}

func checkDateFormat(format string) error {
	for i := 0; i < len(format); i++ {
		if format[i] != '%' {
			continue
		}
		if i+1 >= len(format) {
			return value.BadValue(18535, "Unmatched '%%' at end of format string")
		}
		i++
		if !strings.ContainsRune("dGHjLmMSuUVwYzZ%", rune(format[i])) {
			return value.BadValue(18536, "Invalid format character '%%%c' in format string", format[i])
		}
	}
	return nil
}

// formatDate formats ms in loc with MongoDB's format specifiers.
func formatDate(ms int64, format string, loc *time.Location) string {
	t := time.UnixMilli(ms).In(loc)
	var sb strings.Builder
	pad := func(n, width int) {
		s := strconv.Itoa(n)
		for len(s) < width {
			s = "0" + s
		}
		sb.WriteString(s)
	}
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' || i+1 >= len(format) {
			sb.WriteByte(c)
			continue
		}
		i++
		switch format[i] {
		case 'd':
			pad(t.Day(), 2)
		case 'G':
			y, _ := t.ISOWeek()
			pad(y, 4)
		case 'H':
			pad(t.Hour(), 2)
		case 'j':
			pad(t.YearDay(), 3)
		case 'L':
			pad(t.Nanosecond()/1e6, 3)
		case 'm':
			pad(int(t.Month()), 2)
		case 'M':
			pad(t.Minute(), 2)
		case 'S':
			pad(t.Second(), 2)
		case 'u':
			pad((int(t.Weekday())+6)%7+1, 1)
		case 'U':
			pad((t.YearDay()-1+7-int(t.Weekday()))/7, 2)
		case 'V':
			_, w := t.ISOWeek()
			pad(w, 2)
		case 'w':
			pad(int(t.Weekday())+1, 1)
		case 'Y':
			pad(t.Year(), 4)
		case 'z':
			_, off := t.Zone()
			sign := '+'
			if off < 0 {
				sign, off = '-', -off
			}
			sb.WriteRune(sign)
			pad(off/3600, 2)
			pad(off%3600/60, 2)
		case 'Z':
			_, off := t.Zone()
			sb.WriteString(strconv.Itoa(off / 60))
		case '%':
			sb.WriteByte('%')
		default:
			sb.WriteString(fmt.Sprintf("%%%c", format[i]))
		}
	}
	return sb.String()
}
