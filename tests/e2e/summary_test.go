package e2e

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/tsproxy/tsproxy/rewrite/bucket"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// This file checks aggregates answered from bucket summaries against the
// same aggregates over the same events as plain documents: computed here
// from the events (FerretDB v1.24 lacks $dateTrunc and the $min/$max
// accumulators), and run directly on a plain collection wherever the
// upstream can.

func summaryRule(db string) string {
	return fmt.Sprintf(`rules:
  - namespace: %s.readings
    timeField: ts
    metaField: sensorId
    bucket:
      span: 1h
    aggregates: [value, n]
`, db)
}

// sumEvent is one event: value a double or missing, n an int32 or
// missing.
type sumEvent struct {
	sensor   string
	ts       time.Time
	value    float64
	hasValue bool
	n        int32
	hasN     bool
}

func (e sumEvent) doc() bson.D {
	d := bson.D{{Key: "ts", Value: e.ts}, {Key: "sensorId", Value: e.sensor}}
	if e.hasValue {
		d = append(d, bson.E{Key: "value", Value: e.value})
	}
	if e.hasN {
		d = append(d, bson.E{Key: "n", Value: e.n})
	}
	return d
}

var summaryBase = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC) // a Sunday

// genSumEvents makes events whose values are quarters (as a reading in
// steps of 0.25 is): every sum of them is exact in doubles, so MongoDB's
// answer does not depend on the order it adds them in and the summaries
// answer it (see TestSummaryNotExact for tenths).
func genSumEvents(n int, seed uint64) []sumEvent {
	r := rand.New(rand.NewPCG(seed, 11))
	out := make([]sumEvent, n)
	for i := range out {
		out[i] = sumEvent{
			sensor:   fmt.Sprintf("s%d", r.IntN(3)),
			ts:       summaryBase.Add(time.Duration(r.Int64N(9*24*3600*1000)) * time.Millisecond),
			value:    math.Round(r.Float64()*8000-4000) / 4,
			hasValue: r.IntN(8) > 0,
			n:        int32(r.IntN(100)),
			hasN:     r.IntN(10) > 0,
		}
	}
	return out
}

// refGroup is the Go reference of one group, with MongoDB's result types:
// $sum of doubles is a double, of int32s an int32 (the totals here fit),
// $min/$max of nothing is null, $avg is a double over the events that
// have the field (null when none has).
type refGroup struct {
	id           any
	count        int32
	sumValue     float64
	sumN         int32
	nValue, nN   int32
	minV, maxV   any
	minTS, maxTS time.Time
}

func (g *refGroup) avgValue() any {
	if g.nValue == 0 {
		return nil
	}
	return g.sumValue / float64(g.nValue)
}

func (g *refGroup) avgN() any {
	if g.nN == 0 {
		return nil
	}
	return float64(g.sumN) / float64(g.nN)
}

func refGroups(events []sumEvent, key func(sumEvent) (any, bool)) map[string]*refGroup {
	out := map[string]*refGroup{}
	for _, e := range events {
		id, ok := key(e)
		if !ok {
			continue
		}
		k := fmt.Sprint(id)
		g := out[k]
		if g == nil {
			g = &refGroup{id: id, minTS: e.ts, maxTS: e.ts}
			out[k] = g
		}
		g.count++
		if e.hasN {
			g.sumN += e.n
			g.nN++
		}
		if e.hasValue {
			g.sumValue += e.value
			g.nValue++
			if g.minV == nil || e.value < g.minV.(float64) {
				g.minV = e.value
			}
			if g.maxV == nil || e.value > g.maxV.(float64) {
				g.maxV = e.value
			}
		}
		if e.ts.Before(g.minTS) {
			g.minTS = e.ts
		}
		if e.ts.After(g.maxTS) {
			g.maxTS = e.ts
		}
	}
	return out
}

// summaryAccs are the accumulators of the differential tests, in the
// order refDocs outputs them.
var summaryAccs = bson.D{
	{Key: "total", Value: bson.D{{Key: "$sum", Value: "$value"}}},
	{Key: "events", Value: bson.D{{Key: "$sum", Value: 1}}},
	{Key: "withN", Value: bson.D{{Key: "$sum", Value: "$n"}}},
	{Key: "lo", Value: bson.D{{Key: "$min", Value: "$value"}}},
	{Key: "hi", Value: bson.D{{Key: "$max", Value: "$value"}}},
	{Key: "first", Value: bson.D{{Key: "$min", Value: "$ts"}}},
	{Key: "last", Value: bson.D{{Key: "$max", Value: "$ts"}}},
	{Key: "avg", Value: bson.D{{Key: "$avg", Value: "$value"}}},
	{Key: "avgN", Value: bson.D{{Key: "$avg", Value: "$n"}}},
}

func truncDay(t time.Time) time.Time  { return t.UTC().Truncate(24 * time.Hour) }
func truncHour(t time.Time) time.Time { return t.UTC().Truncate(time.Hour) }

func dateTruncSpec(unit string, more ...bson.E) bson.D {
	return bson.D{{Key: "$dateTrunc", Value: append(bson.D{{Key: "date", Value: "$ts"}, {Key: "unit", Value: unit}}, more...)}}
}

func TestSummaryAggregates(t *testing.T) {
	db := uniqueDB(t)
	ctx := ctxFor(t)
	p := startProxy(t, proxyOptions{yaml: summaryRule(db)})
	pc := connect(t, p.URI())
	events := genSumEvents(6000, 5)
	docs := make([]any, len(events))
	for i, e := range events {
		docs[i] = e.doc()
	}
	for i := 0; i < len(docs); i += 1000 {
		if _, err := pc.Database(db).Collection("readings").InsertMany(ctx, docs[i:min(i+1000, len(docs))]); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := direct(t).Database(db).Collection("plain").InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}
	from, to := summaryBase.Add(26*time.Hour), summaryBase.Add(75*time.Hour)
	inRange := func(e sumEvent) bool { return !e.ts.Before(from) && e.ts.Before(to) && e.sensor == "s1" }
	week := func(t time.Time) time.Time { // Sunday-start weeks
		d := truncDay(t)
		return d.AddDate(0, 0, -int(d.Weekday()))
	}
	accs := summaryAccs
	cases := []struct {
		name     string
		match    bson.D
		id       any
		key      func(sumEvent) (any, bool)
		sortDesc bool // then {$sort: {total: -1}}, {$limit: 3}
	}{
		{"by day", nil, dateTruncSpec("day"),
			func(e sumEvent) (any, bool) { return bson.NewDateTimeFromTime(truncDay(e.ts)), true }, false},
		{"by sensor and hour", nil, bson.D{{Key: "s", Value: "$sensorId"}, {Key: "h", Value: dateTruncSpec("hour")}},
			func(e sumEvent) (any, bool) {
				return bson.D{{Key: "s", Value: e.sensor}, {Key: "h", Value: bson.NewDateTimeFromTime(truncHour(e.ts))}}, true
			}, false},
		{"a range on hour edges of one sensor, by 6 hours", bson.D{{Key: "ts", Value: bson.D{{Key: "$gte", Value: from}, {Key: "$lt", Value: to}}}, {Key: "sensorId", Value: "s1"}},
			dateTruncSpec("hour", bson.E{Key: "binSize", Value: 6}),
			func(e sumEvent) (any, bool) {
				return bson.NewDateTimeFromTime(e.ts.UTC().Truncate(6 * time.Hour)), inRange(e)
			}, false},
		{"by week", nil, dateTruncSpec("week"),
			func(e sumEvent) (any, bool) { return bson.NewDateTimeFromTime(week(e.ts)), true }, false},
		{"by sensor", nil, "$sensorId", func(e sumEvent) (any, bool) { return e.sensor, true }, false},
		{"top 3 hours by total", nil, dateTruncSpec("hour"),
			func(e sumEvent) (any, bool) { return bson.NewDateTimeFromTime(truncHour(e.ts)), true }, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var pipeline bson.A
			if c.match != nil {
				pipeline = append(pipeline, bson.D{{Key: "$match", Value: c.match}})
			}
			pipeline = append(pipeline, bson.D{{Key: "$group", Value: append(bson.D{{Key: "_id", Value: c.id}}, accs...)}})
			if c.sortDesc {
				pipeline = append(pipeline, bson.D{{Key: "$sort", Value: bson.D{{Key: "total", Value: -1}}}}, bson.D{{Key: "$limit", Value: 3}})
			}
			got := runAggregate(t, pc.Database(db).Collection("readings"), pipeline)
			want := refDocs(refGroups(events, c.key), c.sortDesc)
			compareGroups(t, "proxy (summaries) vs Go reference", got, want, c.sortDesc)
			// The same pipeline on the plain collection, where the upstream runs it.
			if plain, err := tryAggregate(direct(t).Database(db).Collection("plain"), pipeline); err == nil {
				compareGroups(plainReference(t), "proxy vs the plain collection", got, plain, c.sortDesc)
			} else {
				t.Logf("the upstream does not run this pipeline on a plain collection: %v", err)
			}
			// The proxy's unwound path (a leading $sort keeps the summaries
			// out), on upstreams that run $group on events.
			unwound := append(bson.A{bson.D{{Key: "$sort", Value: bson.D{{Key: "ts", Value: 1}}}}}, pipeline...)
			if u, err := tryAggregate(pc.Database(db).Collection("readings"), unwound); err == nil {
				compareGroups(t, "proxy summaries vs proxy unwound", got, u, c.sortDesc)
			} else if !refused(err) {
				t.Fatalf("unwound path: %v", err)
			} else {
				t.Logf("the proxy's unwound path refuses this pipeline on this upstream: %v", err)
			}
		})
	}
}

// TestSummaryBucketStage checks $bucket by time with boundaries on window
// edges against the Go reference and the plain collection, and MongoDB's
// error for events outside the boundaries without a default.
func TestSummaryBucketStage(t *testing.T) {
	db := uniqueDB(t)
	ctx := ctxFor(t)
	p := startProxy(t, proxyOptions{yaml: summaryRule(db)})
	coll := connect(t, p.URI()).Database(db).Collection("readings")
	events := genSumEvents(3000, 7)
	docs := make([]any, len(events))
	for i, e := range events {
		docs[i] = e.doc()
	}
	if _, err := coll.InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}
	if _, err := direct(t).Database(db).Collection("plain").InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}
	edges := []time.Time{summaryBase.Add(24 * time.Hour), summaryBase.Add(30 * time.Hour), summaryBase.Add(72 * time.Hour), summaryBase.Add(73 * time.Hour)}
	bounds := bson.A{}
	for _, e := range edges {
		bounds = append(bounds, e)
	}
	rangeOf := func(ts time.Time) (any, bool) {
		for i := len(edges) - 2; i >= 0; i-- {
			if !ts.Before(edges[i]) && ts.Before(edges[i+1]) {
				return bson.NewDateTimeFromTime(edges[i]), true
			}
		}
		return nil, false
	}
	output := summaryAccs
	inside := bson.D{{Key: "$match", Value: bson.D{{Key: "ts", Value: bson.D{{Key: "$gte", Value: edges[0]}, {Key: "$lt", Value: edges[3]}}}}}}
	cases := []struct {
		name     string
		pipeline bson.A
		key      func(sumEvent) (any, bool)
		counts   bool
	}{
		{"with a default and output", bson.A{bson.D{{Key: "$bucket", Value: bson.D{{Key: "groupBy", Value: "$ts"}, {Key: "boundaries", Value: bounds}, {Key: "default", Value: "other"}, {Key: "output", Value: output}}}}},
			func(e sumEvent) (any, bool) {
				if id, ok := rangeOf(e.ts); ok {
					return id, true
				}
				return "other", true
			}, false},
		{"matched inside, default output", bson.A{inside, bson.D{{Key: "$bucket", Value: bson.D{{Key: "groupBy", Value: "$ts"}, {Key: "boundaries", Value: bounds}}}}},
			func(e sumEvent) (any, bool) { return rangeOf(e.ts) }, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := runAggregate(t, coll, c.pipeline)
			groups := refGroups(events, c.key)
			var want []bson.D
			if c.counts {
				for _, g := range groups {
					want = append(want, bson.D{{Key: "_id", Value: g.id}, {Key: "count", Value: g.count}})
				}
			} else {
				want = refDocs(groups, false)
			}
			compareGroups(t, "proxy (summaries) vs Go reference", got, want, false)
			for i := 1; i < len(got); i++ { // in _id order: "other" (a string) before dates
				if _, isDate := got[i][0].Value.(bson.DateTime); !isDate {
					t.Fatalf("group %d is %v: want the default first", i, got[i])
				}
			}
			if plain, err := tryAggregate(direct(t).Database(db).Collection("plain"), c.pipeline); err == nil {
				compareGroups(plainReference(t), "proxy vs the plain collection", got, plain, false)
			} else {
				t.Logf("the upstream does not run this pipeline on a plain collection: %v", err)
			}
		})
	}
	t.Run("events outside without a default", func(t *testing.T) {
		_, err := tryAggregate(coll, bson.A{bson.D{{Key: "$bucket", Value: bson.D{{Key: "groupBy", Value: "$ts"}, {Key: "boundaries", Value: bounds}}}}})
		var se mongo.ServerError
		if !errors.As(err, &se) || !se.HasErrorCode(40066) || !strings.Contains(err.Error(), "no default was specified") {
			t.Fatalf("want MongoDB's error 40066, got %v", err)
		}
	})
}

// TestSummaryNotExact: shapes the summaries cannot answer exactly are not
// answered from them: a $match that cuts a bucket, a named meta part
// over events without the metaField (missing and null share a bucket),
// and sums of doubles that round.
func TestSummaryNotExact(t *testing.T) {
	db := uniqueDB(t)
	ctx := ctxFor(t)
	p := startProxy(t, proxyOptions{yaml: summaryRule(db)})
	coll := connect(t, p.URI()).Database(db).Collection("readings")
	events := []any{
		bson.D{{Key: "ts", Value: summaryBase.Add(10 * time.Minute)}, {Key: "sensorId", Value: "a"}, {Key: "value", Value: 1.5}},
		bson.D{{Key: "ts", Value: summaryBase.Add(50 * time.Minute)}, {Key: "sensorId", Value: "a"}, {Key: "value", Value: 2.5}},
		bson.D{{Key: "ts", Value: summaryBase.Add(20 * time.Minute)}, {Key: "value", Value: 4.0}},
		// Tenths: a sum of them rounds, and MongoDB's rounding depends on
		// the order it adds them in.
		bson.D{{Key: "ts", Value: summaryBase.Add(24*time.Hour + time.Minute)}, {Key: "sensorId", Value: "t"}, {Key: "value", Value: 0.1}},
		bson.D{{Key: "ts", Value: summaryBase.Add(24*time.Hour + 2*time.Minute)}, {Key: "sensorId", Value: "t"}, {Key: "value", Value: 0.2}},
		bson.D{{Key: "ts", Value: summaryBase.Add(25*time.Hour + time.Minute)}, {Key: "sensorId", Value: "t"}, {Key: "value", Value: 0.3}},
	}
	if _, err := coll.InsertMany(ctx, events); err != nil {
		t.Fatal(err)
	}
	group := bson.D{{Key: "$group", Value: bson.D{{Key: "_id", Value: bson.D{{Key: "s", Value: "$sensorId"}}}, {Key: "total", Value: bson.D{{Key: "$sum", Value: "$value"}}}}}}
	tenths := bson.D{{Key: "$match", Value: bson.D{{Key: "sensorId", Value: "t"}}}}
	cut := bson.D{{Key: "$match", Value: bson.D{{Key: "ts", Value: bson.D{{Key: "$gte", Value: summaryBase.Add(30 * time.Minute)}}}}}}
	for name, pipeline := range map[string]bson.A{
		"match cuts the bucket": {cut, bson.D{{Key: "$group", Value: bson.D{{Key: "_id", Value: dateTruncSpec("hour")}, {Key: "total", Value: bson.D{{Key: "$sum", Value: "$value"}}}}}}},
		"named meta, null meta": {group},
		"sum of tenths":         {tenths, bson.D{{Key: "$group", Value: bson.D{{Key: "_id", Value: "$sensorId"}, {Key: "total", Value: bson.D{{Key: "$sum", Value: "$value"}}}}}}},
		"avg of tenths":         {tenths, bson.D{{Key: "$group", Value: bson.D{{Key: "_id", Value: "$sensorId"}, {Key: "total", Value: bson.D{{Key: "$avg", Value: "$value"}}}}}}},
	} {
		t.Run(name, func(t *testing.T) {
			// Answered from the events: by the upstream where it runs
			// the pipeline (MongoDB), else by the proxy's engine. Sums of
			// doubles are MongoDB's (double-double, rounded once: 0.1 +
			// 0.2 + 0.3 is 0.6, where FerretDB's own $sum on a plain
			// collection gives 0.6000000000000001).
			docs, err := tryAggregate(coll, pipeline)
			if err != nil {
				t.Fatal(err)
			}
			day := bson.NewDateTimeFromTime(summaryBase.Add(24 * time.Hour))
			tenth, fifth, sum := 0.1, 0.2, 0.6 // rounded at run time, not as exact constants
			n := 3.0
			want := map[string][]bson.D{
				"match cuts the bucket": {{{Key: "_id", Value: bson.NewDateTimeFromTime(summaryBase)}, {Key: "total", Value: 2.5}},
					{{Key: "_id", Value: day}, {Key: "total", Value: tenth + fifth}},
					{{Key: "_id", Value: bson.NewDateTimeFromTime(summaryBase.Add(25 * time.Hour))}, {Key: "total", Value: 0.3}}},
				// A missing field of an _id object is null (MongoDB; issue 55, case 3).
				"named meta, null meta": {{{Key: "_id", Value: bson.D{{Key: "s", Value: nil}}}, {Key: "total", Value: 4.0}}, {{Key: "_id", Value: bson.D{{Key: "s", Value: "a"}}}, {Key: "total", Value: 4.0}},
					{{Key: "_id", Value: bson.D{{Key: "s", Value: "t"}}}, {Key: "total", Value: 0.6}}},
				"sum of tenths": {{{Key: "_id", Value: "t"}, {Key: "total", Value: 0.6}}},
				"avg of tenths": {{{Key: "_id", Value: "t"}, {Key: "total", Value: sum / n}}},
			}[name]
			compareGroups(t, "unwound", docs, want, false)
		})
	}
}

func runAggregate(t *testing.T, coll *mongo.Collection, pipeline bson.A) []bson.D {
	t.Helper()
	docs, err := tryAggregate(coll, pipeline)
	if err != nil {
		t.Fatal(err)
	}
	return docs
}

func tryAggregate(coll *mongo.Collection, pipeline bson.A) ([]bson.D, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cur, err := coll.Aggregate(ctx, pipeline)
	if err != nil {
		return nil, err
	}
	var out []bson.D
	if err := cur.All(ctx, &out); err != nil {
		return nil, err
	}
	return out, nil
}

func refDocs(groups map[string]*refGroup, byTotalDesc bool) []bson.D {
	out := make([]bson.D, 0, len(groups))
	var list []*refGroup
	for _, g := range groups {
		list = append(list, g)
	}
	if byTotalDesc {
		sort.Slice(list, func(i, j int) bool { return list[i].sumValue > list[j].sumValue })
		list = list[:min(3, len(list))]
	}
	for _, g := range list {
		out = append(out, bson.D{
			{Key: "_id", Value: g.id},
			{Key: "total", Value: g.sumValue},
			{Key: "events", Value: g.count},
			{Key: "withN", Value: g.sumN},
			{Key: "lo", Value: g.minV},
			{Key: "hi", Value: g.maxV},
			{Key: "first", Value: bson.NewDateTimeFromTime(g.minTS)},
			{Key: "last", Value: bson.NewDateTimeFromTime(g.maxTS)},
			{Key: "avg", Value: g.avgValue()},
			{Key: "avgN", Value: g.avgN()},
		})
	}
	return out
}

// compareGroups compares result documents by _id (in order when ordered):
// same fields, same BSON types, same values, doubles to the last bit (the
// events' values make every sum exact).
func compareGroups(t reporter, what string, got, want []bson.D, ordered bool) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d groups, want %d", what, len(got), len(want))
		return // a findingsOnly goes on
	}
	index := map[string]bson.D{}
	for _, d := range want {
		index[fmt.Sprint(d[0].Value)] = d
	}
	for i, g := range got {
		w, ok := index[fmt.Sprint(g[0].Value)]
		if ordered {
			w, ok = want[i], true
		}
		if !ok {
			t.Fatalf("%s: unexpected group %v", what, g)
			return
		}
		if err := sameDoc(g, w); err != nil {
			t.Fatalf("%s: %v\n got  %v\n want %v", what, err, g, w)
			return
		}
	}
}

func sameDoc(got, want bson.D) error {
	if len(got) != len(want) {
		return errors.New("different fields")
	}
	for i := range got {
		g, w := got[i], want[i]
		if g.Key != w.Key {
			return fmt.Errorf("field %d is %q, want %q", i, g.Key, w.Key)
		}
		if reflect.TypeOf(g.Value) != reflect.TypeOf(w.Value) {
			return fmt.Errorf("%s is a %T, want a %T", g.Key, g.Value, w.Value)
		}
		if gf, ok := g.Value.(float64); ok {
			if wf := w.Value.(float64); gf != wf {
				return fmt.Errorf("%s is %v, want %v (to the last bit)", g.Key, gf, wf)
			}
			continue
		}
		if fmt.Sprint(g.Value) != fmt.Sprint(w.Value) {
			return fmt.Errorf("%s is %v, want %v", g.Key, g.Value, w.Value)
		}
	}
	return nil
}

// refused: the proxy's clear NotImplemented error naming the rule.
func refused(err error) bool {
	var se mongo.ServerError
	return errors.As(err, &se) && se.HasErrorCode(238) && strings.Contains(err.Error(), "tsproxy rule")
}

// TestSummaryIntTypes: $sum keeps MongoDB's result types when the bucket
// sums were kept by upserts ($inc upstream) and by complete inserts: an
// int32 total stays an int32, an int64 event makes an int64, an int32
// total past 2^31 becomes an int64.
func TestSummaryIntTypes(t *testing.T) {
	db := uniqueDB(t)
	ctx := ctxFor(t)
	p := startProxy(t, proxyOptions{yaml: summaryRule(db)})
	coll := connect(t, p.URI()).Database(db).Collection("readings")
	ev := func(sensor string, sec int, n any) bson.D {
		return bson.D{{Key: "ts", Value: summaryBase.Add(time.Duration(sec) * time.Second)}, {Key: "sensorId", Value: sensor}, {Key: "n", Value: n}}
	}
	batches := [][]any{
		{ev("small", 1, int32(5)), ev("small", 2, int32(-3))},
		{ev("small", 3, int32(7))},
		{ev("long", 1, int32(5)), ev("long", 2, int64(1))},
		{ev("long", 3, int32(2))},
		{ev("big", 1, int32(2_000_000_000))},
		{ev("big", 2, int32(2_000_000_000))},
	}
	// A complete bucket too (one batch past the insert threshold).
	var many []any
	for i := 0; i < 150; i++ {
		many = append(many, ev("bulk", i, int32(i)))
	}
	batches = append(batches, many)
	for _, b := range batches {
		if _, err := coll.InsertMany(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	group := bson.D{{Key: "$group", Value: bson.D{{Key: "_id", Value: "$sensorId"}, {Key: "total", Value: bson.D{{Key: "$sum", Value: "$n"}}}, {Key: "events", Value: bson.D{{Key: "$count", Value: bson.D{}}}}}}}
	only := func(s ...string) bson.D {
		return bson.D{{Key: "$match", Value: bson.D{{Key: "sensorId", Value: bson.D{{Key: "$in", Value: s}}}}}}
	}
	got := runAggregate(t, coll, bson.A{only("small", "long", "bulk"), group})
	want := []bson.D{
		{{Key: "_id", Value: "small"}, {Key: "total", Value: int32(9)}, {Key: "events", Value: int32(3)}},
		{{Key: "_id", Value: "long"}, {Key: "total", Value: int64(8)}, {Key: "events", Value: int32(3)}},
		{{Key: "_id", Value: "bulk"}, {Key: "total", Value: int32(149 * 150 / 2)}, {Key: "events", Value: int32(150)}},
	}
	compareGroups(t, "proxy (summaries) vs MongoDB's $sum types", got, want, false)

	// FerretDB's $inc wraps the int32 bucket sum of "big" (2e9 + 2e9): the
	// summaries cannot be trusted, so the unwound path answers or refuses.
	got, err := tryAggregate(coll, bson.A{only("big"), group})
	if err != nil {
		if !refused(err) {
			t.Fatalf("want a clear refusal, got %v", err)
		}
		return
	}
	compareGroups(t, "int32 total past 2^31", got, []bson.D{{{Key: "_id", Value: "big"}, {Key: "total", Value: int64(4_000_000_000)}, {Key: "events", Value: int32(2)}}}, false)
}

// TestSummaryMongosh: mongosh's aggregate helper gets the daily totals of
// events it inserted, answered from the bucket summaries.
func TestSummaryMongosh(t *testing.T) {
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: summaryRule(db)})
	script := fmt.Sprintf(`const d = connect(process.env.TSPROXY_URI + %q);
const base = ISODate("2026-03-01T00:00:00Z").getTime();
const docs = [];
for (let k = 0; k < 2000; k++) {
  docs.push({sensorId: "s" + (k %% 2), ts: new Date(base + k * 97000), value: k %% 10, n: NumberInt(k %% 3)});
}
d.readings.insertMany(docs);
const out = d.readings.aggregate([
  {$match: {sensorId: "s1"}},
  {$group: {_id: {$dateTrunc: {date: "$ts", unit: "day"}}, events: {$count: {}}, n: {$sum: "$n"}, hi: {$max: "$value"}}},
  {$sort: {_id: 1}}]).toArray();
print(JSON.stringify(out.map(x => [x._id.toISOString().slice(0, 10), x.events, x.n, x.hi])));
`, db)
	out := runMongosh(t, p.URI(), script)
	line := out[strings.LastIndex(strings.TrimSpace(out), "\n")+1:]
	// Expected from the same events, computed here.
	type day struct{ events, n, hi int }
	days := map[string]*day{}
	var order []string
	base := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	for k := 0; k < 2000; k++ {
		if k%2 != 1 {
			continue
		}
		key := base.Add(time.Duration(k) * 97 * time.Second).Format("2006-01-02")
		if days[key] == nil {
			days[key] = &day{hi: -1}
			order = append(order, key)
		}
		d := days[key]
		d.events++
		d.n += k % 3
		d.hi = max(d.hi, k%10)
	}
	var parts []string
	for _, k := range order {
		parts = append(parts, fmt.Sprintf(`["%s",%d,%d,%d]`, k, days[k].events, days[k].n, days[k].hi))
	}
	if want := "[" + strings.Join(parts, ",") + "]"; strings.TrimSpace(line) != want {
		t.Fatalf("mongosh output:\n%s\nwant %s", out, want)
	}
}

// TestSummaryAvgFormats: $avg from the summaries of complete buckets
// (also after a delete rewrote one), and buckets of the older format
// without counts: a bucket written directly to the upstream as an older
// proxy wrote it, and such a bucket that a newer upsert then joined. Those
// keep answering integer $sum from their summaries; $avg and double sums
// over them are not answered from summaries (the unwound path answers, or
// refuses clearly on FerretDB).
func TestSummaryAvgFormats(t *testing.T) {
	db := uniqueDB(t)
	ctx := ctxFor(t)
	// The direct path: the "older bucket joined by a newer upsert" case
	// needs an upsert into an existing bucket, which staging never does.
	p := startProxy(t, proxyOptions{yaml: summaryRule(db) + "    ingest: direct\n"})
	coll := connect(t, p.URI()).Database(db).Collection("readings")
	bySensor := func(sensor string, accs ...bson.E) bson.A {
		return bson.A{
			bson.D{{Key: "$match", Value: bson.D{{Key: "sensorId", Value: sensor}}}},
			bson.D{{Key: "$group", Value: append(bson.D{{Key: "_id", Value: "$sensorId"}}, accs...)}},
		}
	}
	avg := func(f string) bson.E { return bson.E{Key: "a", Value: bson.D{{Key: "$avg", Value: "$" + f}}} }
	sum := func(f string) bson.E { return bson.E{Key: "s", Value: bson.D{{Key: "$sum", Value: "$" + f}}} }
	// answered: the summaries answer (FerretDB's unwound path would refuse).
	answered := func(pipeline bson.A, want bson.D) {
		t.Helper()
		compareGroups(t, "summaries", runAggregate(t, coll, pipeline), []bson.D{want}, false)
	}
	// declined: not from summaries: refused on FerretDB, else right.
	declined := func(pipeline bson.A, want bson.D) {
		t.Helper()
		got, err := tryAggregate(coll, pipeline)
		if err != nil {
			if !refused(err) {
				t.Fatalf("want the unwound path's clear refusal, got %v", err)
			}
			return
		}
		compareGroups(t, "unwound", got, []bson.D{want}, false)
	}

	t.Run("complete bucket, then a delete rewrites it", func(t *testing.T) {
		var docs []any
		var n, sumN int32
		var nv int
		var sumV float64
		for i := 0; i < 150; i++ {
			d := bson.D{{Key: "ts", Value: summaryBase.Add(time.Duration(i) * time.Second)}, {Key: "sensorId", Value: "bulk"}, {Key: "n", Value: int32(i)}}
			if i%3 != 0 {
				d = append(d, bson.E{Key: "value", Value: float64(i) / 2})
			}
			docs = append(docs, d)
		}
		if _, err := coll.InsertMany(ctx, docs); err != nil { // past the insert threshold: one complete bucket
			t.Fatal(err)
		}
		want := func(from int) bson.D {
			n, sumN, nv, sumV = 0, 0, 0, 0
			for i := from; i < 150; i++ {
				n++
				sumN += int32(i)
				if i%3 != 0 {
					nv++
					sumV += float64(i) / 2
				}
			}
			return bson.D{{Key: "_id", Value: "bulk"}, {Key: "a", Value: sumV / float64(nv)}, {Key: "b", Value: float64(sumN) / float64(n)}}
		}
		avgN := bson.E{Key: "b", Value: bson.D{{Key: "$avg", Value: "$n"}}}
		answered(bySensor("bulk", avg("value"), avgN), want(0))
		res, err := coll.DeleteMany(ctx, bson.D{{Key: "sensorId", Value: "bulk"}, {Key: "n", Value: bson.D{{Key: "$lt", Value: 10}}}})
		if err != nil || res.DeletedCount != 10 {
			t.Fatalf("delete: %v, %+v", err, res)
		}
		answered(bySensor("bulk", avg("value"), avgN), want(10))
	})

	// A bucket as the proxy wrote it before counts: no counted, counts
	// or lowBit.
	start := summaryBase.Add(48 * time.Hour)
	ns := db + ".readings.buckets"
	_, metaBytes, err := bson.MarshalValue("old")
	if err != nil {
		t.Fatal(err)
	}
	meta := bson.RawValue{Type: bson.TypeString, Value: metaBytes}
	ev := func(sec int, v float64, n int32) bson.D {
		return bson.D{{Key: "_id", Value: bson.NewObjectID()}, {Key: "ts", Value: bson.NewDateTimeFromTime(start.Add(time.Duration(sec) * time.Second))}, {Key: "sensorId", Value: nil}, {Key: "value", Value: v}, {Key: "n", Value: n}}
	}
	old := bson.D{
		{Key: "_id", Value: bucket.IDOf(ns, meta, start.UnixMilli(), 0)},
		{Key: "meta", Value: "old"},
		{Key: "start", Value: bson.NewDateTimeFromTime(start)},
		{Key: "count", Value: int32(2)},
		{Key: "bytes", Value: int32(200)},
		{Key: "min", Value: bson.D{{Key: "ts", Value: bson.NewDateTimeFromTime(start.Add(time.Second))}, {Key: "value", Value: 1.5}, {Key: "n", Value: int32(2)}}},
		{Key: "max", Value: bson.D{{Key: "ts", Value: bson.NewDateTimeFromTime(start.Add(2 * time.Second))}, {Key: "value", Value: 2.0}, {Key: "n", Value: int32(3)}}},
		{Key: "sum", Value: bson.D{{Key: "value", Value: 3.5}, {Key: "n", Value: int32(5)}}},
		{Key: "events", Value: bson.A{ev(1, 1.5, 2), ev(2, 2.0, 3)}},
	}
	if _, err := direct(t).Database(db).Collection("readings.buckets").InsertOne(ctx, old); err != nil {
		t.Fatal(err)
	}
	t.Run("older bucket", func(t *testing.T) {
		answered(bySensor("old", sum("n")), bson.D{{Key: "_id", Value: "old"}, {Key: "s", Value: int32(5)}})
		declined(bySensor("old", avg("value")), bson.D{{Key: "_id", Value: "old"}, {Key: "a", Value: 1.75}})
		declined(bySensor("old", avg("n")), bson.D{{Key: "_id", Value: "old"}, {Key: "a", Value: 2.5}})
		declined(bySensor("old", sum("value")), bson.D{{Key: "_id", Value: "old"}, {Key: "s", Value: 3.5}})
	})
	t.Run("older bucket joined by a newer upsert", func(t *testing.T) {
		if _, err := coll.InsertOne(ctx, bson.D{{Key: "ts", Value: start.Add(3 * time.Second)}, {Key: "sensorId", Value: "old"}, {Key: "value", Value: 4.0}, {Key: "n", Value: int32(1)}}); err != nil {
			t.Fatal(err)
		}
		var b struct {
			Count   int32 `bson:"count"`
			Counted int32 `bson:"counted"`
		}
		if err := direct(t).Database(db).Collection("readings.buckets").FindOne(ctx, bson.D{{Key: "meta", Value: "old"}}).Decode(&b); err != nil || b.Count != 3 || b.Counted != 1 {
			t.Fatalf("the upsert did not join the older bucket: %+v %v", b, err)
		}
		answered(bySensor("old", sum("n")), bson.D{{Key: "_id", Value: "old"}, {Key: "s", Value: int32(6)}})
		declined(bySensor("old", avg("value")), bson.D{{Key: "_id", Value: "old"}, {Key: "a", Value: 2.5}})
		declined(bySensor("old", avg("n")), bson.D{{Key: "_id", Value: "old"}, {Key: "a", Value: 2.0}})
	})
}

// TestSummaryMixedValues: events whose aggregated field holds a string or
// a null are stored, as a plain collection stores them; their buckets'
// summaries say they cannot answer, so reads and aggregations give the
// plain collection's answers, from the events.
func TestSummaryMixedValues(t *testing.T) {
	t.Parallel()
	db := uniqueDB(t)
	ctx := ctxFor(t)
	p := startProxy(t, proxyOptions{yaml: summaryRule(db)})
	proxied := connect(t, p.URI()).Database(db).Collection("readings")
	plain := direct(t).Database(db).Collection("plain")
	var docs []any
	for i := 0; i < 300; i++ {
		var v any = float64(i%17) + 0.25
		switch i % 50 {
		case 7:
			v = "n/a"
		case 19:
			v = nil
		}
		docs = append(docs, bson.D{{Key: "_id", Value: bson.NewObjectID()}, {Key: "ts", Value: summaryBase.Add(time.Duration(i) * time.Minute)}, {Key: "sensorId", Value: "m1"}, {Key: "value", Value: v}})
	}
	for _, c := range []*mongo.Collection{proxied, plain} {
		for i := 0; i < len(docs); i += 60 { // several inserts: upserts and complete buckets
			if _, err := c.InsertMany(ctx, docs[i:i+60]); err != nil {
				t.Fatalf("insert into %s: %v", c.Name(), err)
			}
		}
	}
	read := func(c *mongo.Collection, pipeline bson.A) ([]bson.D, error) {
		t.Helper()
		cur, err := c.Aggregate(ctx, pipeline)
		if err != nil {
			return nil, err
		}
		var out []bson.D
		err = cur.All(ctx, &out)
		return out, err
	}
	match := bson.D{{Key: "$match", Value: bson.D{{Key: "sensorId", Value: "m1"}, {Key: "ts", Value: bson.D{{Key: "$gte", Value: summaryBase}, {Key: "$lt", Value: summaryBase.Add(5 * time.Hour)}}}}}}
	sumValue := bson.A{match, bson.D{{Key: "$group", Value: bson.D{{Key: "_id", Value: nil}, {Key: "s", Value: bson.D{{Key: "$sum", Value: "$value"}}}}}}}
	for _, pl := range []bson.A{
		{match, bson.D{{Key: "$sort", Value: bson.D{{Key: "ts", Value: 1}}}}},
		sumValue,
		{match, bson.D{{Key: "$group", Value: bson.D{{Key: "_id", Value: "$sensorId"}, {Key: "n", Value: bson.D{{Key: "$sum", Value: 1}}}}}}},
		{match, bson.D{{Key: "$count", Value: "n"}}},
	} {
		want, err := read(plain, pl)
		if err != nil {
			t.Fatal(err)
		}
		got, err := read(proxied, pl)
		if err != nil && fmt.Sprint(pl) == fmt.Sprint(sumValue) && !env.external && strings.Contains(err.Error(), `"$group" is supported`) {
			// The summaries cannot answer, and FerretDB cannot run the
			// $group on the events (issue 17): refused, not answered
			// from summaries that leave the string out.
			continue
		}
		if err != nil {
			t.Fatalf("%v: %v", pl, err)
		}
		if len(want) == 0 || len(got) != len(want) {
			t.Fatalf("%v: proxy %d documents, plain %d", pl, len(got), len(want))
		}
		for i := range want {
			if fmt.Sprint(got[i]) != fmt.Sprint(want[i]) {
				t.Fatalf("%v: document %d:\nproxy %v\nplain %v", pl, i, got[i], want[i])
			}
		}
	}
}
