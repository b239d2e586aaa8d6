package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// dashEvent is one reading the dashboard test sends.
type dashEvent struct {
	ts     time.Time
	sensor string
	value  float64
	temp   int32
	tags   []string
}

func (e dashEvent) doc() bson.D {
	d := bson.D{{Key: "ts", Value: e.ts}, {Key: "sensorId", Value: e.sensor}, {Key: "value", Value: e.value}, {Key: "temp", Value: e.temp}}
	if e.tags != nil {
		d = append(d, bson.E{Key: "tags", Value: e.tags})
	}
	return d
}

var dashBase = time.Date(2026, 5, 4, 9, 0, 0, 0, time.UTC)

// dashEvents: 3 sensors, one reading a minute for 3 hours, readings with
// two decimals (sums of them are inexact in binary, so the order and
// precision of the summation show), some events with tags.
func dashEvents() []dashEvent {
	var out []dashEvent
	for m := 0; m < 180; m++ {
		for s := 0; s < 3; s++ {
			e := dashEvent{ts: dashBase.Add(time.Duration(m) * time.Minute), sensor: fmt.Sprintf("s%d", s),
				value: float64(2000+(m*37+s*11)%500) / 100, temp: int32(15 + (m+s)%10)}
			if m%7 == 0 {
				e.tags = []string{"calibrated", []string{"north", "south"}[s%2]}
			}
			out = append(out, e)
		}
	}
	return out
}

// exactSum is the correctly rounded sum of vals, which double-double
// summation (MongoDB's) gives.
func exactSum(vals []float64) float64 {
	s := new(big.Float).SetPrec(2000)
	for _, v := range vals {
		s.Add(s, new(big.Float).SetFloat64(v))
	}
	f, _ := s.Float64()
	return f
}

// TestDashboardAggregations: the aggregations a dashboard sends on a
// rule's namespace. Where the upstream cannot run them (FerretDB), the
// proxy runs them over the events; the answers are compared byte for byte
// (values, BSON types, field order) with MongoDB's answer computed here
// from the events sent, and, where the upstream runs the pipeline on a
// plain collection, with that answer too.
func TestDashboardAggregations(t *testing.T) {
	ctx := ctxFor(t)
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: readingsRule(db, 120)})
	coll := connect(t, p.URI()).Database(db).Collection("readings")
	plain := direct(t).Database(db).Collection("plain")
	events := dashEvents()
	var docs []any
	for _, e := range events {
		docs = append(docs, e.doc())
	}
	for i := 0; i < len(docs); i += 100 {
		batch := docs[i:min(i+100, len(docs))]
		if _, err := coll.InsertMany(ctx, batch); err != nil {
			t.Fatal(err)
		}
		if _, err := plain.InsertMany(ctx, batch); err != nil {
			t.Fatal(err)
		}
	}
	type D = bson.D
	type A = bson.A
	hourly := A{
		D{{Key: "$match", Value: D{{Key: "ts", Value: D{{Key: "$gte", Value: dashBase}, {Key: "$lt", Value: dashBase.Add(3 * time.Hour)}}}}}},
		D{{Key: "$sort", Value: D{{Key: "ts", Value: 1}}}},
		D{{Key: "$group", Value: D{
			{Key: "_id", Value: D{{Key: "sensor", Value: "$sensorId"}, {Key: "hour", Value: D{{Key: "$dateTrunc", Value: D{{Key: "date", Value: "$ts"}, {Key: "unit", Value: "hour"}}}}}}},
			{Key: "avg", Value: D{{Key: "$avg", Value: "$value"}}}, {Key: "min", Value: D{{Key: "$min", Value: "$value"}}},
			{Key: "max", Value: D{{Key: "$max", Value: "$value"}}}, {Key: "n", Value: D{{Key: "$count", Value: D{}}}},
			{Key: "sum", Value: D{{Key: "$sum", Value: "$value"}}},
			{Key: "first", Value: D{{Key: "$first", Value: "$value"}}}, {Key: "last", Value: D{{Key: "$last", Value: "$value"}}},
		}}},
		D{{Key: "$sort", Value: D{{Key: "_id.sensor", Value: 1}, {Key: "_id.hour", Value: 1}}}},
	}
	var wantHourly []D
	for s := 0; s < 3; s++ {
		for h := 0; h < 3; h++ {
			var vals []float64
			for _, e := range events {
				if e.sensor == fmt.Sprintf("s%d", s) && e.ts.Hour() == 9+h {
					vals = append(vals, e.value)
				}
			}
			sum := exactSum(vals)
			wantHourly = append(wantHourly, D{
				{Key: "_id", Value: D{{Key: "sensor", Value: fmt.Sprintf("s%d", s)}, {Key: "hour", Value: bson.NewDateTimeFromTime(dashBase.Add(time.Duration(h) * time.Hour))}}},
				{Key: "avg", Value: sum / float64(len(vals))}, {Key: "min", Value: slices.Min(vals)}, {Key: "max", Value: slices.Max(vals)},
				{Key: "n", Value: int32(len(vals))}, {Key: "sum", Value: sum}, {Key: "first", Value: vals[0]}, {Key: "last", Value: vals[len(vals)-1]},
			})
		}
	}
	perSensor := map[string][2]int32{}
	for _, e := range events {
		c := perSensor[e.sensor]
		perSensor[e.sensor] = [2]int32{c[0] + 1, c[1] + e.temp}
	}
	var wantTwo []D
	for _, s := range []string{"s0", "s1", "s2"} {
		wantTwo = append(wantTwo, D{{Key: "_id", Value: s}, {Key: "n", Value: perSensor[s][0]}, {Key: "t", Value: perSensor[s][1]}})
	}
	var s1 []dashEvent
	for _, e := range events {
		if e.sensor == "s1" {
			s1 = append(s1, e)
		}
	}
	var wantProject []D
	for _, e := range []dashEvent{s1[len(s1)-1], s1[len(s1)-2], s1[len(s1)-3]} {
		wantProject = append(wantProject, D{{Key: "sensorId", Value: "s1"}, {Key: "f", Value: e.temp * 2}, {Key: "at", Value: e.ts.Format("2006-01-02 15:04")},
			{Key: "warm", Value: e.temp >= 20}})
	}
	tagCounts := map[string]int32{}
	for _, e := range events {
		for _, tag := range e.tags {
			tagCounts[tag]++
		}
	}
	var wantTags []D
	for _, tag := range []string{"calibrated", "north", "south"} {
		wantTags = append(wantTags, D{{Key: "_id", Value: tag}, {Key: "n", Value: tagCounts[tag]}})
	}
	var high int32
	for _, e := range events {
		if e.value >= 23 {
			high++
		}
	}
	for _, c := range []struct {
		name     string
		pipeline A
		want     []D
		plainToo bool // the upstream runs it on a plain collection
	}{
		{name: "hourly avg, min, max, count, sum, first, last per sensor", pipeline: hourly, want: wantHourly},
		{name: "two accumulators", pipeline: A{D{{Key: "$group", Value: D{{Key: "_id", Value: "$sensorId"}, {Key: "n", Value: D{{Key: "$sum", Value: 1}}}, {Key: "t", Value: D{{Key: "$sum", Value: "$temp"}}}}}},
			D{{Key: "$sort", Value: D{{Key: "_id", Value: 1}}}}}, want: wantTwo},
		{name: "computed $project after $sort and $limit", pipeline: A{D{{Key: "$match", Value: D{{Key: "sensorId", Value: "s1"}}}}, D{{Key: "$sort", Value: D{{Key: "ts", Value: -1}}}}, D{{Key: "$limit", Value: 3}},
			D{{Key: "$project", Value: D{{Key: "_id", Value: 0}, {Key: "sensorId", Value: 1}, {Key: "f", Value: D{{Key: "$multiply", Value: A{"$temp", 2}}}},
				{Key: "at", Value: D{{Key: "$dateToString", Value: D{{Key: "format", Value: "%Y-%m-%d %H:%M"}, {Key: "date", Value: "$ts"}}}}},
				{Key: "warm", Value: D{{Key: "$gte", Value: A{"$temp", 20}}}}}}}}, want: wantProject},
		{name: "$unwind of tags, counted", pipeline: A{D{{Key: "$unwind", Value: "$tags"}}, D{{Key: "$group", Value: D{{Key: "_id", Value: "$tags"}, {Key: "n", Value: D{{Key: "$sum", Value: 1}}}}}},
			D{{Key: "$sort", Value: D{{Key: "_id", Value: 1}}}}}, want: wantTags, plainToo: true},
		{name: "$count of high readings", pipeline: A{D{{Key: "$match", Value: D{{Key: "value", Value: D{{Key: "$gte", Value: 23}}}}}}, D{{Key: "$count", Value: "high"}}},
			want: []D{{{Key: "high", Value: high}}}, plainToo: true},
		{name: "$sortByCount", pipeline: A{D{{Key: "$match", Value: D{{Key: "ts", Value: D{{Key: "$lt", Value: dashBase.Add(time.Minute)}}}}}}, D{{Key: "$sortByCount", Value: "$temp"}},
			D{{Key: "$sort", Value: D{{Key: "_id", Value: 1}}}}},
			want: []D{{{Key: "_id", Value: int32(15)}, {Key: "count", Value: int32(1)}}, {{Key: "_id", Value: int32(16)}, {Key: "count", Value: int32(1)}}, {{Key: "_id", Value: int32(17)}, {Key: "count", Value: int32(1)}}}},
		{name: "moving average by $setWindowFields", pipeline: A{
			D{{Key: "$match", Value: D{{Key: "sensorId", Value: "s2"}, {Key: "ts", Value: D{{Key: "$lt", Value: dashBase.Add(5 * time.Minute)}}}}}},
			D{{Key: "$setWindowFields", Value: D{{Key: "partitionBy", Value: "$sensorId"}, {Key: "sortBy", Value: D{{Key: "ts", Value: 1}}},
				{Key: "output", Value: D{{Key: "ma", Value: D{{Key: "$avg", Value: "$temp"}, {Key: "window", Value: D{{Key: "documents", Value: A{-1, 0}}}}}}}}}}},
			D{{Key: "$project", Value: D{{Key: "_id", Value: 0}, {Key: "ts", Value: 1}, {Key: "ma", Value: 1}}}}},
			want: []D{
				{{Key: "ts", Value: bson.NewDateTimeFromTime(dashBase)}, {Key: "ma", Value: 17.0}},
				{{Key: "ts", Value: bson.NewDateTimeFromTime(dashBase.Add(time.Minute))}, {Key: "ma", Value: 17.5}},
				{{Key: "ts", Value: bson.NewDateTimeFromTime(dashBase.Add(2 * time.Minute))}, {Key: "ma", Value: 18.5}},
				{{Key: "ts", Value: bson.NewDateTimeFromTime(dashBase.Add(3 * time.Minute))}, {Key: "ma", Value: 19.5}},
				{{Key: "ts", Value: bson.NewDateTimeFromTime(dashBase.Add(4 * time.Minute))}, {Key: "ma", Value: 20.5}},
			}},
		{name: "$densify a gap, $fill it by locf", pipeline: A{
			D{{Key: "$match", Value: D{{Key: "sensorId", Value: "s0"}, {Key: "ts", Value: D{{Key: "$lt", Value: dashBase.Add(5 * time.Minute)}, {Key: "$ne", Value: dashBase.Add(2 * time.Minute)}}}}}},
			D{{Key: "$project", Value: D{{Key: "_id", Value: 0}, {Key: "ts", Value: 1}, {Key: "temp", Value: 1}}}},
			D{{Key: "$densify", Value: D{{Key: "field", Value: "ts"}, {Key: "range", Value: D{{Key: "step", Value: 1}, {Key: "unit", Value: "minute"}, {Key: "bounds", Value: "full"}}}}}},
			D{{Key: "$fill", Value: D{{Key: "sortBy", Value: D{{Key: "ts", Value: 1}}}, {Key: "output", Value: D{{Key: "temp", Value: D{{Key: "method", Value: "locf"}}}}}}}}},
			want: []D{
				{{Key: "ts", Value: bson.NewDateTimeFromTime(dashBase)}, {Key: "temp", Value: int32(15)}},
				{{Key: "ts", Value: bson.NewDateTimeFromTime(dashBase.Add(time.Minute))}, {Key: "temp", Value: int32(16)}},
				{{Key: "ts", Value: bson.NewDateTimeFromTime(dashBase.Add(2 * time.Minute))}, {Key: "temp", Value: int32(16)}},
				{{Key: "ts", Value: bson.NewDateTimeFromTime(dashBase.Add(3 * time.Minute))}, {Key: "temp", Value: int32(18)}},
				{{Key: "ts", Value: bson.NewDateTimeFromTime(dashBase.Add(4 * time.Minute))}, {Key: "temp", Value: int32(19)}},
			}},
		{name: "$facet: a count and the hottest reading", pipeline: A{D{{Key: "$facet", Value: D{
			{Key: "n", Value: A{D{{Key: "$count", Value: "events"}}}},
			{Key: "hottest", Value: A{D{{Key: "$sort", Value: D{{Key: "temp", Value: -1}, {Key: "ts", Value: 1}, {Key: "sensorId", Value: 1}}}}, D{{Key: "$limit", Value: 1}},
				D{{Key: "$project", Value: D{{Key: "_id", Value: 0}, {Key: "sensorId", Value: 1}, {Key: "temp", Value: 1}}}}}}}}}},
			want: []D{{{Key: "n", Value: A{D{{Key: "events", Value: int32(len(events))}}}}, {Key: "hottest", Value: A{D{{Key: "sensorId", Value: "s2"}, {Key: "temp", Value: int32(24)}}}}}}},
		{name: "rate per minute by $derivative, running total by $integral", pipeline: A{
			D{{Key: "$match", Value: D{{Key: "sensorId", Value: "s0"}, {Key: "ts", Value: D{{Key: "$lt", Value: dashBase.Add(3 * time.Minute)}}}}}},
			D{{Key: "$setWindowFields", Value: D{{Key: "sortBy", Value: D{{Key: "ts", Value: 1}}}, {Key: "output", Value: D{
				{Key: "rate", Value: D{{Key: "$derivative", Value: D{{Key: "input", Value: "$temp"}, {Key: "unit", Value: "minute"}}}, {Key: "window", Value: D{{Key: "documents", Value: A{-1, 0}}}}}},
				{Key: "area", Value: D{{Key: "$integral", Value: D{{Key: "input", Value: "$temp"}, {Key: "unit", Value: "minute"}}}, {Key: "window", Value: D{{Key: "documents", Value: A{"unbounded", "current"}}}}}},
				{Key: "rank", Value: D{{Key: "$documentNumber", Value: D{}}}}}}}}},
			D{{Key: "$project", Value: D{{Key: "_id", Value: 0}, {Key: "rate", Value: 1}, {Key: "area", Value: 1}, {Key: "rank", Value: 1}}}}},
			want: []D{
				{{Key: "rate", Value: nil}, {Key: "area", Value: 0.0}, {Key: "rank", Value: int32(1)}},
				{{Key: "rate", Value: 1.0}, {Key: "area", Value: 15.5}, {Key: "rank", Value: int32(2)}},
				{{Key: "rate", Value: 1.0}, {Key: "area", Value: 32.0}, {Key: "rank", Value: int32(3)}},
			}},
		{name: "$bucketAuto on a value", pipeline: A{D{{Key: "$bucketAuto", Value: D{{Key: "groupBy", Value: "$temp"}, {Key: "buckets", Value: 2}}}}},
			want: []D{{{Key: "_id", Value: D{{Key: "min", Value: int32(15)}, {Key: "max", Value: int32(20)}}}, {Key: "count", Value: int32(270)}},
				{{Key: "_id", Value: D{{Key: "min", Value: int32(20)}, {Key: "max", Value: int32(24)}}}, {Key: "count", Value: int32(270)}}}},
		{name: "$bucket on a value", pipeline: A{D{{Key: "$bucket", Value: D{{Key: "groupBy", Value: "$temp"}, {Key: "boundaries", Value: A{15, 20, 25}}}}}},
			want: []D{{{Key: "_id", Value: int32(15)}, {Key: "count", Value: int32(270)}}, {{Key: "_id", Value: int32(20)}, {Key: "count", Value: int32(270)}}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := runAggregateRaw(t, coll, c.pipeline)
			checkRawDocs(t, "through the proxy", got, c.want)
			if c.plainToo || env.external {
				checkRawDocs(plainReference(t), "the upstream on a plain collection", runAggregateRaw(t, plain, c.pipeline), c.want)
			}
		})
	}
	t.Run("$lookup of a plain collection", func(t *testing.T) {
		sites := direct(t).Database(db).Collection("sensors")
		if _, err := sites.InsertMany(ctx, []any{D{{Key: "_id", Value: "s0"}, {Key: "site", Value: "north"}}, D{{Key: "_id", Value: "s1"}, {Key: "site", Value: "south"}}}); err != nil {
			t.Fatal(err)
		}
		got := runAggregateRaw(t, coll, A{
			D{{Key: "$group", Value: D{{Key: "_id", Value: "$sensorId"}, {Key: "n", Value: D{{Key: "$sum", Value: 1}}}}}},
			D{{Key: "$lookup", Value: D{{Key: "from", Value: "sensors"}, {Key: "localField", Value: "_id"}, {Key: "foreignField", Value: "_id"}, {Key: "as", Value: "where"}}}},
			D{{Key: "$sort", Value: D{{Key: "_id", Value: 1}}}},
		})
		checkRawDocs(t, "through the proxy", got, []D{
			{{Key: "_id", Value: "s0"}, {Key: "n", Value: int32(180)}, {Key: "where", Value: A{D{{Key: "_id", Value: "s0"}, {Key: "site", Value: "north"}}}}},
			{{Key: "_id", Value: "s1"}, {Key: "n", Value: int32(180)}, {Key: "where", Value: A{D{{Key: "_id", Value: "s1"}, {Key: "site", Value: "south"}}}}},
			{{Key: "_id", Value: "s2"}, {Key: "n", Value: int32(180)}, {Key: "where", Value: A{}}},
		})
	})
	t.Run("a result of many batches, read by getMore", func(t *testing.T) {
		pipeline := A{D{{Key: "$addFields", Value: D{{Key: "f", Value: D{{Key: "$multiply", Value: A{"$temp", 2}}}}}}},
			D{{Key: "$sort", Value: D{{Key: "ts", Value: 1}, {Key: "sensorId", Value: 1}}}}}
		for _, bs := range []int32{0, 7, 200} {
			opts := options.Aggregate()
			if bs > 0 {
				opts.SetBatchSize(bs)
			}
			cur, err := coll.Aggregate(ctx, pipeline, opts)
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for cur.Next(ctx) {
				e := events[n]
				if cur.Current.Lookup("sensorId").StringValue() != e.sensor || cur.Current.Lookup("f").Int32() != 2*e.temp {
					t.Fatalf("batchSize %d: document %d is %s, want %v", bs, n, cur.Current, e)
				}
				n++
			}
			if err := cur.Err(); err != nil || n != len(events) {
				t.Fatalf("batchSize %d: %d documents (err %v), want %d", bs, n, err, len(events))
			}
		}
	})
	t.Run("$out and $merge into a plain collection", func(t *testing.T) {
		out := append(slices.Clone(hourly), D{{Key: "$out", Value: "hourly"}})
		if got := runAggregateRaw(t, coll, out); len(got) != 0 {
			t.Fatalf("$out answered %d documents, want none", len(got))
		}
		readBack := func(name string, sort D) []bson.Raw {
			cur, err := direct(t).Database(db).Collection(name).Find(ctx, D{}, options.Find().SetSort(sort))
			if err != nil {
				t.Fatal(err)
			}
			var docs []bson.Raw
			for cur.Next(ctx) {
				docs = append(docs, append(bson.Raw(nil), cur.Current...))
			}
			return docs
		}
		checkRawDocs(t, "$out's collection", readBack("hourly", D{{Key: "_id.sensor", Value: 1}, {Key: "_id.hour", Value: 1}}), wantHourly)
		// A second $out replaces the collection.
		runAggregateRaw(t, coll, A{D{{Key: "$group", Value: D{{Key: "_id", Value: "$sensorId"}, {Key: "n", Value: D{{Key: "$sum", Value: 1}}}}}}, D{{Key: "$out", Value: "hourly"}}})
		if docs := readBack("hourly", D{{Key: "_id", Value: 1}}); len(docs) != 3 || docs[0].Lookup("n").Int32() != 180 {
			t.Fatalf("after a second $out: %v", docs)
		}
		// $merge (whenMatched merge, the default) adds fields to what is there.
		runAggregateRaw(t, coll, A{D{{Key: "$group", Value: D{{Key: "_id", Value: "$sensorId"}, {Key: "n", Value: D{{Key: "$sum", Value: 1}}}}}}, D{{Key: "$merge", Value: D{{Key: "into", Value: "daily"}}}}})
		runAggregateRaw(t, coll, A{D{{Key: "$group", Value: D{{Key: "_id", Value: "$sensorId"}, {Key: "hot", Value: D{{Key: "$max", Value: "$temp"}}}}}},
			D{{Key: "$merge", Value: D{{Key: "into", Value: "daily"}, {Key: "whenMatched", Value: "merge"}}}}})
		runAggregateRaw(t, coll, A{D{{Key: "$group", Value: D{{Key: "_id", Value: "$sensorId"}, {Key: "n", Value: D{{Key: "$sum", Value: 2}}}}}},
			D{{Key: "$merge", Value: D{{Key: "into", Value: "daily"}, {Key: "whenMatched", Value: "keepExisting"}}}}})
		var want []D
		for _, s := range []string{"s0", "s1", "s2"} {
			want = append(want, D{{Key: "_id", Value: s}, {Key: "n", Value: int32(180)}, {Key: "hot", Value: int32(24)}})
		}
		checkRawDocs(t, "$merge's collection", readBack("daily", D{{Key: "_id", Value: 1}}), want)
		if env.external {
			return
		}
		_, err := tryAggregate(coll, A{D{{Key: "$group", Value: D{{Key: "_id", Value: "$sensorId"}}}}, D{{Key: "$out", Value: "readings"}}})
		if err == nil || !strings.Contains(err.Error(), "bucketed namespace") {
			t.Fatalf("$out into the rule's own namespace: %v, want a refusal", err)
		}
	})
	t.Run("refused by name", func(t *testing.T) {
		if env.external {
			t.Skip("MongoDB runs them")
		}
		for _, c := range []struct {
			pipeline A
			name     string
		}{
			{A{D{{Key: "$graphLookup", Value: D{{Key: "from", Value: "x"}}}}}, `"$graphLookup"`},
			{A{D{{Key: "$lookup", Value: D{{Key: "from", Value: "readings"}, {Key: "as", Value: "y"}, {Key: "localField", Value: "a"}, {Key: "foreignField", Value: "b"}}}}}, "bucketed namespace"},
			{A{D{{Key: "$project", Value: D{{Key: "x", Value: D{{Key: "$regexMatch", Value: D{{Key: "input", Value: "$sensorId"}, {Key: "regex", Value: "s"}}}}}}}}}, `"$regexMatch"`},
		} {
			_, err := tryAggregate(coll, c.pipeline)
			if err == nil || !strings.Contains(err.Error(), c.name) || !strings.Contains(err.Error(), "tsproxy rule "+db+".readings") {
				t.Errorf("%v: %v, want an error naming the rule and %s", c.pipeline, err, c.name)
			}
		}
	})
	t.Run("memory budget", func(t *testing.T) {
		if env.external {
			t.Skip("MongoDB runs it, with its own budget")
		}
		small := startProxy(t, proxyOptions{yaml: readingsRule(db, 120) + "limits:\n  aggregateMemory: 4096\n"})
		_, err := tryAggregate(connect(t, small.URI()).Database(db).Collection("readings"), A{D{{Key: "$group", Value: D{{Key: "_id", Value: "$ts"}, {Key: "v", Value: D{{Key: "$push", Value: "$value"}}}}}}})
		var ce mongo.CommandError
		if err == nil || !errors.As(err, &ce) || ce.Code != int32(mongoerr.QueryExceededMemoryLimit) {
			t.Fatalf("a $group past limits.aggregateMemory: %v, want code 292", err)
		}
	})
}

func runAggregateRaw(t *testing.T, coll *mongo.Collection, pipeline bson.A) []bson.Raw {
	t.Helper()
	ctx := ctxFor(t)
	cur, err := coll.Aggregate(ctx, pipeline)
	if err != nil {
		t.Fatal(err)
	}
	var out []bson.Raw
	for cur.Next(ctx) {
		out = append(out, append(bson.Raw(nil), cur.Current...))
	}
	if err := cur.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func checkRawDocs(t reporter, what string, got []bson.Raw, want []bson.D) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d documents, want %d:\n%v", what, len(got), len(want), got)
		return // a findingsOnly goes on
	}
	for i := range got {
		w, err := bson.Marshal(want[i])
		if err != nil {
			t.Fatalf("%v", err)
			return
		}
		if !bytes.Equal(got[i], w) {
			t.Errorf("%s: document %d:\n got %s\nwant %s", what, i, got[i], bson.Raw(w))
		}
	}
}

// TestDashboardMongosh: mongosh inserts readings into a collection it
// creates with MongoDB's time-series API, then runs an hourly dashboard
// (avg, min, max, first, last per sensor and hour, a moving average) that
// FerretDB cannot run itself: the proxy's engine answers it.
func TestDashboardMongosh(t *testing.T) {
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{})
	script := fmt.Sprintf(`const d = connect(process.env.TSPROXY_URI + %q);
d.createCollection("weather", {timeseries: {timeField: "ts", metaField: "sensor", granularity: "minutes"}});
const base = ISODate("2026-05-04T09:00:00Z").getTime();
const docs = [];
for (let m = 0; m < 120; m++) {
  for (const s of ["a", "b"]) {
    docs.push({ts: new Date(base + m * 60000), sensor: s, temp: NumberInt(10 + (m %% 7) + (s === "b" ? 100 : 0))});
  }
}
d.weather.insertMany(docs);
const hourly = d.weather.aggregate([
  {$sort: {ts: 1}},
  {$group: {_id: {s: "$sensor", h: {$hour: "$ts"}}, avg: {$avg: "$temp"}, min: {$min: "$temp"}, max: {$max: "$temp"},
            first: {$first: "$temp"}, last: {$last: "$temp"}, n: {$count: {}}}},
  {$sort: {"_id.s": 1, "_id.h": 1}}]).toArray();
print(JSON.stringify(hourly.map(x => [x._id.s, x._id.h, x.avg, x.min, x.max, x.first, x.last, x.n])));
const ma = d.weather.aggregate([
  {$match: {sensor: "a"}},
  {$setWindowFields: {sortBy: {ts: 1}, output: {ma: {$avg: "$temp", window: {documents: [-2, 0]}}}}},
  {$limit: 3}, {$project: {_id: 0, ma: 1}}]).toArray();
print(JSON.stringify(ma.map(x => x.ma)));
`, db)
	out := strings.Split(strings.TrimSpace(runMongosh(t, p.URI(), script)), "\n")
	if len(out) < 2 {
		t.Fatalf("mongosh printed %q", out)
	}
	var want [][]any
	for _, s := range []string{"a", "b"} {
		for h := 0; h < 2; h++ {
			var temps []int
			for m := h * 60; m < h*60+60; m++ {
				v := 10 + m%7
				if s == "b" {
					v += 100
				}
				temps = append(temps, v)
			}
			sum := 0
			for _, v := range temps {
				sum += v
			}
			want = append(want, []any{s, 9 + h, float64(sum) / 60, slices.Min(temps), slices.Max(temps), temps[0], temps[59], 60})
		}
	}
	wantJSON, _ := json.Marshal(want)
	if got := out[len(out)-2]; got != string(wantJSON) {
		t.Fatalf("hourly dashboard through mongosh:\n got %s\nwant %s", got, wantJSON)
	}
	if got := out[len(out)-1]; got != "[10,10.5,11]" {
		t.Fatalf("moving average through mongosh: %s, want [10,10.5,11]", got)
	}
}
