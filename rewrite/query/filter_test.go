package query_test

import (
	"strings"
	"testing"

	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"

	"github.com/tsproxy/tsproxy/rewrite/caps"

	"go.mongodb.org/mongo-driver/v2/bson"
)

type D = bson.D
type E = bson.E
type A = bson.A

func TestFilterSplit(t *testing.T) {
	and := func(ds ...any) D { return D{{Key: "$and", Value: A(ds)}} }
	start := func(ops ...E) D { return D{{Key: "start", Value: D(ops)}} }
	cases := []struct {
		name          string
		filter        any
		bucket, event any
		caps          *caps.Upstream
	}{
		{name: "empty", filter: D{}},
		{name: "range on hour edges", filter: D{{Key: "ts", Value: D{{Key: "$gte", Value: rwtest.DT(2 * rwtest.Hour)}, {Key: "$lt", Value: rwtest.DT(3 * rwtest.Hour)}}}},
			bucket: start(E{Key: "$gte", Value: rwtest.DT(2 * rwtest.Hour)}, E{Key: "$lt", Value: rwtest.DT(3 * rwtest.Hour)}),
			event:  D{{Key: "events.ts", Value: D{{Key: "$gte", Value: rwtest.DT(2 * rwtest.Hour)}, {Key: "$lt", Value: rwtest.DT(3 * rwtest.Hour)}}}}},
		{name: "$gt inside a window floors", filter: D{{Key: "ts", Value: D{{Key: "$gt", Value: rwtest.DT(2*rwtest.Hour + 5)}}}},
			bucket: start(E{Key: "$gte", Value: rwtest.DT(2 * rwtest.Hour)}),
			event:  D{{Key: "events.ts", Value: D{{Key: "$gt", Value: rwtest.DT(2*rwtest.Hour + 5)}}}}},
		{name: "$gt at a boundary keeps that window", filter: D{{Key: "ts", Value: D{{Key: "$gt", Value: rwtest.DT(2 * rwtest.Hour)}}}},
			bucket: start(E{Key: "$gte", Value: rwtest.DT(2 * rwtest.Hour)}),
			event:  D{{Key: "events.ts", Value: D{{Key: "$gt", Value: rwtest.DT(2 * rwtest.Hour)}}}}},
		{name: "$lte", filter: D{{Key: "ts", Value: D{{Key: "$lte", Value: rwtest.DT(5 * rwtest.Hour)}}}},
			bucket: start(E{Key: "$lte", Value: rwtest.DT(5 * rwtest.Hour)}),
			event:  D{{Key: "events.ts", Value: D{{Key: "$lte", Value: rwtest.DT(5 * rwtest.Hour)}}}}},
		{name: "negative dates floor down", filter: D{{Key: "ts", Value: D{{Key: "$gte", Value: rwtest.DT(-1)}, {Key: "$lt", Value: rwtest.DT(rwtest.Hour)}}}},
			bucket: start(E{Key: "$gte", Value: rwtest.DT(-rwtest.Hour)}, E{Key: "$lt", Value: rwtest.DT(rwtest.Hour)}),
			event:  D{{Key: "events.ts", Value: D{{Key: "$gte", Value: rwtest.DT(-1)}, {Key: "$lt", Value: rwtest.DT(rwtest.Hour)}}}}},
		{name: "bare date equality", filter: D{{Key: "ts", Value: rwtest.DT(rwtest.Hour + 7)}},
			bucket: D{{Key: "start", Value: rwtest.DT(rwtest.Hour)}},
			event:  D{{Key: "events.ts", Value: rwtest.DT(rwtest.Hour + 7)}}},
		{name: "$eq", filter: D{{Key: "ts", Value: D{{Key: "$eq", Value: rwtest.DT(-5)}}}},
			bucket: D{{Key: "start", Value: rwtest.DT(-rwtest.Hour)}},
			event:  D{{Key: "events.ts", Value: D{{Key: "$eq", Value: rwtest.DT(-5)}}}}},
		{name: "$and of bounds takes the tightest", filter: and(
			D{{Key: "ts", Value: D{{Key: "$gte", Value: rwtest.DT(rwtest.Hour)}}}},
			D{{Key: "ts", Value: D{{Key: "$gte", Value: rwtest.DT(3*rwtest.Hour + 1)}, {Key: "$lt", Value: rwtest.DT(9 * rwtest.Hour)}}}},
			D{{Key: "ts", Value: D{{Key: "$lte", Value: rwtest.DT(7 * rwtest.Hour)}}}}),
			bucket: start(E{Key: "$gte", Value: rwtest.DT(3 * rwtest.Hour)}, E{Key: "$lte", Value: rwtest.DT(7 * rwtest.Hour)}),
			event: and(D{{Key: "events.ts", Value: D{{Key: "$gte", Value: rwtest.DT(rwtest.Hour)}}}},
				D{{Key: "events.ts", Value: D{{Key: "$gte", Value: rwtest.DT(3*rwtest.Hour + 1)}, {Key: "$lt", Value: rwtest.DT(9 * rwtest.Hour)}}}},
				D{{Key: "events.ts", Value: D{{Key: "$lte", Value: rwtest.DT(7 * rwtest.Hour)}}}})},
		{name: "$in of dates", filter: D{{Key: "ts", Value: D{{Key: "$in", Value: A{rwtest.DT(rwtest.Hour + 1), rwtest.DT(rwtest.Hour + 2), rwtest.DT(3 * rwtest.Hour)}}}}},
			bucket: D{{Key: "$and", Value: A{D{{Key: "start", Value: D{{Key: "$in", Value: A{rwtest.DT(rwtest.Hour), rwtest.DT(3 * rwtest.Hour)}}}}}}}},
			event:  D{{Key: "events.ts", Value: D{{Key: "$in", Value: A{rwtest.DT(rwtest.Hour + 1), rwtest.DT(rwtest.Hour + 2), rwtest.DT(3 * rwtest.Hour)}}}}}},
		{name: "non-date time operand gives no bucket bound", filter: D{{Key: "ts", Value: D{{Key: "$gt", Value: 5}}}},
			event: D{{Key: "events.ts", Value: D{{Key: "$gt", Value: 5}}}}},
		{name: "meta string", filter: D{{Key: "sensorId", Value: "a"}},
			bucket: D{{Key: "meta", Value: "a"}}},
		{name: "meta number and time", filter: D{{Key: "sensorId", Value: 7}, {Key: "ts", Value: D{{Key: "$lt", Value: rwtest.DT(rwtest.Hour)}}}},
			bucket: and(D{{Key: "meta", Value: 7}}, start(E{Key: "$lt", Value: rwtest.DT(rwtest.Hour)})),
			event:  D{{Key: "events.ts", Value: D{{Key: "$lt", Value: rwtest.DT(rwtest.Hour)}}}}},
		{name: "meta document", filter: D{{Key: "sensorId", Value: D{{Key: "site", Value: "n"}, {Key: "k", Value: 1}}}},
			bucket: D{{Key: "meta", Value: D{{Key: "site", Value: "n"}, {Key: "k", Value: 1}}}}},
		{name: "meta dotted", filter: D{{Key: "sensorId.site", Value: "n"}},
			bucket: D{{Key: "meta.site", Value: "n"}}},
		{name: "meta $in", filter: D{{Key: "sensorId", Value: D{{Key: "$in", Value: A{"a", 2, nil}}}}},
			bucket: D{{Key: "meta", Value: D{{Key: "$in", Value: A{"a", 2, nil}}}}}},
		{name: "meta missing: $exists reads the marker", filter: D{{Key: "sensorId", Value: D{{Key: "$exists", Value: false}}}},
			event: D{{Key: "events.sensorId", Value: D{{Key: "$exists", Value: false}}}}},
		{name: "meta $type needs the marker", filter: D{{Key: "sensorId", Value: D{{Key: "$type", Value: "null"}}}},
			bucket: D{{Key: "meta", Value: D{{Key: "$type", Value: "null"}}}},
			event:  D{{Key: "events.sensorId", Value: D{{Key: "$exists", Value: true}}}}},
		{name: "meta $not $exists", filter: D{{Key: "sensorId", Value: D{{Key: "$not", Value: D{{Key: "$exists", Value: true}}}}}},
			event: D{{Key: "events.sensorId", Value: D{{Key: "$not", Value: D{{Key: "$exists", Value: true}}}}}}},
		{name: "meta null", filter: D{{Key: "sensorId", Value: nil}},
			bucket: D{{Key: "meta", Value: nil}}},
		{name: "residual operators renamed", filter: D{
			{Key: "v", Value: D{{Key: "$ne", Value: 1}, {Key: "$nin", Value: A{2, 3}}}},
			{Key: "s", Value: D{{Key: "$regex", Value: "^a"}, {Key: "$options", Value: "i"}}},
			{Key: "arr", Value: D{{Key: "$size", Value: 2}, {Key: "$all", Value: A{1}}}},
			{Key: "x", Value: D{{Key: "$type", Value: "int"}, {Key: "$exists", Value: true}}},
			{Key: "_id", Value: 5},
		},
			event: and(D{{Key: "events.v", Value: D{{Key: "$ne", Value: 1}, {Key: "$nin", Value: A{2, 3}}}}},
				D{{Key: "events.s", Value: D{{Key: "$regex", Value: "^a"}, {Key: "$options", Value: "i"}}}},
				D{{Key: "events.arr", Value: D{{Key: "$size", Value: 2}, {Key: "$all", Value: A{1}}}}},
				D{{Key: "events.x", Value: D{{Key: "$type", Value: "int"}, {Key: "$exists", Value: true}}}},
				D{{Key: "events._id", Value: 5}})},
		{name: "$elemMatch operands stay relative", filter: D{{Key: "arr", Value: D{{Key: "$elemMatch", Value: D{{Key: "k", Value: 1}, {Key: "v", Value: D{{Key: "$gt", Value: 2}}}}}}}},
			event: D{{Key: "events.arr", Value: D{{Key: "$elemMatch", Value: D{{Key: "k", Value: 1}, {Key: "v", Value: D{{Key: "$gt", Value: 2}}}}}}}}},
		{name: "$or $nor $not", filter: D{
			{Key: "$or", Value: A{D{{Key: "a", Value: 1}}, D{{Key: "b", Value: D{{Key: "$not", Value: D{{Key: "$gt", Value: 2}}}}}}}},
			{Key: "$nor", Value: A{D{{Key: "c", Value: bson.Regex{Pattern: "x"}}}}},
		},
			event: and(D{{Key: "$or", Value: A{D{{Key: "events.a", Value: 1}}, D{{Key: "events.b", Value: D{{Key: "$not", Value: D{{Key: "$gt", Value: 2}}}}}}}}},
				D{{Key: "$nor", Value: A{D{{Key: "events.c", Value: bson.Regex{Pattern: "x"}}}}}})},
		{name: "meta inside $or on MongoDB", caps: &rwtest.MongoCaps, filter: D{{Key: "$or", Value: A{D{{Key: "sensorId", Value: "a"}}, D{{Key: "v", Value: 1}}}}},
			event: D{{Key: "$or", Value: A{D{{Key: "meta", Value: "a"}}, D{{Key: "events.v", Value: 1}}}}}},
		{name: "$comment dropped", filter: D{{Key: "$comment", Value: "hi"}, {Key: "v", Value: 1}},
			event: D{{Key: "events.v", Value: 1}}},
		{name: "fields named like bucket fields", filter: D{{Key: "meta", Value: 1}, {Key: "events", Value: 2}, {Key: "start", Value: 3}},
			event: and(D{{Key: "events.meta", Value: 1}}, D{{Key: "events.events", Value: 2}}, D{{Key: "events.start", Value: 3}})},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			caps := rwtest.FerretCaps
			if c.caps != nil {
				caps = *c.caps
			}
			sf, err := rwtest.Ctx(t, caps).Split(rwtest.Doc(t, c.filter))
			if err != nil {
				t.Fatal(err)
			}
			if got, want := rwtest.JSON(sf.Bucket), rwtest.JSON(rwtest.Doc(t, c.bucket)); got != want {
				t.Errorf("bucket filter\n got %s\nwant %s", got, want)
			}
			if got, want := rwtest.JSON(sf.Event), rwtest.JSON(rwtest.Doc(t, c.event)); got != want {
				t.Errorf("event filter\n got %s\nwant %s", got, want)
			}
		})
	}
}

func TestFilterRefused(t *testing.T) {
	cases := []struct {
		filter any
		want   string
		caps   *caps.Upstream
	}{
		{D{{Key: "$where", Value: "this.a"}}, `filter operator "$where" (JavaScript) is not supported`, nil},
		{D{{Key: "$expr", Value: D{{Key: "$gt", Value: A{"$a", 1}}}}}, `filter operator "$expr"`, nil},
		{D{{Key: "$text", Value: D{{Key: "$search", Value: "x"}}}}, `filter operator "$text"`, nil},
		{D{{Key: "$jsonSchema", Value: D{}}}, `filter operator "$jsonSchema"`, nil},
		{D{{Key: "loc", Value: D{{Key: "$near", Value: A{0, 0}}}}}, `filter operator "$near"`, nil},
		{D{{Key: "loc", Value: D{{Key: "$geoWithin", Value: D{}}}}}, `filter operator "$geoWithin"`, nil},
		{D{{Key: "a", Value: D{{Key: "$elemMatch", Value: D{{Key: "$where", Value: "1"}}}}}}, `"$where"`, nil},
		{D{{Key: "$or", Value: A{D{{Key: "$expr", Value: true}}}}}, `"$expr"`, nil},
		{D{{Key: "$or", Value: A{}}}, `nonempty array`, nil},
		{D{{Key: "$and", Value: 1}}, `$and must be an array`, nil},
		{D{{Key: "$or", Value: A{D{{Key: "sensorId", Value: "a"}}, D{{Key: "v", Value: 1}}}}}, `filter on the metaField "sensorId" inside "$or" is not supported on a bucketed namespace on this upstream`, nil},
		{D{{Key: "sensorId", Value: D{{Key: "$not", Value: D{{Key: "$type", Value: "string"}, {Key: "$eq", Value: 1}}}}}}, `$not with $type or $exists`, nil},
		{D{{Key: "a", Value: D{{Key: "$foo", Value: 1}}}}, `filter operator "$foo"`, nil},
	}
	for _, c := range cases {
		caps := rwtest.FerretCaps
		if c.caps != nil {
			caps = *c.caps
		}
		_, err := rwtest.Ctx(t, caps).Split(rwtest.Doc(t, c.filter))
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "tsproxy rule iot.readings") {
			t.Errorf("%v: got %v, want %q", c.filter, err, c.want)
		}
	}
}
