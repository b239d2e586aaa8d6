package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// TestTimeseriesMeasurementFilters: filters on a measurement the rule aggregates
// (find, count, aggregate, delete; with the series and time fixed or
// not; merged and staged) answer as a plain collection of the same
// events does, with values of every kind in the field (strings and
// arrays, which the buckets' min and max leave out, and missing ones);
// the proxy skips the buckets whose min and max rule a match out, and
// only those whose summaries say they cover every event. An index on
// the measurement is made on the buckets' min and max and listed,
// hinted and dropped as the app made it.
func TestTimeseriesMeasurementFilters(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: readingsRule(db, 1000)})
	client := connect(t, p.URI())
	coll := client.Database(db).Collection("readings")
	plain := direct(t).Database(db).Collection("plain")
	buckets := direct(t).Database(db).Collection("readings.buckets")
	base := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)

	event := func(s string, j int, v any) bson.D {
		d := bson.D{{Key: "_id", Value: bson.NewObjectID()}, {Key: "ts", Value: base.Add(time.Duration(j) * 5 * time.Minute)}, {Key: "sensorId", Value: s}}
		if v != nil {
			d = append(d, bson.E{Key: "value", Value: v})
		}
		return d
	}
	var docs []any
	for j := range 144 { // 12 hours of 5-minute data
		docs = append(docs, event("a", j, j))
		var b any = float64(j) / 2
		switch {
		case j == 30:
			b = "high"
		case j == 31:
			b = bson.A{200, 1}
		case j%7 == 0:
			b = int64(j)
		}
		docs = append(docs, event("b", j, b))
		var c any = -j
		if j%5 == 0 {
			c = nil
		}
		docs = append(docs, event("c", j, c))
	}
	insertBoth := func(docs []any) {
		t.Helper()
		for i := 0; i < len(docs); i += 100 {
			batch := docs[i:min(i+100, len(docs))]
			if _, err := coll.InsertMany(ctx, batch); err != nil {
				t.Fatal(err)
			}
			if _, err := plain.InsertMany(ctx, batch); err != nil {
				t.Fatal(err)
			}
		}
	}
	insertBoth(docs)
	flush(t, ctx, client, 1)

	hours := func(from, to int) bson.D {
		return bson.D{{Key: "$gte", Value: base.Add(time.Duration(from) * time.Hour)}, {Key: "$lt", Value: base.Add(time.Duration(to) * time.Hour)}}
	}
	filters := []bson.D{
		{{Key: "value", Value: bson.D{{Key: "$gt", Value: 100}}}},
		{{Key: "value", Value: bson.D{{Key: "$gte", Value: 10}, {Key: "$lt", Value: 20}}}},
		{{Key: "value", Value: 5}},
		{{Key: "value", Value: bson.D{{Key: "$in", Value: bson.A{1, 2, 130}}}}},
		{{Key: "value", Value: bson.D{{Key: "$gt", Value: 150}}}}, // b's array holds 200
		{{Key: "value", Value: bson.D{{Key: "$lt", Value: -140}}}},
		{{Key: "value", Value: bson.D{{Key: "$gt", Value: 1000}}}},
		{{Key: "sensorId", Value: "a"}, {Key: "ts", Value: hours(2, 5)}, {Key: "value", Value: bson.D{{Key: "$gt", Value: 40}}}},
		{{Key: "sensorId", Value: "b"}, {Key: "ts", Value: hours(0, 12)}, {Key: "value", Value: bson.D{{Key: "$gte", Value: 199}}}},
		{{Key: "sensorId", Value: "c"}, {Key: "ts", Value: hours(0, 3)}, {Key: "value", Value: bson.D{{Key: "$lt", Value: -20}}}},
		{{Key: "sensorId", Value: bson.D{{Key: "$in", Value: bson.A{"a", "c"}}}}, {Key: "ts", Value: hours(1, 11)}, {Key: "value", Value: bson.D{{Key: "$lte", Value: 0}}}},
		{{Key: "ts", Value: hours(3, 9)}, {Key: "value", Value: bson.D{{Key: "$gt", Value: 60}, {Key: "$ne", Value: 70}}}},
		{{Key: "value", Value: bson.D{{Key: "$exists", Value: false}}}},
	}
	byTime := options.Find().SetSort(bson.D{{Key: "ts", Value: 1}, {Key: "sensorId", Value: 1}})
	countOf := func(c *mongo.Collection, f bson.D) int64 {
		t.Helper()
		n, err := c.CountDocuments(ctx, f)
		if err != nil {
			t.Fatalf("count %v on %s: %v", f, c.Name(), err)
		}
		return n
	}
	aggCount := func(c *mongo.Collection, f bson.D) string {
		t.Helper()
		cur, err := c.Aggregate(ctx, bson.A{bson.D{{Key: "$match", Value: f}}, bson.D{{Key: "$group", Value: bson.D{{Key: "_id", Value: "$sensorId"}, {Key: "n", Value: bson.D{{Key: "$sum", Value: 1}}}}}}, bson.D{{Key: "$sort", Value: bson.D{{Key: "_id", Value: 1}}}}})
		if err != nil {
			t.Fatalf("aggregate %v on %s: %v", f, c.Name(), err)
		}
		var out []bson.D
		if err := cur.All(ctx, &out); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprint(out)
	}
	check := func(when string) {
		t.Helper()
		for _, f := range filters {
			got, want := findAll(t, ctx, coll, f, byTime), findAll(t, ctx, plain, f, byTime)
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("%s: find %v: proxy %d events, plain %d\nproxy %v\nplain %v", when, f, len(got), len(want), got, want)
			}
			if g, w := countOf(coll, f), countOf(plain, f); g != w {
				t.Fatalf("%s: count %v: proxy %d, plain %d", when, f, g, w)
			}
			if g, w := aggCount(coll, f), aggCount(plain, f); g != w {
				t.Fatalf("%s: aggregate %v: proxy %s, plain %s", when, f, g, w)
			}
		}
	}
	check("merged")

	// Staged events, outside and inside the merged buckets' ranges.
	insertBoth([]any{event("a", 150, 1000.5), event("b", 151, "x"), event("c", 20, -500), event("a", 10, 99)})
	check("staged")
	flush(t, ctx, client, 1)
	check("merged again")

	// A bucket whose summaries do not say they cover every event (one a
	// rule wrote before the field was an aggregate) is read whatever its
	// min and max say; one that says so is skipped when they rule the
	// filter out: proof that the reads prune.
	selective := bson.D{{Key: "sensorId", Value: "a"}, {Key: "ts", Value: hours(2, 3)}, {Key: "value", Value: bson.D{{Key: "$gte", Value: 24}}}}
	noMeta := bson.D{{Key: "ts", Value: hours(2, 3)}, {Key: "value", Value: bson.D{{Key: "$gte", Value: 24}}}}
	hourA := bson.D{{Key: "meta", Value: "a"}, {Key: "start", Value: base.Add(2 * time.Hour)}}
	wants := map[string]int{}
	for _, f := range []bson.D{selective, noMeta} {
		wants[fmt.Sprint(f)] = len(findAll(t, ctx, plain, f, byTime))
	}
	if wants[fmt.Sprint(selective)] == 0 {
		t.Fatal("the selective filter matches nothing in the plain collection")
	}
	if _, err := buckets.UpdateMany(ctx, hourA, bson.D{{Key: "$set", Value: bson.D{{Key: "min.value", Value: -1000}, {Key: "max.value", Value: -1000}}}, {Key: "$unset", Value: bson.D{{Key: "summed", Value: ""}}}}); err != nil {
		t.Fatal(err)
	}
	for _, f := range []bson.D{selective, noMeta} {
		if got, want := len(findAll(t, ctx, coll, f, byTime)), wants[fmt.Sprint(f)]; got != want {
			t.Fatalf("find %v with summaries not known whole: %d events, want %d", f, got, want)
		}
	}
	if _, err := buckets.UpdateMany(ctx, hourA, bson.D{{Key: "$set", Value: bson.D{{Key: "summed.value", Value: true}}}}); err != nil {
		t.Fatal(err)
	}
	for _, f := range []bson.D{selective, noMeta} {
		if got, want := len(findAll(t, ctx, coll, f, byTime)), wants[fmt.Sprint(f)]-wants[fmt.Sprint(selective)]; got != want {
			t.Fatalf("find %v read a bucket whose whole summaries rule it out: %d events, want %d without it (the reads do not prune)", f, got, want)
		}
	}
	if n := countOf(coll, selective); n != 0 {
		t.Fatalf("count %v read a bucket whose summaries rule it out: %d", selective, n)
	}

	// An index on the measurement, as MongoDB lists it.
	name, err := coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: "value", Value: 1}}})
	if err != nil {
		t.Fatalf("createIndex({value: 1}): %v", err)
	}
	if name != "value_1" {
		t.Fatalf("index name %q", name)
	}
	if _, err := coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: "sensorId", Value: 1}, {Key: "value", Value: -1}}}); err != nil {
		t.Fatalf("createIndex({sensorId: 1, value: -1}): %v", err)
	}
	listed := listIndexKeys(t, coll)
	for _, k := range []string{`value_1 {"value":{"$numberInt":"1"}}`, `sensorId_1_value_-1 {"sensorId":{"$numberInt":"1"},"value":{"$numberInt":"-1"}}`} {
		if !strings.Contains(listed, k) {
			t.Fatalf("listIndexes: %s, want %s", listed, k)
		}
	}
	var upKeys []bson.D
	cur, err := buckets.Indexes().List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := cur.All(ctx, &upKeys); err != nil {
		t.Fatal(err)
	}
	if s := fmt.Sprint(upKeys); !strings.Contains(s, `"min.value":{"$numberInt":"1"},"max.value":{"$numberInt":"1"}`) || !strings.Contains(s, `"meta":{"$numberInt":"1"},"max.value":{"$numberInt":"-1"},"min.value":{"$numberInt":"-1"}`) {
		t.Fatalf("the bucket collection's indexes: %s, want them on min.value and max.value", s)
	}
	f := filters[1]
	if got, want := findAll(t, ctx, coll, f, options.Find().SetSort(bson.D{{Key: "ts", Value: 1}, {Key: "sensorId", Value: 1}}).SetHint("value_1")), findAll(t, ctx, plain, f, byTime); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("hinted find: proxy %v\nplain %v", got, want)
	}
	if err := coll.Indexes().DropOne(ctx, "value_1"); err != nil {
		t.Fatalf("dropIndex value_1: %v", err)
	}
	if err := client.Database(db).RunCommand(ctx, bson.D{{Key: "dropIndexes", Value: "readings"}, {Key: "index", Value: bson.D{{Key: "sensorId", Value: 1}, {Key: "value", Value: -1}}}}).Err(); err != nil {
		t.Fatalf("dropIndexes by key: %v", err)
	}
	if listed := listIndexKeys(t, coll); strings.Contains(listed, "value") {
		t.Fatalf("listIndexes after the drops: %s", listed)
	}

	// A measurement the rule does not aggregate cannot be indexed, and
	// the refusal says how to make it indexable.
	_, err = coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: "other", Value: 1}}})
	if err == nil || !strings.Contains(err.Error(), "add a measurement to the rule's aggregates") {
		t.Fatalf("createIndex({other: 1}): %v", err)
	}
}

// listIndexKeys is "name [key]" of each index of c that listIndexes
// shows.
func listIndexKeys(t *testing.T, c *mongo.Collection) string {
	t.Helper()
	cur, err := c.Indexes().List(ctxFor(t))
	if err != nil {
		t.Fatalf("listIndexes: %v", err)
	}
	var specs []struct {
		Name string `bson:"name"`
		Key  bson.D `bson:"key"`
	}
	if err := cur.All(ctxFor(t), &specs); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range specs {
		out = append(out, fmt.Sprintf("%s %v", s.Name, s.Key))
	}
	return strings.Join(out, "; ")
}

// TestTimeseriesCreatedMeasurementIndex: on a collection made with
// createCollection({timeseries}), createIndex({value: 1}) works as on
// MongoDB (its catalog entry keeps value's min and max from then on,
// through both proxies); finds, counts and a dashboard's $max over events
// from before the index (buckets without value's summaries) and after it
// answer as a plain collection does, and the buckets written after it are
// skipped where their min and max rule a filter out.
func TestTimeseriesCreatedMeasurementIndex(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	p1, p2 := startProxy(t, proxyOptions{}), startProxy(t, proxyOptions{})
	c1, c2 := connect(t, p1.URI()), connect(t, p2.URI())
	dropAtEnd(t, c1, db)
	tsOpts := options.TimeSeries().SetTimeField("ts").SetMetaField("meta").SetGranularity("seconds") // hourly buckets
	if err := c1.Database(db).CreateCollection(ctx, "weather", options.CreateCollection().SetTimeSeriesOptions(tsOpts)); err != nil {
		t.Fatalf("create: %v", err)
	}
	w1, w2 := c1.Database(db).Collection("weather"), c2.Database(db).Collection("weather")
	plain := direct(t).Database(db).Collection("plain")
	base := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	batch := func(day, n int) []any {
		var out []any
		for j := range n {
			out = append(out, bson.D{{Key: "_id", Value: bson.NewObjectID()}, {Key: "ts", Value: base.Add(time.Duration(day)*24*time.Hour + time.Duration(j)*10*time.Minute)},
				{Key: "meta", Value: fmt.Sprintf("s%d", j%3)}, {Key: "value", Value: float64(day*1000 + j)}})
		}
		return out
	}
	insert := func(c *mongo.Collection, docs []any) {
		t.Helper()
		if _, err := c.InsertMany(ctx, docs); err != nil {
			t.Fatal(err)
		}
		if _, err := plain.InsertMany(ctx, docs); err != nil {
			t.Fatal(err)
		}
	}
	insert(w1, batch(0, 144))
	flush(t, ctx, c1, 1)

	name, err := w2.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: "value", Value: -1}}})
	if err != nil || name != "value_-1" {
		t.Fatalf("createIndex({value: -1}) on a created time-series collection: %q, %v", name, err)
	}
	if listed := listIndexKeys(t, w1); !strings.Contains(listed, `value_-1 {"value":{"$numberInt":"-1"}}`) {
		t.Fatalf("listIndexes through the other proxy: %s", listed)
	}
	insert(w1, batch(1, 144))
	insert(w2, batch(2, 144))
	flush(t, ctx, c1, 1)
	flush(t, ctx, c2, 1)

	byTime := options.Find().SetSort(bson.D{{Key: "ts", Value: 1}})
	for _, f := range []bson.D{
		{{Key: "value", Value: bson.D{{Key: "$gte", Value: 100}, {Key: "$lt", Value: 110}}}},
		{{Key: "value", Value: bson.D{{Key: "$gte", Value: 1100}, {Key: "$lt", Value: 1110}}}},
		{{Key: "value", Value: bson.D{{Key: "$gt", Value: 2140}}}},
		{{Key: "meta", Value: "s1"}, {Key: "ts", Value: bson.D{{Key: "$gte", Value: base}, {Key: "$lt", Value: base.Add(72 * time.Hour)}}}, {Key: "value", Value: bson.D{{Key: "$lt", Value: 2010}}}},
	} {
		for _, c := range []*mongo.Collection{w1, w2} {
			got, want := findAll(t, ctx, c, f, byTime), findAll(t, ctx, plain, f, byTime)
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("find %v: proxy %d events, plain %d", f, len(got), len(want))
			}
		}
	}
	daily := bson.A{
		bson.D{{Key: "$match", Value: bson.D{{Key: "ts", Value: bson.D{{Key: "$gte", Value: base}, {Key: "$lt", Value: base.Add(72 * time.Hour)}}}}}},
		bson.D{{Key: "$group", Value: bson.D{{Key: "_id", Value: bson.D{{Key: "$dateTrunc", Value: bson.D{{Key: "date", Value: "$ts"}, {Key: "unit", Value: "day"}}}}}, {Key: "hi", Value: bson.D{{Key: "$max", Value: "$value"}}}, {Key: "lo", Value: bson.D{{Key: "$min", Value: "$value"}}}}}},
		bson.D{{Key: "$sort", Value: bson.D{{Key: "_id", Value: 1}}}},
	}
	var got []bson.M
	cur, err := w1.Aggregate(ctx, daily)
	if err != nil {
		t.Fatalf("daily max: %v", err)
	}
	if err := cur.All(ctx, &got); err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("daily max: %v", got)
	}
	for i, g := range got {
		hi, lo := g["hi"], g["lo"]
		if hi != float64(i*1000+143) || lo != float64(i*1000) {
			t.Fatalf("day %d: max %v min %v, want %d and %d (a bucket from before the index answered for value)", i, hi, lo, i*1000+143, i*1000)
		}
	}

	// The buckets written after the index are pruned by value: one whose
	// summaries are made to rule a filter out is skipped.
	buckets := direct(t).Database(db).Collection("weather.buckets")
	day2 := bson.D{{Key: "start", Value: bson.D{{Key: "$gte", Value: base.Add(48 * time.Hour)}}}, {Key: "summed.value", Value: true}}
	for d := range 3 {
		all, _ := buckets.CountDocuments(ctx, bson.D{{Key: "start", Value: bson.D{{Key: "$gte", Value: base.Add(time.Duration(d) * 24 * time.Hour)}, {Key: "$lt", Value: base.Add(time.Duration(d+1) * 24 * time.Hour)}}}})
		sm, _ := buckets.CountDocuments(ctx, bson.D{{Key: "start", Value: bson.D{{Key: "$gte", Value: base.Add(time.Duration(d) * 24 * time.Hour)}, {Key: "$lt", Value: base.Add(time.Duration(d+1) * 24 * time.Hour)}}}, {Key: "summed.value", Value: true}})
		if all == 0 || (d == 0) != (sm == 0) || (d > 0 && sm != all) {
			t.Fatalf("day %d: %d buckets, %d keep value's summaries; want none before the index, all after", d, all, sm)
		}
	}
	if _, err := buckets.UpdateMany(ctx, day2, bson.D{{Key: "$set", Value: bson.D{{Key: "max.value", Value: -1.0}, {Key: "min.value", Value: -1.0}}}}); err != nil {
		t.Fatal(err)
	}
	if n, err := w1.CountDocuments(ctx, bson.D{{Key: "value", Value: bson.D{{Key: "$gte", Value: 2000}}}}); err != nil || n != 0 {
		t.Fatalf("count by value over buckets whose summaries rule it out: %d (%v), want 0: the reads do not prune", n, err)
	}

	// tsproxy summaries gives the buckets from before the index theirs,
	// beside serving proxies; a second run finds nothing to do.
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("upstream:\n  uri: %q\ntelemetry:\n  metricsListen: \"\"\n", env.upstreamURI)), 0o600); err != nil {
		t.Fatal(err)
	}
	summaries := func(args ...string) string {
		t.Helper()
		out, err := exec.CommandContext(ctx, tsproxyBinary(t), append([]string{"summaries", "--config", cfg, "--rule", db + ".weather"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("tsproxy summaries %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	if out := summaries("--dry-run"); !strings.Contains(out, db+".weather.buckets: 72 buckets without the summaries") {
		t.Fatalf("summaries --dry-run: %s", out)
	}
	// Where a proxy holds the rule's writer lease (FerretDB: its last
	// merge), the run is refused naming it, and done once the lease lapses.
	var out []byte
	for deadline := time.Now().Add(45 * time.Second); ; {
		out, err = exec.CommandContext(ctx, tsproxyBinary(t), "summaries", "--config", cfg, "--rule", db+".weather").CombinedOutput()
		if err == nil || !strings.Contains(string(out), "writer lease") || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	if err != nil || !strings.Contains(string(out), db+".weather.buckets: 72 buckets given the summaries") {
		t.Fatalf("summaries: %v\n%s", err, out)
	}
	if out := summaries(); !strings.Contains(out, db+".weather.buckets: 0 buckets given") {
		t.Fatalf("summaries run again: %s", out)
	}
	day0 := bson.D{{Key: "start", Value: bson.D{{Key: "$lt", Value: base.Add(24 * time.Hour)}}}}
	if n, err := buckets.CountDocuments(ctx, append(day0, bson.E{Key: "summed.value", Value: true})); err != nil || n != 72 {
		t.Fatalf("buckets from before the index with value's summaries after the run: %d (%v), want 72", n, err)
	}
	// Their summaries are those of their events: the day-0 filters and
	// the daily min and max still answer as the plain collection.
	for _, f := range []bson.D{
		{{Key: "value", Value: bson.D{{Key: "$gte", Value: 100}, {Key: "$lt", Value: 110}}}},
		{{Key: "value", Value: bson.D{{Key: "$lte", Value: 3}}}},
	} {
		got, want := findAll(t, ctx, w1, f, byTime), findAll(t, ctx, plain, f, byTime)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("find %v after tsproxy summaries: proxy %d events, plain %d", f, len(got), len(want))
		}
	}
	// ... and they prune now: made to rule a filter out, day 0 is skipped.
	if _, err := buckets.UpdateMany(ctx, day0, bson.D{{Key: "$set", Value: bson.D{{Key: "max.value", Value: -1.0}, {Key: "min.value", Value: -1.0}}}}); err != nil {
		t.Fatal(err)
	}
	if n, err := w1.CountDocuments(ctx, bson.D{{Key: "value", Value: bson.D{{Key: "$gte", Value: 0}, {Key: "$lt", Value: 200}}}}); err != nil || n != 0 {
		t.Fatalf("count over the summarized day 0, made to rule it out: %d (%v), want 0", n, err)
	}
}
