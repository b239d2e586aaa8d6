package agg_test

import (
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// TestDateTruncYearBinOverflow: MongoDB puts a 1990 date with
// {unit: "year", binSize: 1e10} in the bin starting 1e10 years before
// 2000, which no Date holds: dateAdd refuses the amount with 5976500
// (date_time_support.cpp isDateAddAmountValid). The engine must not answer
// with a wrapped date.
func TestDateTruncYearBinOverflow(t *testing.T) {
	in := []bson.D{{{Key: "_id", Value: 1}, {Key: "ts", Value: bson.NewDateTimeFromTime(time.Date(1990, 3, 5, 0, 0, 0, 0, time.UTC))}}}
	out, err := run(t, in, bson.A{bson.D{{Key: "$project", Value: bson.D{{Key: "t", Value: bson.D{{Key: "$dateTrunc", Value: bson.D{{Key: "date", Value: "$ts"}, {Key: "unit", Value: "year"}, {Key: "binSize", Value: int64(10_000_000_000)}}}}}}}}})
	if err == nil {
		t.Fatalf("answered %v; MongoDB fails with 5976500 invalid dateAdd amount (bin start 1e10 years before 2000)", out)
	}
}
