package agg_test

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/agg"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

var t0 = time.Date(2026, 3, 1, 10, 7, 30, 250e6, time.UTC)

func dt(d time.Duration) bson.DateTime { return bson.NewDateTimeFromTime(t0.Add(d)) }

// events are readings of two sensors, every 10 minutes for an hour and
// a half, with a null and a missing value among them.
func events() []bson.D {
	var out []bson.D
	for i := 0; i < 10; i++ {
		for _, s := range []string{"a", "b"} {
			d := bson.D{{Key: "_id", Value: int32(len(out))}, {Key: "ts", Value: dt(time.Duration(i) * 10 * time.Minute)}, {Key: "sensor", Value: s}}
			switch {
			case s == "b" && i == 3:
				d = append(d, bson.E{Key: "value", Value: nil})
			case s == "b" && i == 4:
			default:
				d = append(d, bson.E{Key: "value", Value: float64(i)*0.1 + map[string]float64{"a": 0, "b": 100}[s]})
			}
			d = append(d, bson.E{Key: "n", Value: int32(i)})
			out = append(out, d)
		}
	}
	return out
}

func run(t *testing.T, docs []bson.D, pipeline bson.A) ([]bson.Raw, error) {
	t.Helper()
	var stages []agg.Stage
	for _, st := range pipeline {
		raw, err := bson.Marshal(st)
		if err != nil {
			t.Fatal(err)
		}
		e, _ := bsoncore.Document(raw).IndexErr(0)
		stages = append(stages, agg.Stage{Name: e.Key(), Value: e.Value()})
	}
	p, err := agg.Compile(stages, agg.Options{MaxMemory: 1 << 20})
	if err != nil {
		return nil, err
	}
	for _, d := range docs {
		raw, err := bson.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Push(raw); err != nil {
			return nil, err
		}
	}
	out, err := p.Finish()
	var res []bson.Raw
	for _, d := range out {
		res = append(res, bson.Raw(d))
	}
	return res, err
}

// checkRun runs pipeline over in and compares the output with want,
// byte for byte (values, BSON types, field order).
func checkRun(t *testing.T, in []bson.D, pipeline A, want []D) {
	t.Helper()
	got, err := run(t, in, pipeline)
	if err != nil {
		t.Fatal(err)
	}
	w := marshalAll(t, want)
	if len(got) != len(w) {
		t.Fatalf("got %d documents, want %d:\n%v", len(got), len(w), got)
	}
	for i := range got {
		if !bytes.Equal(got[i], w[i]) {
			t.Errorf("document %d:\n got %s\nwant %s", i, got[i], w[i])
		}
	}
}

func marshalAll(t *testing.T, docs []bson.D) []bson.Raw {
	var out []bson.Raw
	for _, d := range docs {
		raw, err := bson.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, raw)
	}
	return out
}

type D = bson.D
type A = bson.A
type E = bson.E

func TestPipelines(t *testing.T) {
	hour := func(h int) bson.DateTime {
		return bson.NewDateTimeFromTime(time.Date(2026, 3, 1, h, 0, 0, 0, time.UTC))
	}
	for _, c := range []struct {
		name     string
		in       []bson.D
		pipeline A
		want     []D
	}{
		{
			name: "per series count, sum, avg, min, max, first, last",
			in:   events(),
			pipeline: A{
				D{{Key: "$group", Value: D{{Key: "_id", Value: "$sensor"}, {Key: "n", Value: D{{Key: "$sum", Value: 1}}},
					{Key: "sum", Value: D{{Key: "$sum", Value: "$value"}}}, {Key: "avg", Value: D{{Key: "$avg", Value: "$value"}}},
					{Key: "min", Value: D{{Key: "$min", Value: "$value"}}}, {Key: "max", Value: D{{Key: "$max", Value: "$value"}}},
					{Key: "first", Value: D{{Key: "$first", Value: "$n"}}}, {Key: "last", Value: D{{Key: "$last", Value: "$value"}}},
					{Key: "c", Value: D{{Key: "$count", Value: D{}}}}, {Key: "ints", Value: D{{Key: "$sum", Value: "$n"}}}}}},
				D{{Key: "$sort", Value: D{{Key: "_id", Value: 1}}}},
			},
			want: []D{
				// 0.1+...+0.9 in double-double, rounded once: 4.5 (a naive
				// loop gives 4.499999999999999).
				{{Key: "_id", Value: "a"}, {Key: "n", Value: int32(10)}, {Key: "sum", Value: 4.5}, {Key: "avg", Value: 0.45},
					{Key: "min", Value: 0.0}, {Key: "max", Value: 0.9}, {Key: "first", Value: int32(0)}, {Key: "last", Value: 0.9},
					{Key: "c", Value: int32(10)}, {Key: "ints", Value: int32(45)}},
				{{Key: "_id", Value: "b"}, {Key: "n", Value: int32(10)}, {Key: "sum", Value: 803.8}, {Key: "avg", Value: 803.8 / 8},
					{Key: "min", Value: 100.0}, {Key: "max", Value: 100.9}, {Key: "first", Value: int32(0)}, {Key: "last", Value: 100.9},
					{Key: "c", Value: int32(10)}, {Key: "ints", Value: int32(45)}},
			},
		},
		{
			name: "hourly buckets by $dateTrunc",
			in:   events(),
			pipeline: A{
				D{{Key: "$match", Value: D{{Key: "sensor", Value: "a"}}}},
				D{{Key: "$group", Value: D{{Key: "_id", Value: D{{Key: "$dateTrunc", Value: D{{Key: "date", Value: "$ts"}, {Key: "unit", Value: "hour"}}}}},
					{Key: "n", Value: D{{Key: "$sum", Value: 1}}}, {Key: "max", Value: D{{Key: "$max", Value: "$n"}}}}}},
				D{{Key: "$sort", Value: D{{Key: "_id", Value: -1}}}},
			},
			want: []D{
				{{Key: "_id", Value: hour(11)}, {Key: "n", Value: int32(4)}, {Key: "max", Value: int32(9)}},
				{{Key: "_id", Value: hour(10)}, {Key: "n", Value: int32(6)}, {Key: "max", Value: int32(5)}},
			},
		},
		{
			name: "$dateTrunc with binSize, $dateToString, date parts in a time zone",
			in:   events()[:1],
			pipeline: A{D{{Key: "$project", Value: D{{Key: "_id", Value: 0},
				{Key: "q", Value: D{{Key: "$dateTrunc", Value: D{{Key: "date", Value: "$ts"}, {Key: "unit", Value: "minute"}, {Key: "binSize", Value: 15}}}}},
				{Key: "m", Value: D{{Key: "$dateTrunc", Value: D{{Key: "date", Value: "$ts"}, {Key: "unit", Value: "month"}}}}},
				{Key: "w", Value: D{{Key: "$dateTrunc", Value: D{{Key: "date", Value: "$ts"}, {Key: "unit", Value: "week"}, {Key: "startOfWeek", Value: "monday"}}}}},
				{Key: "s", Value: D{{Key: "$dateToString", Value: D{{Key: "date", Value: "$ts"}}}}},
				{Key: "f", Value: D{{Key: "$dateToString", Value: D{{Key: "date", Value: "$ts"}, {Key: "format", Value: "%Y-%m-%d %H:00 %j %w %u"}}}}},
				{Key: "h", Value: D{{Key: "$hour", Value: D{{Key: "date", Value: "$ts"}, {Key: "timezone", Value: "America/New_York"}}}}},
				{Key: "hh", Value: D{{Key: "$hour", Value: D{{Key: "date", Value: "$ts"}, {Key: "timezone", Value: "+05:30"}}}}},
				{Key: "dow", Value: D{{Key: "$dayOfWeek", Value: "$ts"}}},
				{Key: "y", Value: D{{Key: "$year", Value: "$ts"}}},
				{Key: "ms", Value: D{{Key: "$millisecond", Value: "$ts"}}},
			}}}},
			want: []D{{
				{Key: "q", Value: bson.NewDateTimeFromTime(time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC))},
				{Key: "m", Value: bson.NewDateTimeFromTime(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC))},
				{Key: "w", Value: bson.NewDateTimeFromTime(time.Date(2026, 2, 23, 0, 0, 0, 0, time.UTC))},
				{Key: "s", Value: "2026-03-01T10:07:30.250Z"},
				{Key: "f", Value: "2026-03-01 10:00 060 1 7"},
				{Key: "h", Value: int32(5)},
				{Key: "hh", Value: int32(15)},
				{Key: "dow", Value: int32(1)},
				{Key: "y", Value: int32(2026)},
				{Key: "ms", Value: int32(250)},
			}},
		},
		{
			name: "$project: included fields in document order, computed ones after",
			in:   events()[:2],
			pipeline: A{D{{Key: "$project", Value: D{{Key: "double", Value: D{{Key: "$multiply", Value: A{"$n", 2}}}},
				{Key: "sensor", Value: 1}, {Key: "ts", Value: true}, {Key: "t.h", Value: D{{Key: "$hour", Value: "$ts"}}}}}}},
			want: []D{
				{{Key: "_id", Value: int32(0)}, {Key: "ts", Value: dt(0)}, {Key: "sensor", Value: "a"}, {Key: "double", Value: int32(0)}, {Key: "t", Value: D{{Key: "h", Value: int32(10)}}}},
				{{Key: "_id", Value: int32(1)}, {Key: "ts", Value: dt(0)}, {Key: "sensor", Value: "b"}, {Key: "double", Value: int32(0)}, {Key: "t", Value: D{{Key: "h", Value: int32(10)}}}},
			},
		},
		{
			name:     "$project exclusion and $unset",
			in:       events()[:1],
			pipeline: A{D{{Key: "$project", Value: D{{Key: "_id", Value: 0}, {Key: "n", Value: 0}}}}, D{{Key: "$unset", Value: "value"}}},
			want:     []D{{{Key: "ts", Value: dt(0)}, {Key: "sensor", Value: "a"}}},
		},
		{
			name: "$addFields replaces in place and appends; $$REMOVE removes; $set is $addFields",
			in:   events()[:1],
			pipeline: A{D{{Key: "$addFields", Value: D{{Key: "n", Value: D{{Key: "$add", Value: A{"$n", 1}}}}, {Key: "sensor", Value: "$$REMOVE"},
				{Key: "k", Value: D{{Key: "$cond", Value: A{D{{Key: "$gte", Value: A{"$value", 0}}}, "pos", "neg"}}}}}}},
				D{{Key: "$set", Value: D{{Key: "x.y", Value: D{{Key: "$ifNull", Value: A{"$nothing", "dflt"}}}}}}}},
			want: []D{{{Key: "_id", Value: int32(0)}, {Key: "ts", Value: dt(0)}, {Key: "value", Value: 0.0}, {Key: "n", Value: int32(1)}, {Key: "k", Value: "pos"}, {Key: "x", Value: D{{Key: "y", Value: "dflt"}}}}},
		},
		{
			name: "arithmetic widening and dates",
			in:   []bson.D{{{Key: "i", Value: int32(2147483647)}, {Key: "l", Value: int64(5)}, {Key: "d", Value: 1.5}, {Key: "t", Value: dt(0)}}},
			pipeline: A{D{{Key: "$project", Value: D{
				{Key: "over", Value: D{{Key: "$add", Value: A{"$i", 1}}}},
				{Key: "long", Value: D{{Key: "$add", Value: A{"$l", 1}}}},
				{Key: "dbl", Value: D{{Key: "$add", Value: A{"$l", "$d"}}}},
				{Key: "div", Value: D{{Key: "$divide", Value: A{"$l", 2}}}},
				{Key: "mod", Value: D{{Key: "$mod", Value: A{"$l", 3}}}},
				{Key: "later", Value: D{{Key: "$add", Value: A{"$t", 1000}}}},
				{Key: "span", Value: D{{Key: "$subtract", Value: A{D{{Key: "$add", Value: A{"$t", 60000}}}, "$t"}}}},
				{Key: "null", Value: D{{Key: "$add", Value: A{"$l", "$missing"}}}},
				{Key: "round", Value: D{{Key: "$round", Value: A{2.345, 1}}}},
				{Key: "cmp", Value: D{{Key: "$cmp", Value: A{"$l", "$d"}}}},
				{Key: "str", Value: D{{Key: "$toString", Value: "$l"}}},
				{Key: "cat", Value: D{{Key: "$concat", Value: A{"x", "-", D{{Key: "$toString", Value: "$i"}}}}}},
			}}}},
			want: []D{{{Key: "over", Value: int64(2147483648)}, {Key: "long", Value: int64(6)}, {Key: "dbl", Value: 6.5}, {Key: "div", Value: 2.5},
				{Key: "mod", Value: int64(2)}, {Key: "later", Value: dt(time.Second)}, {Key: "span", Value: int64(60000)}, {Key: "null", Value: nil},
				{Key: "round", Value: 2.3}, {Key: "cmp", Value: int32(1)}, {Key: "str", Value: "5"}, {Key: "cat", Value: "x-2147483647"}}},
		},
		{
			name:     "$sort, $skip, $limit",
			in:       events(),
			pipeline: A{D{{Key: "$sort", Value: D{{Key: "value", Value: -1}, {Key: "_id", Value: 1}}}}, D{{Key: "$skip", Value: 1}}, D{{Key: "$limit", Value: 2}}, D{{Key: "$project", Value: D{{Key: "value", Value: 1}}}}},
			want:     []D{{{Key: "_id", Value: int32(17)}, {Key: "value", Value: 100.8}}, {{Key: "_id", Value: int32(15)}, {Key: "value", Value: 100.7}}},
		},
		{
			name:     "$sort puts missing with null, below numbers",
			in:       events()[6:10],
			pipeline: A{D{{Key: "$sort", Value: D{{Key: "value", Value: 1}, {Key: "_id", Value: -1}}}}, D{{Key: "$project", Value: D{{Key: "_id", Value: 1}}}}},
			want:     []D{{{Key: "_id", Value: int32(9)}}, {{Key: "_id", Value: int32(7)}}, {{Key: "_id", Value: int32(6)}}, {{Key: "_id", Value: int32(8)}}},
		},
		{
			name:     "$count and $sortByCount",
			in:       events(),
			pipeline: A{D{{Key: "$match", Value: D{{Key: "value", Value: D{{Key: "$gte", Value: 100}}}}}}, D{{Key: "$count", Value: "n"}}},
			want:     []D{{{Key: "n", Value: int32(8)}}},
		},
		{
			name:     "$sortByCount",
			in:       append(events()[:3], events()[4]),
			pipeline: A{D{{Key: "$sortByCount", Value: "$sensor"}}},
			want:     []D{{{Key: "_id", Value: "a"}, {Key: "count", Value: int32(3)}}, {{Key: "_id", Value: "b"}, {Key: "count", Value: int32(1)}}},
		},
		{
			name: "$unwind, $push and $addToSet",
			in: []bson.D{{{Key: "_id", Value: 1}, {Key: "tags", Value: A{"x", "y", "x"}}}, {{Key: "_id", Value: 2}, {Key: "tags", Value: A{}}},
				{{Key: "_id", Value: 3}, {Key: "tags", Value: "z"}}},
			pipeline: A{D{{Key: "$unwind", Value: D{{Key: "path", Value: "$tags"}, {Key: "includeArrayIndex", Value: "i"}}}},
				D{{Key: "$group", Value: D{{Key: "_id", Value: nil}, {Key: "all", Value: D{{Key: "$push", Value: "$tags"}}},
					{Key: "set", Value: D{{Key: "$addToSet", Value: "$tags"}}}, {Key: "idx", Value: D{{Key: "$sum", Value: "$i"}}}}}}},
			want: []D{{{Key: "_id", Value: nil}, {Key: "all", Value: A{"x", "y", "x", "z"}}, {Key: "set", Value: A{"x", "y", "z"}}, {Key: "idx", Value: int64(3)}}},
		},
		{
			name: "$bucket with a default and output, sorted by _id",
			in:   events(),
			pipeline: A{D{{Key: "$bucket", Value: D{{Key: "groupBy", Value: "$n"}, {Key: "boundaries", Value: A{0, 3, 6}}, {Key: "default", Value: "other"},
				{Key: "output", Value: D{{Key: "c", Value: D{{Key: "$sum", Value: 1}}}, {Key: "max", Value: D{{Key: "$max", Value: "$value"}}}}}}}}},
			want: []D{{{Key: "_id", Value: int32(0)}, {Key: "c", Value: int32(6)}, {Key: "max", Value: 100.2}},
				{{Key: "_id", Value: int32(3)}, {Key: "c", Value: int32(6)}, {Key: "max", Value: 100.5}},
				{{Key: "_id", Value: "other"}, {Key: "c", Value: int32(8)}, {Key: "max", Value: 100.9}}},
		},
		{
			name:     "$bucket's default output is a count",
			in:       events()[:6],
			pipeline: A{D{{Key: "$bucket", Value: D{{Key: "groupBy", Value: "$n"}, {Key: "boundaries", Value: A{0, 2, 10}}}}}},
			want:     []D{{{Key: "_id", Value: int32(0)}, {Key: "count", Value: int32(4)}}, {{Key: "_id", Value: int32(2)}, {Key: "count", Value: int32(2)}}},
		},
		{
			name: "$switch",
			in:   events()[:4],
			pipeline: A{D{{Key: "$project", Value: D{{Key: "_id", Value: 0}, {Key: "band", Value: D{{Key: "$switch", Value: D{
				{Key: "branches", Value: A{D{{Key: "case", Value: D{{Key: "$gte", Value: A{"$value", 100}}}}, {Key: "then", Value: "high"}},
					D{{Key: "case", Value: D{{Key: "$eq", Value: A{"$n", 1}}}}, {Key: "then", Value: "one"}}}},
				{Key: "default", Value: "low"}}}}}}}}},
			want: []D{{{Key: "band", Value: "low"}}, {{Key: "band", Value: "high"}}, {{Key: "band", Value: "one"}}, {{Key: "band", Value: "high"}}},
		},
		{
			name: "$facet",
			in:   events(),
			pipeline: A{D{{Key: "$facet", Value: D{
				{Key: "count", Value: A{D{{Key: "$count", Value: "n"}}}},
				{Key: "top", Value: A{D{{Key: "$sort", Value: D{{Key: "value", Value: -1}}}}, D{{Key: "$limit", Value: 1}}, D{{Key: "$project", Value: D{{Key: "_id", Value: 1}}}}}},
			}}}},
			want: []D{{{Key: "count", Value: A{D{{Key: "n", Value: int32(20)}}}}, {Key: "top", Value: A{D{{Key: "_id", Value: int32(19)}}}}}},
		},
		{
			name:     "$bucketAuto: equal counts, equal values together, max is the next min",
			in:       []bson.D{{{Key: "v", Value: 5}}, {{Key: "v", Value: 1}}, {{Key: "v", Value: 2}}, {{Key: "v", Value: 2}}, {{Key: "v", Value: 3}}, {{Key: "v", Value: 9}}, {{Key: "v", Value: 7}}},
			pipeline: A{D{{Key: "$bucketAuto", Value: D{{Key: "groupBy", Value: "$v"}, {Key: "buckets", Value: 3}, {Key: "output", Value: D{{Key: "n", Value: D{{Key: "$sum", Value: 1}}}, {Key: "all", Value: D{{Key: "$push", Value: "$v"}}}}}}}}},
			want: []D{
				{{Key: "_id", Value: D{{Key: "min", Value: int32(1)}, {Key: "max", Value: int32(3)}}}, {Key: "n", Value: int32(3)}, {Key: "all", Value: A{int32(1), int32(2), int32(2)}}},
				{{Key: "_id", Value: D{{Key: "min", Value: int32(3)}, {Key: "max", Value: int32(7)}}}, {Key: "n", Value: int32(2)}, {Key: "all", Value: A{int32(3), int32(5)}}},
				{{Key: "_id", Value: D{{Key: "min", Value: int32(7)}, {Key: "max", Value: int32(9)}}}, {Key: "n", Value: int32(2)}, {Key: "all", Value: A{int32(7), int32(9)}}},
			},
		},
		{
			name:     "numbers group by value",
			in:       []bson.D{{{Key: "k", Value: int32(1)}}, {{Key: "k", Value: 1.0}}, {{Key: "k", Value: int64(1)}}, {{Key: "k", Value: nil}}, {}},
			pipeline: A{D{{Key: "$group", Value: D{{Key: "_id", Value: "$k"}, {Key: "n", Value: D{{Key: "$sum", Value: 1}}}}}}},
			want:     []D{{{Key: "_id", Value: int32(1)}, {Key: "n", Value: int32(3)}}, {{Key: "_id", Value: nil}, {Key: "n", Value: int32(2)}}},
		},
	} {
		t.Run(c.name, func(t *testing.T) { checkRun(t, c.in, c.pipeline, c.want) })
	}
}

func TestDoubleSum(t *testing.T) {
	got, err := run(t, []bson.D{{{Key: "v", Value: 0.1}}, {{Key: "v", Value: 0.2}}, {{Key: "v", Value: 0.3}}},
		A{D{{Key: "$group", Value: D{{Key: "_id", Value: nil}, {Key: "s", Value: D{{Key: "$sum", Value: "$v"}}}}}}})
	if err != nil {
		t.Fatal(err)
	}
	if s := got[0].Lookup("s").Double(); s != 0.6 {
		t.Fatalf("sum %v, want 0.6 (double-double; a naive loop gives 0.6000000000000001)", s)
	}
}

func TestRefusals(t *testing.T) {
	for _, c := range []struct {
		pipeline A
		code     mongoerr.Code
		names    string
	}{
		{A{D{{Key: "$lookup", Value: D{{Key: "from", Value: "x"}, {Key: "pipeline", Value: A{}}, {Key: "as", Value: "y"}}}}}, mongoerr.NotImplemented, "$lookup with pipeline"},
		{A{D{{Key: "$lookup", Value: D{{Key: "from", Value: "x"}, {Key: "localField", Value: "a"}, {Key: "foreignField", Value: "b"}, {Key: "as", Value: "y"}}}}}, mongoerr.NotImplemented, "$lookup"},
		{A{D{{Key: "$facet", Value: D{{Key: "a", Value: A{D{{Key: "$facet", Value: D{}}}}}}}}}, 40600, "within a $facet"},
		{A{D{{Key: "$project", Value: D{{Key: "x", Value: D{{Key: "$regexMatch", Value: D{}}}}}}}}, mongoerr.NotImplemented, `"$regexMatch"`},
		{A{D{{Key: "$project", Value: D{{Key: "x", Value: D{{Key: "$switch", Value: D{{Key: "branches", Value: A{}}}}}}}}}}, 40068, "at least one branch"},
		{A{D{{Key: "$group", Value: D{{Key: "_id", Value: nil}, {Key: "x", Value: D{{Key: "$stdDevPop", Value: "$v"}}}}}}}, mongoerr.NotImplemented, `"$stdDevPop"`},
		{A{D{{Key: "$project", Value: D{{Key: "a", Value: 1}, {Key: "b", Value: 0}}}}}, mongoerr.ProjectionMixed, "exclusion"},
		{A{D{{Key: "$group", Value: D{{Key: "n", Value: D{{Key: "$sum", Value: 1}}}}}}}, 15955, "_id"},
		{A{D{{Key: "$limit", Value: 0}}}, 15958, "positive"},
		{A{D{{Key: "$bucket", Value: D{{Key: "groupBy", Value: "$n"}, {Key: "boundaries", Value: A{3, 1}}}}}}, 40194, "ascending"},
		{A{D{{Key: "$bucket", Value: D{{Key: "groupBy", Value: "$n"}, {Key: "boundaries", Value: A{0, 5}}, {Key: "default", Value: 2}}}}}, 40199, "default"},
		{A{D{{Key: "$match", Value: D{{Key: "$expr", Value: D{{Key: "$regexMatch", Value: D{}}}}}}}}, mongoerr.NotImplemented, `"$regexMatch"`},
	} {
		_, err := run(t, nil, c.pipeline)
		if err == nil || mongoerr.CodeOf(err) != c.code || !strings.Contains(err.Error(), c.names) {
			t.Errorf("%v: %v, want code %d naming %s", c.pipeline, err, c.code, c.names)
		}
	}
}

func TestRunErrors(t *testing.T) {
	// $match matches an array field element-wise, as MongoDB does.
	if got, err := run(t, []bson.D{{{Key: "tags", Value: A{"a", "b"}}}, {{Key: "tags", Value: "c"}}}, A{D{{Key: "$project", Value: D{{Key: "_id", Value: 0}, {Key: "tags", Value: 1}}}}, D{{Key: "$match", Value: D{{Key: "tags", Value: "a"}}}}}); err != nil || len(got) != 1 || got[0].String() != `{"tags": ["a","b"]}` {
		t.Errorf("a $match on an array field: %v %v, want the document whose array holds the value", got, err)
	}
	if _, err := run(t, events(), A{D{{Key: "$project", Value: D{{Key: "x", Value: D{{Key: "$dateTrunc", Value: D{{Key: "date", Value: "$ts"}, {Key: "unit", Value: "hour"}, {Key: "binSize", Value: int64(1) << 62}}}}}}}}}); err == nil || !strings.Contains(err.Error(), "binSize") {
		t.Errorf("a binSize whose bin overflows: %v", err)
	}
	if _, err := run(t, events(), A{D{{Key: "$project", Value: D{{Key: "x", Value: D{{Key: "$divide", Value: A{1, 0}}}}}}}}); err == nil || !strings.Contains(err.Error(), "divide by zero") {
		t.Errorf("divide by zero: %v", err)
	}
	if _, err := run(t, events(), A{D{{Key: "$bucket", Value: D{{Key: "groupBy", Value: "$n"}, {Key: "boundaries", Value: A{0, 3}}}}}}); mongoerr.CodeOf(err) != mongoerr.NoBucketBranch {
		t.Errorf("$bucket without a default over a value outside: %v, want 40066", err)
	}
	var many []bson.D
	for i := 0; i < 20_000; i++ {
		many = append(many, bson.D{{Key: "k", Value: i}, {Key: "pad", Value: strings.Repeat("x", 50)}})
	}
	_, err := run(t, many, A{D{{Key: "$group", Value: D{{Key: "_id", Value: "$k"}, {Key: "all", Value: D{{Key: "$push", Value: "$pad"}}}}}}})
	if mongoerr.CodeOf(err) != mongoerr.QueryExceededMemoryLimit {
		t.Errorf("a $group past the budget: %v", err)
	}
	_, err = run(t, many, A{D{{Key: "$sort", Value: D{{Key: "k", Value: -1}}}}})
	if mongoerr.CodeOf(err) != mongoerr.QueryExceededMemoryLimit {
		t.Errorf("a $sort past the budget: %v", err)
	}
}

func TestDone(t *testing.T) {
	p, err := agg.Compile([]agg.Stage{{Name: "$limit", Value: bsoncore.Value{Type: bsoncore.TypeInt32, Data: bsoncore.AppendInt32(nil, 1)}}}, agg.Options{})
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := bson.Marshal(bson.D{{Key: "a", Value: 1}})
	if p.Done() {
		t.Fatal("done before any input")
	}
	_ = p.Push(raw)
	if !p.Done() {
		t.Fatal("not done after the limit")
	}
}

func TestSetWindowFields(t *testing.T) {
	var in []bson.D
	for _, e := range events() {
		if e[2].Value == "a" {
			in = append(in, e)
		}
	}
	slices.Reverse(in) // the stage sorts them
	got, err := run(t, in, A{D{{Key: "$setWindowFields", Value: D{
		{Key: "partitionBy", Value: "$sensor"},
		{Key: "sortBy", Value: D{{Key: "ts", Value: 1}}},
		{Key: "output", Value: D{
			{Key: "ma", Value: D{{Key: "$avg", Value: "$n"}, {Key: "window", Value: D{{Key: "documents", Value: A{-2, "current"}}}}}},
			{Key: "rs", Value: D{{Key: "$sum", Value: "$n"}, {Key: "window", Value: D{{Key: "range", Value: A{-20, 0}}, {Key: "unit", Value: "minute"}}}}},
			{Key: "top", Value: D{{Key: "$max", Value: "$n"}}},
			{Key: "n", Value: D{{Key: "$count", Value: D{}}, {Key: "window", Value: D{{Key: "documents", Value: A{"unbounded", "current"}}}}}},
		}},
	}}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 10 {
		t.Fatalf("%d documents, want 10", len(got))
	}
	for i, d := range got {
		var want []float64
		for j := max(i-2, 0); j <= i; j++ {
			want = append(want, float64(j))
		}
		var sum float64
		for _, w := range want {
			sum += w
		}
		rs := int32(0)
		for j := max(i-2, 0); j <= i; j++ {
			rs += int32(j)
		}
		if ts := d.Lookup("ts").Time(); !ts.Equal(t0.Add(time.Duration(i) * 10 * time.Minute)) {
			t.Fatalf("document %d: ts %v, out of order", i, ts)
		}
		if v := d.Lookup("ma").Double(); v != sum/float64(len(want)) {
			t.Errorf("document %d: moving average %v, want %v", i, v, sum/float64(len(want)))
		}
		if v := d.Lookup("rs").Int32(); v != rs {
			t.Errorf("document %d: range sum %v, want %v", i, v, rs)
		}
		if v := d.Lookup("top").Int32(); v != 9 {
			t.Errorf("document %d: partition max %v, want 9", i, v)
		}
		// The existing n is replaced in place by the running count.
		if keys := rawKeys(d); strings.Join(keys, ",") != "_id,ts,sensor,value,n,ma,rs,top" || d.Lookup("n").Int32() != int32(i+1) {
			t.Errorf("document %d: fields %v, n %v", i, keys, d.Lookup("n"))
		}
	}
	for _, bad := range []A{
		{D{{Key: "$setWindowFields", Value: D{{Key: "output", Value: D{{Key: "r", Value: D{{Key: "$rank", Value: D{}}}}}}}}}},
		{D{{Key: "$setWindowFields", Value: D{{Key: "output", Value: D{{Key: "s", Value: D{{Key: "$sum", Value: "$n"}, {Key: "window", Value: D{{Key: "documents", Value: A{-1, 0}}}}}}}}}}}},
	} {
		if _, err := run(t, in, bad); err == nil {
			t.Errorf("%v: ran, want a refusal", bad)
		}
	}
}

func rawKeys(d bson.Raw) []string {
	elems, _ := d.Elements()
	var out []string
	for _, e := range elems {
		out = append(out, e.Key())
	}
	return out
}

func TestReadOutput(t *testing.T) {
	for _, c := range []struct {
		stage string
		spec  any
		want  string // "" for an error
	}{
		{"$out", "hourly", "$out iot.hourly  "},
		{"$out", D{{Key: "db", Value: "other"}, {Key: "coll", Value: "h"}}, "$out other.h  "},
		{"$merge", "daily", "$merge iot.daily merge insert"},
		{"$merge", D{{Key: "into", Value: D{{Key: "db", Value: "x"}, {Key: "coll", Value: "y"}}}, {Key: "whenMatched", Value: "replace"}, {Key: "whenNotMatched", Value: "discard"}}, "$merge x.y replace discard"},
		{"$merge", D{{Key: "into", Value: "d"}, {Key: "on", Value: "sensor"}}, ""},
		{"$merge", D{{Key: "into", Value: "d"}, {Key: "whenMatched", Value: A{}}}, ""},
		{"$merge", D{{Key: "into", Value: "d"}, {Key: "whenNotMatched", Value: "fail"}}, ""},
		{"$out", 3, ""},
	} {
		raw, _ := bson.Marshal(bson.D{{Key: "v", Value: c.spec}})
		o, err := agg.ReadOutput(c.stage, bsoncore.Document(raw).Lookup("v"), "iot")
		got := ""
		if err == nil {
			got = o.Stage + " " + o.DB + "." + o.Coll + " " + o.WhenMatched + " " + o.WhenNotMatched
		}
		if got != c.want {
			t.Errorf("%s %v: %q (%v), want %q", c.stage, c.spec, got, err, c.want)
		}
	}
	o := &agg.Output{Stage: "$merge", WhenMatched: "merge", WhenNotMatched: "insert"}
	doc, _ := bson.Marshal(D{{Key: "_id", Value: "s1"}, {Key: "n", Value: 3}})
	if got := bson.Raw(o.MergeStatement(doc)).String(); got != `{"q": {"_id": "s1"},"u": {"$set": {"n": {"$numberInt":"3"}}},"upsert": true}` {
		t.Errorf("merge statement %s", got)
	}
	o.WhenMatched, o.WhenNotMatched = "replace", "discard"
	if got := bson.Raw(o.MergeStatement(doc)).String(); got != `{"q": {"_id": "s1"},"u": {"_id": "s1","n": {"$numberInt":"3"}},"upsert": false}` {
		t.Errorf("replace statement %s", got)
	}
	noID, _ := bson.Marshal(D{{Key: "n", Value: 1}})
	if withID := bson.Raw(agg.WithID(noID)); withID.Index(0).Key() != "_id" || withID.Lookup("n").Int32() != 1 {
		t.Errorf("WithID %s", withID)
	}
}

func TestDensifyAndFill(t *testing.T) {
	at := func(m int) bson.DateTime { return bson.NewDateTimeFromTime(t0.Add(time.Duration(m) * time.Minute)) }
	in := []bson.D{
		{{Key: "s", Value: "b"}, {Key: "ts", Value: at(1)}, {Key: "v", Value: 10.0}},
		{{Key: "s", Value: "a"}, {Key: "ts", Value: at(0)}, {Key: "v", Value: 1.0}},
		{{Key: "s", Value: "a"}, {Key: "ts", Value: at(3)}, {Key: "v", Value: 4.0}},
	}
	for _, c := range []struct {
		name     string
		pipeline A
		want     []D
	}{
		{
			name: "densify by minute over the full range, then fill linear and locf",
			pipeline: A{
				D{{Key: "$densify", Value: D{{Key: "field", Value: "ts"}, {Key: "partitionByFields", Value: A{"s"}}, {Key: "range", Value: D{{Key: "step", Value: 1}, {Key: "unit", Value: "minute"}, {Key: "bounds", Value: "full"}}}}}},
				D{{Key: "$fill", Value: D{{Key: "partitionByFields", Value: A{"s"}}, {Key: "sortBy", Value: D{{Key: "ts", Value: 1}}},
					{Key: "output", Value: D{{Key: "v", Value: D{{Key: "method", Value: "linear"}}}, {Key: "s", Value: D{{Key: "method", Value: "locf"}}}}}}}},
			},
			want: []D{
				{{Key: "s", Value: "a"}, {Key: "ts", Value: at(0)}, {Key: "v", Value: 1.0}},
				{{Key: "ts", Value: at(1)}, {Key: "s", Value: "a"}, {Key: "v", Value: 2.0}},
				{{Key: "ts", Value: at(2)}, {Key: "s", Value: "a"}, {Key: "v", Value: 3.0}},
				{{Key: "s", Value: "a"}, {Key: "ts", Value: at(3)}, {Key: "v", Value: 4.0}},
				{{Key: "ts", Value: at(0)}, {Key: "s", Value: "b"}, {Key: "v", Value: nil}},
				{{Key: "s", Value: "b"}, {Key: "ts", Value: at(1)}, {Key: "v", Value: 10.0}},
				{{Key: "ts", Value: at(2)}, {Key: "s", Value: "b"}, {Key: "v", Value: nil}},
				{{Key: "ts", Value: at(3)}, {Key: "s", Value: "b"}, {Key: "v", Value: nil}},
			},
		},
		{
			name: "densify within each partition's own range, fill a value",
			pipeline: A{
				D{{Key: "$densify", Value: D{{Key: "field", Value: "ts"}, {Key: "partitionByFields", Value: A{"s"}}, {Key: "range", Value: D{{Key: "step", Value: 2}, {Key: "unit", Value: "minute"}, {Key: "bounds", Value: "partition"}}}}}},
				D{{Key: "$fill", Value: D{{Key: "output", Value: D{{Key: "v", Value: D{{Key: "value", Value: 0}}}}}}}},
			},
			want: []D{
				{{Key: "s", Value: "a"}, {Key: "ts", Value: at(0)}, {Key: "v", Value: 1.0}},
				{{Key: "ts", Value: at(2)}, {Key: "s", Value: "a"}, {Key: "v", Value: int32(0)}},
				{{Key: "s", Value: "a"}, {Key: "ts", Value: at(3)}, {Key: "v", Value: 4.0}},
				{{Key: "s", Value: "b"}, {Key: "ts", Value: at(1)}, {Key: "v", Value: 10.0}},
			},
		},
		{
			name: "densify numbers between explicit bounds (the upper one excluded)",
			pipeline: A{
				D{{Key: "$project", Value: D{{Key: "_id", Value: 0}, {Key: "n", Value: D{{Key: "$minute", Value: "$ts"}}}}}},
				D{{Key: "$densify", Value: D{{Key: "field", Value: "n"}, {Key: "range", Value: D{{Key: "step", Value: 5}, {Key: "bounds", Value: A{0, 20}}}}}}},
			},
			want: []D{{{Key: "n", Value: int32(0)}}, {{Key: "n", Value: int32(5)}}, {{Key: "n", Value: int32(7)}}, {{Key: "n", Value: int32(8)}},
				{{Key: "n", Value: int32(10)}}, {{Key: "n", Value: int32(15)}}},
		},
	} {
		t.Run(c.name, func(t *testing.T) { checkRun(t, in, c.pipeline, c.want) })
	}
}

func TestWindowFunctions(t *testing.T) {
	at := func(m int) bson.DateTime { return bson.NewDateTimeFromTime(t0.Add(time.Duration(m) * time.Minute)) }
	// A counter read every 30 minutes: 0, 10, 10, 40; a tie in "g".
	in := []bson.D{
		{{Key: "ts", Value: at(60)}, {Key: "c", Value: int32(10)}, {Key: "g", Value: 1}},
		{{Key: "ts", Value: at(0)}, {Key: "c", Value: int32(0)}, {Key: "g", Value: 1}},
		{{Key: "ts", Value: at(90)}, {Key: "c", Value: int32(40)}, {Key: "g", Value: 2}},
		{{Key: "ts", Value: at(30)}, {Key: "c", Value: int32(10)}, {Key: "g", Value: 0}},
	}
	got, err := run(t, in, A{D{{Key: "$setWindowFields", Value: D{
		{Key: "sortBy", Value: D{{Key: "ts", Value: 1}}},
		{Key: "output", Value: D{
			{Key: "rate", Value: D{{Key: "$derivative", Value: D{{Key: "input", Value: "$c"}, {Key: "unit", Value: "hour"}}}, {Key: "window", Value: D{{Key: "documents", Value: A{-1, 0}}}}}},
			{Key: "area", Value: D{{Key: "$integral", Value: D{{Key: "input", Value: "$c"}, {Key: "unit", Value: "hour"}}}, {Key: "window", Value: D{{Key: "range", Value: A{-60, 0}}, {Key: "unit", Value: "minute"}}}}},
			{Key: "n", Value: D{{Key: "$documentNumber", Value: D{}}}},
			{Key: "prev", Value: D{{Key: "$shift", Value: D{{Key: "output", Value: "$c"}, {Key: "by", Value: -1}, {Key: "default", Value: "none"}}}}},
			{Key: "ema", Value: D{{Key: "$expMovingAvg", Value: D{{Key: "input", Value: "$c"}, {Key: "alpha", Value: 0.5}}}}},
		}},
	}}}})
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		rate any
		area float64
		n    int32
		prev any
		ema  float64
	}
	want := []row{
		{nil, 0, 1, "none", 0},
		{20.0, 2.5, 2, int32(0), 5},       // 10 per half hour; area of 0..10 over 0.5 h
		{0.0, 7.5, 3, int32(10), 7.5},     // window [-60, 0] minutes: (0+10)/2*0.5 + (10+10)/2*0.5
		{60.0, 17.5, 4, int32(10), 23.75}, // (10+10)/2*0.5 + (10+40)/2*0.5
	}
	for i, d := range got {
		w := want[i]
		if w.rate == nil {
			if d.Lookup("rate").Type != bson.TypeNull {
				t.Errorf("row %d: rate %v, want null", i, d.Lookup("rate"))
			}
		} else if d.Lookup("rate").Double() != w.rate.(float64) {
			t.Errorf("row %d: rate %v, want %v", i, d.Lookup("rate"), w.rate)
		}
		if d.Lookup("area").Double() != w.area || d.Lookup("n").Int32() != w.n || d.Lookup("ema").Double() != w.ema {
			t.Errorf("row %d: %s, want %+v", i, d, w)
		}
		wantPrev, _ := bson.Marshal(bson.D{{Key: "prev", Value: w.prev}})
		if !d.Lookup("prev").Equal(bson.Raw(wantPrev).Lookup("prev")) {
			t.Errorf("row %d: prev %v, want %v", i, d.Lookup("prev"), w.prev)
		}
	}
	ranks, err := run(t, in, A{D{{Key: "$setWindowFields", Value: D{{Key: "sortBy", Value: D{{Key: "g", Value: 1}}},
		{Key: "output", Value: D{{Key: "r", Value: D{{Key: "$rank", Value: D{}}}}, {Key: "d", Value: D{{Key: "$denseRank", Value: D{}}}}}}}}}})
	if err != nil {
		t.Fatal(err)
	}
	var got2 []string
	for _, d := range ranks {
		got2 = append(got2, fmt.Sprintf("%d/%d/%d", d.Lookup("g").Int32(), d.Lookup("r").Int32(), d.Lookup("d").Int32()))
	}
	if strings.Join(got2, " ") != `0/1/1 1/2/2 1/2/2 2/4/3` {
		t.Errorf("ranks %v", got2)
	}
}

func TestLookup(t *testing.T) {
	sensors := marshalAll(t, []D{
		{{Key: "_id", Value: "a"}, {Key: "site", Value: "north"}},
		{{Key: "_id", Value: "b"}, {Key: "site", Value: "south"}},
		{{Key: "_id", Value: "c"}, {Key: "site", Value: "east"}},
		{{Key: "site", Value: "unknown"}},
	})
	f := &agg.Foreign{Docs: map[string][]bsoncore.Document{}}
	for _, d := range sensors {
		f.Docs["sensors"] = append(f.Docs["sensors"], bsoncore.Document(d))
	}
	in := []bson.D{
		{{Key: "s", Value: "b"}}, {{Key: "s", Value: A{"a", "c"}}}, {{Key: "s", Value: "z"}}, {},
	}
	raw, _ := bson.Marshal(D{{Key: "$lookup", Value: D{{Key: "from", Value: "sensors"}, {Key: "localField", Value: "s"}, {Key: "foreignField", Value: "_id"}, {Key: "as", Value: "m"}}}})
	e, _ := bsoncore.Document(raw).IndexErr(0)
	p, err := agg.Compile([]agg.Stage{{Name: e.Key(), Value: e.Value()}}, agg.Options{Foreign: f})
	if err != nil {
		t.Fatal(err)
	}
	if got := agg.ForeignCollections([]agg.Stage{{Name: e.Key(), Value: e.Value()}}); len(got) != 1 || got[0] != "sensors" {
		t.Fatalf("foreign collections %v", got)
	}
	for _, d := range marshalAll(t, in) {
		if err := p.Push(bsoncore.Document(d)); err != nil {
			t.Fatal(err)
		}
	}
	out, err := p.Finish()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"south", "north,east", "", "unknown"} // a missing field matches a missing one
	for i, d := range out {
		vals, _ := bsoncore.Document(d).Lookup("m").Array().Values()
		var sites []string
		for _, v := range vals {
			sites = append(sites, v.Document().Lookup("site").StringValue())
		}
		if strings.Join(sites, ",") != want[i] {
			t.Errorf("document %d joined %v, want %s", i, sites, want[i])
		}
	}
}
