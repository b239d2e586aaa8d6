package summary

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/tsproxy/tsproxy/rewrite/read"

	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"

	"github.com/tsproxy/tsproxy/rewrite/bucket"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

func sumRule() *rules.Rule {
	r := rwtest.Rule()
	r.Aggregates = []string{"v", "w"}
	return r
}

func sumCmd(t testing.TB, pipeline A, extra ...E) []byte {
	t.Helper()
	cmd := D{{Key: "aggregate", Value: "readings"}, {Key: "pipeline", Value: pipeline}, {Key: "cursor", Value: D{}}}
	cmd = append(cmd, extra...)
	return rwtest.Doc(t, append(cmd, E{Key: "$db", Value: "iot"}))
}

func trunc(unit string, more ...E) D {
	return D{{Key: "$dateTrunc", Value: append(D{{Key: "date", Value: "$ts"}, {Key: "unit", Value: unit}}, more...)}}
}

func grp(id any, accs ...E) D {
	return D{{Key: "$group", Value: append(D{{Key: "_id", Value: id}}, accs...)}}
}

func acc(out, op string, arg any) E { return E{Key: out, Value: D{{Key: op, Value: arg}}} }

func TestPlanSummaryShapes(t *testing.T) {
	day := time.Date(2026, 1, 5, 0, 0, 0, 0, time.UTC).UnixMilli()
	match := func(f D) D { return D{{Key: "$match", Value: f}} }
	rng := func(lo, hi int64) D {
		return D{{Key: "ts", Value: D{{Key: "$gte", Value: rwtest.DT(lo)}, {Key: "$lt", Value: rwtest.DT(hi)}}}}
	}
	hourSum := grp(trunc("hour"), acc("s", "$sum", "$v"))
	cases := []struct {
		name     string
		pipeline A
		extra    []E
		ok       bool
	}{
		{"hour windows, sum", A{hourSum}, nil, true},
		{"day windows, all accumulators", A{grp(trunc("day"), acc("s", "$sum", "$v"), acc("n", "$sum", 1), acc("c", "$count", D{}), acc("lo", "$min", "$v"), acc("hi", "$max", "$w"), acc("first", "$min", "$ts"))}, nil, true},
		{"range on span edges", A{match(rng(day, day+24*rwtest.Hour)), hourSum}, nil, true},
		{"range and meta", A{match(append(rng(day, day+rwtest.Hour), E{Key: "sensorId", Value: "s1"})), hourSum}, nil, true},
		{"meta $in", A{match(D{{Key: "sensorId", Value: D{{Key: "$in", Value: A{"a", "b"}}}}}), hourSum}, nil, true},
		{"compound id with meta", A{grp(D{{Key: "t", Value: trunc("hour")}, {Key: "s", Value: "$sensorId"}}, acc("s", "$sum", "$v"))}, nil, true},
		{"meta id", A{grp("$sensorId", acc("s", "$max", "$v"))}, nil, true},
		{"null id", A{grp(nil, acc("s", "$sum", "$v"))}, nil, true},
		{"2-hour bins", A{grp(trunc("hour", E{Key: "binSize", Value: 2}), acc("s", "$sum", "$v"))}, nil, true},
		{"week from monday", A{grp(trunc("week", E{Key: "startOfWeek", Value: "mon"}), acc("s", "$sum", "$v"))}, nil, true},
		{"month, UTC", A{grp(trunc("month", E{Key: "timezone", Value: "UTC"}), acc("s", "$sum", "$v"))}, nil, true},
		{"then sort, skip, limit", A{hourSum, D{{Key: "$sort", Value: D{{Key: "s", Value: -1}, {Key: "_id", Value: 1}}}}, D{{Key: "$skip", Value: 1}}, D{{Key: "$limit", Value: 3}}}, nil, true},
		{"comment and batchSize", A{hourSum}, []E{{Key: "comment", Value: "x"}, {Key: "cursor", Value: D{{Key: "batchSize", Value: 10}}}}, true},

		{"minute windows: finer than the span", A{grp(trunc("minute"), acc("s", "$sum", "$v"))}, nil, false},
		{"90-minute bins", A{grp(trunc("minute", E{Key: "binSize", Value: 90}), acc("s", "$sum", "$v"))}, nil, false},
		{"other timezone", A{grp(trunc("day", E{Key: "timezone", Value: "Europe/Paris"}), acc("s", "$sum", "$v"))}, nil, false},
		{"range cuts a bucket", A{match(rng(day+1000, day+rwtest.Hour)), hourSum}, nil, false},
		{"$gt bound", A{match(D{{Key: "ts", Value: D{{Key: "$gt", Value: rwtest.DT(day)}}}}), hourSum}, nil, false},
		{"event field filter", A{match(D{{Key: "v", Value: 3}}), hourSum}, nil, false},
		{"$avg", A{grp(trunc("hour"), acc("a", "$avg", "$v"), acc("b", "$avg", "$w"))}, nil, true},
		{"$bucket by time on window edges, default, output", A{bucketStage(D{{Key: "default", Value: "other"}, {Key: "output", Value: D{acc("a", "$avg", "$v"), acc("n", "$count", D{})}}}, day, day+rwtest.Hour, day+24*rwtest.Hour)}, nil, true},
		{"$bucket without output, then sort and limit", A{match(rng(day, day+24*rwtest.Hour)), bucketStage(nil, day, day+24*rwtest.Hour), D{{Key: "$sort", Value: D{{Key: "count", Value: -1}}}}, D{{Key: "$limit", Value: 1}}}, nil, true},
		{"$bucket with a date default past the last edge", A{bucketStage(D{{Key: "default", Value: rwtest.DT(day + 24*rwtest.Hour)}}, day, day+24*rwtest.Hour)}, nil, true},
		{"$bucket: an edge inside a bucket", A{bucketStage(nil, day, day+rwtest.Hour+1)}, nil, false},
		{"$bucket: one edge", A{bucketStage(nil, day)}, nil, false},
		{"$bucket: edges not ascending", A{bucketStage(nil, day+rwtest.Hour, day)}, nil, false},
		{"$bucket: number edges", A{D{{Key: "$bucket", Value: D{{Key: "groupBy", Value: "$ts"}, {Key: "boundaries", Value: A{1, 2}}}}}}, nil, false},
		{"$bucket: default inside the edges", A{bucketStage(D{{Key: "default", Value: rwtest.DT(day + rwtest.Hour)}}, day, day+24*rwtest.Hour)}, nil, false},
		{"$bucket: default a field path", A{bucketStage(D{{Key: "default", Value: "$v"}}, day, day+rwtest.Hour)}, nil, false},
		{"$bucket: by another field", A{D{{Key: "$bucket", Value: D{{Key: "groupBy", Value: "$v"}, {Key: "boundaries", Value: A{rwtest.DT(day), rwtest.DT(day + rwtest.Hour)}}}}}}, nil, false},
		{"$bucket: an unknown option", A{bucketStage(D{{Key: "granularity", Value: "R5"}}, day, day+rwtest.Hour)}, nil, false},
		{"$bucket: an output not from summaries", A{bucketStage(D{{Key: "output", Value: D{acc("f", "$first", "$v")}}}, day, day+rwtest.Hour)}, nil, false},
		{"$avg of the time", A{grp(trunc("hour"), acc("a", "$avg", "$ts"))}, nil, false},
		{"$avg of an expression", A{grp(trunc("hour"), acc("a", "$avg", D{{Key: "$multiply", Value: A{"$v", 2}}}))}, nil, false},
		{"not an aggregate field", A{grp(trunc("hour"), acc("s", "$sum", "$x"))}, nil, false},
		{"$sum of 2", A{grp(trunc("hour"), acc("s", "$sum", 2))}, nil, false},
		{"sum of the time", A{grp(trunc("hour"), acc("s", "$sum", "$ts"))}, nil, false},
		{"dotted output", A{grp(trunc("hour"), acc("a.b", "$sum", "$v"))}, nil, false},
		{"group on another field", A{grp("$v", acc("s", "$sum", "$v"))}, nil, false},
		{"trunc of another date", A{grp(D{{Key: "$dateTrunc", Value: D{{Key: "date", Value: "$other"}, {Key: "unit", Value: "hour"}}}}, acc("s", "$sum", "$v"))}, nil, false},
		{"stage after the group", A{hourSum, D{{Key: "$project", Value: D{{Key: "s", Value: 1}}}}}, nil, false},
		{"sort on a missing output", A{hourSum, D{{Key: "$sort", Value: D{{Key: "zz", Value: 1}}}}}, nil, false},
		{"no group", A{match(rng(day, day+rwtest.Hour))}, nil, false},
		{"explain", A{hourSum}, []E{{Key: "explain", Value: true}}, false},
		{"collation", A{hourSum}, []E{{Key: "collation", Value: D{{Key: "locale", Value: "fr"}}}}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, ok := PlanAggregation(sumCmd(t, c.pipeline, c.extra...), sumRule(), read.Options{})
			if ok != c.ok {
				t.Fatalf("accepted %v, want %v", ok, c.ok)
			}
			if ok && !strings.HasPrefix(rwtest.JSON(p.Command), `{"find": "readings.buckets"`) {
				t.Fatalf("command %s", rwtest.JSON(p.Command))
			}
		})
	}
	// Not an events rule, or no rule aggregates: never.
	r := sumRule()
	r.Layout = rules.LayoutCounter
	if _, ok := PlanAggregation(sumCmd(t, A{hourSum}), r, read.Options{}); ok {
		t.Fatal("counter layout accepted")
	}
}

// bucketStage is {$bucket: {groupBy: "$ts", boundaries: edges, more...}}.
func bucketStage(more D, edges ...int64) D {
	b := A{}
	for _, e := range edges {
		b = append(b, rwtest.DT(e))
	}
	return D{{Key: "$bucket", Value: append(D{{Key: "groupBy", Value: "$ts"}, {Key: "boundaries", Value: b}}, more...)}}
}

func TestSummaryFindCommand(t *testing.T) {
	day := time.Date(2026, 1, 5, 0, 0, 0, 0, time.UTC).UnixMilli()
	f := D{{Key: "ts", Value: D{{Key: "$gte", Value: rwtest.DT(day)}, {Key: "$lt", Value: rwtest.DT(day + 2*rwtest.Hour)}}}, {Key: "sensorId", Value: "s1"}}
	p, ok := PlanAggregation(sumCmd(t, A{D{{Key: "$match", Value: f}}, grp(trunc("hour"), acc("s", "$sum", "$v"))}, E{Key: "maxTimeMS", Value: 500}), sumRule(), read.Options{})
	if !ok {
		t.Fatal("refused")
	}
	want := `{"find": "readings.buckets","filter": {"start": {"$gte": {"$date":{"$numberLong":"1767571200000"}},"$lt": {"$date":{"$numberLong":"1767578400000"}}},"meta": "s1"},"projection": {"meta": {"$numberInt":"1"},"start": {"$numberInt":"1"},"count": {"$numberInt":"1"},"min": {"$numberInt":"1"},"max": {"$numberInt":"1"},"sum": {"$numberInt":"1"},"counted": {"$numberInt":"1"},"mixed": {"$numberInt":"1"},"summed": {"$numberInt":"1"},"counts": {"$numberInt":"1"},"lowBit": {"$numberInt":"1"}},"maxTimeMS": {"$numberInt":"500"},"$db": "iot"}`
	if got := rwtest.JSON(p.Command); got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}

// TestSummaryBucketOutside: an event outside the boundaries without a
// default is MongoDB's error, not a silently dropped bucket.
func TestSummaryBucketOutside(t *testing.T) {
	h := time.Date(2026, 1, 5, 0, 0, 0, 0, time.UTC).UnixMilli()
	mm := D{{Key: "ts", Value: rwtest.DT(h + 2*rwtest.Hour)}}
	_, _, err := runSummaryErr(t, A{bucketStage(nil, h, h+rwtest.Hour)}, A{bkt("a", h+2*rwtest.Hour, 1, mm, mm, nil)})
	var ce *mongoerr.Error
	if !errors.As(err, &ce) || ce.Code != 40066 || !strings.Contains(ce.Msg, "no default was specified") {
		t.Fatalf("got %v", err)
	}
	// An emptied bucket (count 0) outside is no event: no error.
	out, ok, err := runSummaryErr(t, A{bucketStage(nil, h, h+rwtest.Hour)}, A{bkt("a", h+2*rwtest.Hour, 0, D{}, D{}, nil)})
	if err != nil || !ok || out != "" {
		t.Fatalf("got %q %v %v", out, ok, err)
	}
}

func TestDateTruncWindow(t *testing.T) {
	at := func(y int, m time.Month, d, h int) int64 { return time.Date(y, m, d, h, 0, 0, 0, time.UTC).UnixMilli() }
	ts := time.Date(2026, 11, 22, 3, 25, 7, 0, time.UTC).UnixMilli() // a Sunday
	cases := []struct {
		spec D
		want int64
	}{
		{D{{Key: "unit", Value: "hour"}}, at(2026, 11, 22, 3)},
		{D{{Key: "unit", Value: "hour"}, {Key: "binSize", Value: 2}}, at(2026, 11, 22, 2)},
		{D{{Key: "unit", Value: "day"}}, at(2026, 11, 22, 0)},
		{D{{Key: "unit", Value: "day"}, {Key: "binSize", Value: 7}}, at(2026, 11, 21, 0)}, // 7-day bins from 2000-01-01, a Saturday
		{D{{Key: "unit", Value: "week"}}, at(2026, 11, 22, 0)},
		{D{{Key: "unit", Value: "week"}, {Key: "startOfWeek", Value: "Monday"}}, at(2026, 11, 16, 0)},
		{D{{Key: "unit", Value: "month"}}, at(2026, 11, 1, 0)},
		{D{{Key: "unit", Value: "month"}, {Key: "binSize", Value: 5}}, at(2026, 9, 1, 0)}, // 2000-01 + 64*5 months
		{D{{Key: "unit", Value: "quarter"}}, at(2026, 10, 1, 0)},
		{D{{Key: "unit", Value: "year"}}, at(2026, 1, 1, 0)},
		{D{{Key: "unit", Value: "year"}, {Key: "binSize", Value: 4}}, at(2024, 1, 1, 0)},
	}
	for _, c := range cases {
		spec := append(D{{Key: "date", Value: "$ts"}}, c.spec...)
		dt, ok := parseDateTrunc(valueOf(t, spec), "ts")
		if !ok {
			t.Fatalf("%v refused", c.spec)
		}
		if got, _ := dt.window(ts); got != c.want {
			t.Errorf("%v: %v, want %v", c.spec, time.UnixMilli(got).UTC(), time.UnixMilli(c.want).UTC())
		}
	}
	// Before 1970 and before 2000.
	dt, _ := parseDateTrunc(valueOf(t, D{{Key: "date", Value: "$ts"}, {Key: "unit", Value: "month"}, {Key: "binSize", Value: 5}}), "ts")
	if got, _ := dt.window(at(1960, 3, 9, 5)); got != at(1960, 1, 1, 0) {
		t.Errorf("1960: %v", time.UnixMilli(got).UTC())
	}
}

func valueOf(t testing.TB, d D) bsoncore.Value {
	return bsoncore.Value{Type: bsoncore.TypeEmbeddedDocument, Data: rwtest.Doc(t, d)}
}

// bkt is a bucket as the summary find returns it.
func bkt(meta any, start int64, count int32, min, max, sum D) D {
	d := D{{Key: "_id", Value: bson.NewObjectID()}, {Key: "meta", Value: meta}, {Key: "start", Value: rwtest.DT(start)}, {Key: "count", Value: count}}
	d = append(d, E{Key: "min", Value: min}, E{Key: "max", Value: max})
	if sum != nil {
		d = append(d, E{Key: "sum", Value: sum})
	}
	return d
}

// counted makes b a bucket written with counts: counted as its count,
// and counts and lowBit of v from the values given (the events' values of
// v, none when the events lack it).
func counted(t testing.TB, b D, vals ...any) D {
	t.Helper()
	var n int32
	var low int32 = bucket.LowBitZero
	for _, v := range vals {
		n++
		raw, err := bson.Marshal(D{{Key: "v", Value: v}})
		if err != nil {
			t.Fatal(err)
		}
		low = min(low, bucket.LowBitOf(bsoncore.Document(raw).Lookup("v")))
	}
	b = append(b, E{Key: "counted", Value: b[3].Value})
	if n > 0 {
		b = append(b, E{Key: "counts", Value: D{{Key: "v", Value: n}}}, E{Key: "lowBit", Value: D{{Key: "v", Value: low}}})
	}
	return b
}

func runSummary(t *testing.T, pipeline A, batches ...A) (string, bool) {
	t.Helper()
	out, ok, err := runSummaryErr(t, pipeline, batches...)
	if err != nil {
		t.Fatal(err)
	}
	return out, ok
}

func runSummaryErr(t *testing.T, pipeline A, batches ...A) (string, bool, error) {
	t.Helper()
	p, ok := PlanAggregation(sumCmd(t, pipeline), sumRule(), read.Options{})
	if !ok {
		t.Fatal("refused")
	}
	for i, b := range batches {
		id := int64(0)
		if i < len(batches)-1 {
			id = 42
		}
		next, err := p.Feed(rwtest.Doc(t, D{{Key: "cursor", Value: D{{Key: "firstBatch", Value: b}, {Key: "id", Value: id}}}, {Key: "ok", Value: 1.0}}))
		if err != nil {
			t.Fatal(err)
		}
		if (next != nil) != (id != 0) || (next != nil && !strings.Contains(rwtest.JSON(next), `"getMore": {"$numberLong":"42"},"collection": "readings.buckets"`)) {
			t.Fatalf("next %s", rwtest.JSON(next))
		}
	}
	out, ok, err := p.Result()
	if err != nil || !ok {
		return "", false, err
	}
	cur, _ := bsoncore.Document(out).LookupErr("cursor", "firstBatch")
	docs, _ := cur.Array().Values()
	var parts []string
	for _, d := range docs {
		parts = append(parts, rwtest.JSON(d.Document()))
	}
	return strings.Join(parts, " "), true, nil
}

func TestSummaryCompute(t *testing.T) {
	h := func(i int64) int64 { return time.Date(2026, 1, 5, 0, 0, 0, 0, time.UTC).UnixMilli() + i*rwtest.Hour }
	tsd := func(i int64) bson.DateTime { return rwtest.DT(h(i)) }
	mm := func(i int64, v any) D { return D{{Key: "ts", Value: tsd(i)}, {Key: "v", Value: v}} }
	sumV := func(v any) D { return D{{Key: "v", Value: v}} }
	all := A{grp(trunc("day"), acc("s", "$sum", "$v"), acc("n", "$count", D{}), acc("lo", "$min", "$v"), acc("hi", "$max", "$v"), acc("w", "$sum", "$w"), acc("wl", "$min", "$w"))}
	sumOnly := A{grp(nil, acc("s", "$sum", "$v"))}
	cases := []struct {
		name     string
		pipeline A
		buckets  []A
		want     string // "" with ok false: the summaries are not exact
	}{
		{"int32 sums over hours of one day; missing w gives 0 and null", all,
			[]A{{bkt("a", h(0), 3, mm(0, int32(1)), mm(0, int32(5)), sumV(int32(9))), bkt("b", h(1), 2, mm(1, int32(-2)), mm(1, int32(4)), sumV(int32(2)))}},
			`{"_id": {"$date":{"$numberLong":"1767571200000"}},"s": {"$numberInt":"11"},"n": {"$numberInt":"5"},"lo": {"$numberInt":"-2"},"hi": {"$numberInt":"5"},"w": {"$numberInt":"0"},"wl": null}`},
		{"two days, two batches, sorted by _id", A{grp(trunc("day"), acc("n", "$sum", 1))},
			[]A{{bkt("a", h(25), 4, mm(25, 1), mm(25, 1), nil)}, {bkt("a", h(2), 3, mm(2, 1), mm(2, 1), nil), bkt("a", h(30), 0, D{}, D{}, nil)}},
			`{"_id": {"$date":{"$numberLong":"1767571200000"}},"n": {"$numberInt":"3"}} {"_id": {"$date":{"$numberLong":"1767657600000"}},"n": {"$numberInt":"4"}}`},
		{"int32 total past int32 is an int64", sumOnly,
			[]A{{bkt("a", h(0), 1, mm(0, int32(2e9)), mm(0, int32(2e9)), sumV(int32(2e9))), bkt("a", h(1), 1, mm(1, int32(2e9)), mm(1, int32(2e9)), sumV(int32(2e9)))}},
			`{"_id": null,"s": {"$numberLong":"4000000000"}}`},
		{"an int64 event makes an int64 even when small", sumOnly,
			[]A{{bkt("a", h(0), 2, mm(0, int64(1)), mm(0, int32(3)), sumV(int64(4)))}},
			`{"_id": null,"s": {"$numberLong":"4"}}`},
		{"an int64 sum that may be overflowed int32s, small total: not exact", sumOnly,
			[]A{{bkt("a", h(0), 3, mm(0, int32(-2e9)), mm(0, int32(2e9)), sumV(int64(10)))}},
			""},
		{"int64 total past int64 is a double", sumOnly,
			[]A{{bkt("a", h(0), 1, mm(0, int64(4e18)), mm(0, int64(4e18)), sumV(int64(4e18))), bkt("a", h(1), 1, mm(1, int64(4e18)), mm(1, int64(4e18)), sumV(int64(4e18))), bkt("a", h(2), 1, mm(2, int64(4e18)), mm(2, int64(4e18)), sumV(int64(4e18)))}},
			`{"_id": null,"s": {"$numberDouble":"1.2E+19"}}`},
		{"a bucket holding a non-number in an aggregate field: answered from the events", sumOnly,
			[]A{{append(counted(t, bkt("a", h(0), 2, mm(0, int32(4)), mm(0, int32(4)), sumV(int32(4))), int32(4)), E{Key: "mixed", Value: D{{Key: "v", Value: true}}})}},
			""},
		{"an int32 sum that may have wrapped (FerretDB's $inc): not exact", sumOnly,
			[]A{{bkt("a", h(0), 2, mm(0, int32(2e9)), mm(0, int32(2e9)), sumV(int32(-294967296)))}},
			""},
		{"an int64 sum near the int64 range: not exact", sumOnly,
			[]A{{bkt("a", h(0), 2, mm(0, int64(math.MaxInt64)), mm(0, int64(math.MaxInt64)), sumV(int64(-2)))}},
			""},
		{"a double makes a double", sumOnly,
			[]A{{counted(t, bkt("a", h(0), 1, mm(0, 0.5), mm(0, 0.5), sumV(0.5)), 0.5), counted(t, bkt("a", h(1), 1, mm(1, int32(2)), mm(1, int32(2)), sumV(int32(2))), int32(2))}},
			`{"_id": null,"s": {"$numberDouble":"2.5"}}`},
		{"a double sum of a bucket without lowBit (older format): not exact", sumOnly,
			[]A{{bkt("a", h(0), 1, mm(0, 0.5), mm(0, 0.5), sumV(0.5))}}, ""},
		{"doubles whose sum may round (0.1 + 0.2): not exact", sumOnly,
			[]A{{counted(t, bkt("a", h(0), 2, mm(0, 0.1), mm(0, 0.2), sumV(0.1+0.2)), 0.1, 0.2)}}, ""},
		{"doubles on a coarse grid far from 2^53 of it: exact", sumOnly,
			[]A{{counted(t, bkt("a", h(0), 2, mm(0, 21.25), mm(0, 1e6+0.5), sumV(1e6+21.75)), 21.25, 1e6+0.5), counted(t, bkt("a", h(1), 1, mm(1, -3.125), mm(1, -3.125), sumV(-3.125)), -3.125)}},
			`{"_id": null,"s": {"$numberDouble":"1.000018625E+06"}}`},
		{"a double sum past the int32 range: an int32 sum may have wrapped before a double joined it", sumOnly,
			[]A{{counted(t, bkt("a", h(0), 2, mm(0, 0.5), mm(0, int32(2e9)), sumV(2e9+0.5)), 0.5, int32(2e9))}}, ""},
		{"a NaN: not exact", sumOnly,
			[]A{{counted(t, bkt("a", h(0), 1, mm(0, math.NaN()), mm(0, math.NaN()), sumV(math.NaN())), math.NaN())}}, ""},
		{"$avg of ints, events without the field not counted", A{grp(nil, acc("a", "$avg", "$v"), acc("n", "$count", D{}))},
			[]A{{counted(t, bkt("a", h(0), 3, mm(0, int32(1)), mm(0, int32(5)), sumV(int32(6))), int32(1), int32(5)), counted(t, bkt("a", h(1), 2, mm(1, 1), mm(1, 1), nil))}},
			`{"_id": null,"a": {"$numberDouble":"3.0"},"n": {"$numberInt":"5"}}`},
		{"$avg of doubles and ints per day", A{grp(trunc("day"), acc("a", "$avg", "$v"))},
			[]A{{counted(t, bkt("a", h(0), 2, mm(0, 0.5), mm(0, int32(2)), sumV(2.5)), 0.5, int32(2)), counted(t, bkt("b", h(25), 1, mm(25, int64(7)), mm(25, int64(7)), sumV(int64(7))), int64(7))}},
			`{"_id": {"$date":{"$numberLong":"1767571200000"}},"a": {"$numberDouble":"1.25"}} {"_id": {"$date":{"$numberLong":"1767657600000"}},"a": {"$numberDouble":"7.0"}}`},
		{"$avg with no numeric value is null", A{grp(nil, acc("a", "$avg", "$v"))},
			[]A{{counted(t, bkt("a", h(0), 2, mm(0, 1), mm(0, 1), nil))}},
			`{"_id": null,"a": null}`},
		{"$avg over a bucket without counts (older format): not exact", A{grp(nil, acc("a", "$avg", "$v"))},
			[]A{{bkt("a", h(0), 1, mm(0, int32(4)), mm(0, int32(4)), sumV(int32(4)))}}, ""},
		{"$avg over an older bucket that newer upserts joined (counted < count): not exact", A{grp(nil, acc("a", "$avg", "$v"))},
			[]A{{append(bkt("a", h(0), 3, mm(0, int32(4)), mm(0, int32(4)), sumV(int32(12))), E{Key: "counted", Value: int32(1)}, E{Key: "counts", Value: D{{Key: "v", Value: int32(1)}}}, E{Key: "lowBit", Value: D{{Key: "v", Value: int32(2)}}})}}, ""},
		{"$avg of an older bucket without the field: not exact", A{grp(nil, acc("a", "$avg", "$v"))},
			[]A{{bkt("a", h(0), 1, mm(0, 1), mm(0, 1), nil)}}, ""},
		{"$avg of 1/10ths: not exact", A{grp(nil, acc("a", "$avg", "$v"))},
			[]A{{counted(t, bkt("a", h(0), 2, mm(0, 0.1), mm(0, 0.2), sumV(0.1+0.2)), 0.1, 0.2)}}, ""},
		{"$bucket, default count, default _id first in _id order", A{bucketStage(D{{Key: "default", Value: "other"}}, h(0), h(2), h(4))},
			[]A{{bkt("a", h(0), 2, mm(0, 1), mm(0, 1), nil), bkt("b", h(1), 3, mm(1, 1), mm(1, 1), nil), bkt("a", h(3), 1, mm(3, 1), mm(3, 1), nil), bkt("a", h(7), 4, mm(7, 1), mm(7, 1), nil), bkt("a", h(-1), 5, mm(-1, 1), mm(-1, 1), nil)}},
			`{"_id": "other","count": {"$numberInt":"9"}} {"_id": {"$date":{"$numberLong":"1767571200000"}},"count": {"$numberInt":"5"}} {"_id": {"$date":{"$numberLong":"1767578400000"}},"count": {"$numberInt":"1"}}`},
		{"$bucket with output", A{bucketStage(D{{Key: "output", Value: D{acc("a", "$avg", "$v"), acc("s", "$sum", "$v"), acc("hi", "$max", "$v")}}}, h(0), h(24))},
			[]A{{counted(t, bkt("a", h(0), 2, mm(0, int32(1)), mm(0, int32(2)), sumV(int32(3))), int32(1), int32(2)), counted(t, bkt("b", h(5), 1, mm(5, int32(9)), mm(5, int32(9)), sumV(int32(9))), int32(9))}},
			`{"_id": {"$date":{"$numberLong":"1767571200000"}},"a": {"$numberDouble":"4.0"},"s": {"$numberInt":"12"},"hi": {"$numberInt":"9"}}`},
		{"count types follow the constant", A{grp(nil, acc("i", "$sum", int32(1)), acc("l", "$sum", int64(1)), acc("d", "$sum", 1.0))},
			[]A{{bkt("a", h(0), 3, mm(0, 1), mm(0, 1), nil)}},
			`{"_id": null,"i": {"$numberInt":"3"},"l": {"$numberLong":"3"},"d": {"$numberDouble":"3.0"}}`},
		{"min and max of the time", A{grp("$sensorId", acc("first", "$min", "$ts"), acc("last", "$max", "$ts"))},
			[]A{{bkt("a", h(3), 1, mm(3, 1), mm(4, 1), nil), bkt("a", h(1), 1, mm(1, 1), mm(2, 1), nil), bkt(nil, h(1), 1, mm(1, 1), mm(1, 1), nil)}},
			`{"_id": null,"first": {"$date":{"$numberLong":"1767574800000"}},"last": {"$date":{"$numberLong":"1767574800000"}}} {"_id": "a","first": {"$date":{"$numberLong":"1767574800000"}},"last": {"$date":{"$numberLong":"1767585600000"}}}`},
		{"named parts, sort by sum descending, limit", A{grp(D{{Key: "s", Value: "$sensorId"}, {Key: "t", Value: trunc("hour")}}, acc("sum", "$sum", "$v")), D{{Key: "$sort", Value: D{{Key: "sum", Value: -1}}}}, D{{Key: "$limit", Value: 2}}},
			[]A{{bkt("a", h(0), 1, mm(0, 1), mm(0, 1), sumV(int32(1))), bkt("b", h(0), 1, mm(0, 1), mm(0, 1), sumV(int32(7))), bkt("a", h(1), 1, mm(1, 1), mm(1, 1), sumV(int32(3)))}},
			`{"_id": {"s": "b","t": {"$date":{"$numberLong":"1767571200000"}}},"sum": {"$numberInt":"7"}} {"_id": {"s": "a","t": {"$date":{"$numberLong":"1767574800000"}}},"sum": {"$numberInt":"3"}}`},
		{"named meta part with a null meta (missing or null?): not exact", A{grp(D{{Key: "s", Value: "$sensorId"}}, acc("n", "$count", D{}))},
			[]A{{bkt(nil, h(0), 1, mm(0, 1), mm(0, 1), nil)}}, ""},
		{"metas 1 and 1.0 are one group: not exact", A{grp("$sensorId", acc("n", "$count", D{}))},
			[]A{{bkt(int32(1), h(0), 1, mm(0, 1), mm(0, 1), nil), bkt(1.0, h(0), 1, mm(0, 1), mm(0, 1), nil)}}, ""},
		{"a bucket whose summaries leave the field out (summed names others): not exact", A{grp(nil, acc("hi", "$max", "$v"))},
			[]A{{append(bkt("a", h(0), 1, mm(0, int32(4)), mm(0, int32(4)), sumV(int32(4))), E{Key: "summed", Value: D{{Key: "w", Value: true}}})}}, ""},
		{"a bucket whose summaries name the field", A{grp(nil, acc("hi", "$max", "$v"))},
			[]A{{append(bkt("a", h(0), 1, mm(0, int32(4)), mm(0, int32(4)), sumV(int32(4))), E{Key: "summed", Value: D{{Key: "v", Value: true}}})}},
			`{"_id": null,"hi": {"$numberInt":"4"}}`},
		{"no buckets, no groups", sumOnly, []A{{}}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, ok := runSummary(t, c.pipeline, c.buckets...)
			if c.name == "no buckets, no groups" {
				if !ok || got != "" {
					t.Fatalf("got %q %v", got, ok)
				}
				return
			}
			if ok != (c.want != "") || got != c.want {
				t.Fatalf("got  %s (exact %v)\nwant %s", got, ok, c.want)
			}
		})
	}
}

func TestLowBitOf(t *testing.T) {
	cases := []struct {
		v    any
		want int32
	}{
		{int32(0), bucket.LowBitZero}, {int32(1), 0}, {int32(12), 2}, {int32(-8), 3}, {int64(1) << 40, 40}, {int64(math.MinInt64), 63},
		{0.0, bucket.LowBitZero}, {math.Copysign(0, -1), bucket.LowBitZero}, {1.0, 0}, {0.5, -1}, {21.25, -2}, {-3.125, -3}, {6.0, 1}, {1e300, 946},
		{0.1, -55}, {math.SmallestNonzeroFloat64, -1074}, {3 * math.SmallestNonzeroFloat64, -1074}, {math.Ldexp(1, -1030), -1030},
		{math.NaN(), bucket.LowBitSpecial}, {math.Inf(1), bucket.LowBitSpecial}, {math.Inf(-1), bucket.LowBitSpecial},
	}
	for _, c := range cases {
		raw, err := bson.Marshal(D{{Key: "v", Value: c.v}})
		if err != nil {
			t.Fatal(err)
		}
		v := bsoncore.Document(raw).Lookup("v")
		if got := bucket.LowBitOf(v); got != c.want {
			t.Errorf("lowBitOf(%v) = %d, want %d", c.v, got, c.want)
		}
		if f, ok := v.AsFloat64OK(); ok && c.want != bucket.LowBitZero && c.want != bucket.LowBitSpecial && (math.Mod(f, math.Ldexp(1, int(c.want))) != 0 || math.Mod(f, math.Ldexp(1, int(c.want)+1)) == 0) {
			t.Errorf("the lowest set bit of %v is not 2^%d", c.v, c.want)
		}
	}
}
