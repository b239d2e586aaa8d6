package expr_test

import (
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

func date(y int, m time.Month, d, h, mi, s, ms int) bson.DateTime {
	return bson.NewDateTimeFromTime(time.Date(y, m, d, h, mi, s, ms*1e6, time.UTC))
}

// MongoDB's documented answers for $dateFromParts and $dateToParts.
func TestDateOperators(t *testing.T) {
	parts := func(kv ...any) D {
		var d D
		for i := 0; i < len(kv); i += 2 {
			d = append(d, bson.E{Key: kv[i].(string), Value: kv[i+1]})
		}
		return D{{Key: "$dateFromParts", Value: d}}
	}
	runExprCases(t, []exprCase{
		{name: "fromParts", expr: parts("year", 2017, "month", 2, "day", 8, "hour", 12), want: date(2017, 2, 8, 12, 0, 0, 0)},
		{name: "fromParts iso", expr: parts("isoWeekYear", 2017, "isoWeek", 6, "isoDayOfWeek", 3, "hour", 12), want: date(2017, 2, 8, 12, 0, 0, 0)},
		{name: "fromParts zone", expr: parts("year", 2016, "month", 12, "day", 31, "hour", 23, "minute", 46, "second", 12, "timezone", "America/New_York"), want: date(2017, 1, 1, 4, 46, 12, 0)},
		{name: "fromParts carries month", expr: parts("year", 2017, "month", 14, "day", 1), want: date(2018, 2, 1, 0, 0, 0, 0)},
		{name: "fromParts carries negative day", expr: parts("year", 2017, "month", 1, "day", 0), want: date(2016, 12, 31, 0, 0, 0, 0)},
		{name: "fromParts year only", expr: parts("year", 2020), want: date(2020, 1, 1, 0, 0, 0, 0)},
		{name: "fromParts null", expr: parts("year", nil), want: nil},
		{name: "fromParts year range", expr: parts("year", 10000), code: 40523},
		{name: "fromParts no year", expr: parts("month", 1), code: 40516},
		{name: "fromParts mixed", expr: parts("year", 2017, "isoWeek", 1), code: 40489},
		{name: "fromParts non-integer", expr: parts("year", 2017, "month", "x"), code: 40515},
		{name: "toParts", expr: D{{Key: "$dateToParts", Value: D{{Key: "date", Value: "$ts"}}}}, want: D{
			{Key: "year", Value: int32(2017)}, {Key: "month", Value: int32(1)}, {Key: "day", Value: int32(1)},
			{Key: "hour", Value: int32(1)}, {Key: "minute", Value: int32(29)}, {Key: "second", Value: int32(9)}, {Key: "millisecond", Value: int32(123)}}},
		{name: "toParts zone", expr: D{{Key: "$dateToParts", Value: D{{Key: "date", Value: "$ts"}, {Key: "timezone", Value: "America/New_York"}}}}, want: D{
			{Key: "year", Value: int32(2016)}, {Key: "month", Value: int32(12)}, {Key: "day", Value: int32(31)},
			{Key: "hour", Value: int32(20)}, {Key: "minute", Value: int32(29)}, {Key: "second", Value: int32(9)}, {Key: "millisecond", Value: int32(123)}}},
		{name: "toParts iso", expr: D{{Key: "$dateToParts", Value: D{{Key: "date", Value: "$ts"}, {Key: "iso8601", Value: true}}}}, want: D{
			{Key: "isoWeekYear", Value: int32(2016)}, {Key: "isoWeek", Value: int32(52)}, {Key: "isoDayOfWeek", Value: int32(7)},
			{Key: "hour", Value: int32(1)}, {Key: "minute", Value: int32(29)}, {Key: "second", Value: int32(9)}, {Key: "millisecond", Value: int32(123)}}},
		{name: "toParts null", expr: D{{Key: "$dateToParts", Value: D{{Key: "date", Value: "$nope"}}}}, want: nil},
	})
}
