package summary

import (
	"strings"
	"time"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// dateTrunc is a $dateTrunc of the timeField in UTC, as MongoDB computes
// it: bins of binSize units counted from the reference 2000-01-01T00:00Z
// (for weeks, from the first startOfWeek day of 2000).
type dateTrunc struct {
	unitMillis  int64 // fixed-length units; 0 for calendar months
	unitMonths  int   // month 1, quarter 3, year 12
	binSize     int64
	refMillis   int64
	startOfWeek time.Weekday
}

const millisPerDay = 24 * 3600 * 1000

var (
	ref2000       = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	fixedUnits    = map[string]int64{"millisecond": 1, "second": 1000, "minute": 60 * 1000, "hour": 3600 * 1000, "day": millisPerDay, "week": 7 * millisPerDay}
	calendarUnits = map[string]int{"month": 1, "quarter": 3, "year": 12}
	weekdays      = map[string]time.Weekday{"sunday": time.Sunday, "monday": time.Monday, "tuesday": time.Tuesday, "wednesday": time.Wednesday, "thursday": time.Thursday, "friday": time.Friday, "saturday": time.Saturday}
)

// parseDateTrunc accepts {date: "$<timeField>", unit, binSize?,
// timezone?: UTC, startOfWeek?} with constant arguments.
func parseDateTrunc(v bsoncore.Value, timeField string) (dateTrunc, bool) {
	dt := dateTrunc{binSize: 1, refMillis: ref2000, startOfWeek: time.Sunday}
	d, ok := v.DocumentOK()
	if !ok {
		return dt, false
	}
	elems, err := d.Elements()
	if err != nil {
		return dt, false
	}
	var unit, weekStart string
	sawDate := false
	for _, e := range elems {
		s, isString := e.Value().StringValueOK()
		switch e.Key() {
		case "date":
			sawDate = isString && s == "$"+timeField
		case "unit":
			unit = s
		case "binSize":
			n, ok := bsonutil.WholeNumber(e.Value())
			if !ok || n <= 0 {
				return dt, false
			}
			dt.binSize = n
		case "timezone":
			if !isString || !utcName(s) {
				return dt, false
			}
		case "startOfWeek":
			if !isString {
				return dt, false
			}
			weekStart = s
		default:
			return dt, false
		}
	}
	if !sawDate {
		return dt, false
	}
	if m, ok := calendarUnits[unit]; ok {
		if dt.binSize > maxCalendarBinSize {
			return dt, false // MongoDB refuses it (5439006): the events' path says so
		}
		dt.unitMonths = m
		return dt, weekStart == ""
	}
	ms, ok := fixedUnits[unit]
	if !ok || dt.binSize > (1<<62)/ms {
		return dt, false
	}
	dt.unitMillis = ms
	if unit != "week" {
		return dt, weekStart == ""
	}
	if weekStart != "" {
		if dt.startOfWeek, ok = weekday(weekStart); !ok {
			return dt, false
		}
	}
	// 2000-01-01 was a Saturday: the first startOfWeek day on or after it.
	days := (int64(dt.startOfWeek) - int64(time.Saturday) + 7) % 7
	dt.refMillis = ref2000 + days*millisPerDay
	return dt, true
}

func utcName(s string) bool {
	switch s {
	case "UTC", "GMT", "Etc/UTC", "Etc/GMT", "Z", "+00:00", "+0000", "+00", "-00:00":
		return true
	}
	return false
}

func weekday(s string) (time.Weekday, bool) {
	s = strings.ToLower(s)
	for name, d := range weekdays {
		if s == name || (len(s) == 3 && strings.HasPrefix(name, s)) {
			return d, true
		}
	}
	return 0, false
}

// wholeBuckets reports whether every window is a union of whole bucket
// windows of span ms: every window edge is a multiple of span.
func (dt dateTrunc) wholeBuckets(span int64) bool {
	if dt.unitMonths > 0 {
		// Calendar edges are UTC midnights, multiples of a day since 1970.
		return millisPerDay%span == 0
	}
	return (dt.unitMillis*dt.binSize)%span == 0 && floorMod(dt.refMillis, span) == 0
}

// maxCalendarBinSize is MongoDB's largest binSize of a $dateTrunc in
// days, weeks, months, quarters or years.
const maxCalendarBinSize = 100_000_000_000

// The years of the dates a BSON date holds (milliseconds since 1970 in
// an int64: about 292 million years either way), a little inside them.
const (
	minDateYear = 1970 - 292_000_000
	maxDateYear = 1970 + 292_000_000
)

// window returns the start of the window holding ms; false when that
// start is not a date (a bin of many years that begins before the
// dates: MongoDB's $dateTrunc fails there, and the window wrapped).
func (dt dateTrunc) window(ms int64) (int64, bool) {
	if dt.unitMonths > 0 {
		t := time.UnixMilli(ms).UTC()
		months := int64(t.Year()-2000)*12 + int64(t.Month()-1)
		bin := int64(dt.unitMonths) * dt.binSize
		k := months - floorMod(months, bin)
		year := 2000 + (k-floorMod(k, 12))/12
		if year < minDateYear || year > maxDateYear {
			return 0, false
		}
		return time.Date(int(year), time.Month(floorMod(k, 12)+1), 1, 0, 0, 0, 0, time.UTC).UnixMilli(), true
	}
	w := dt.unitMillis * dt.binSize
	start := ms - floorMod(ms-dt.refMillis, w)
	return start, start <= ms
}
