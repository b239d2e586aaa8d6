package e2e

import (
	"context"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// partitionBy: month writes each bucket into the collection of the month
// holding its window start; reads span the months. Every read through the
// proxy is compared with the same query on the same events stored plainly
// (db.plain, directly upstream).

func partRule(db, extra string) string {
	return fmt.Sprintf(`rules:
  - namespace: %s.readings
    timeField: ts
    metaField: sensor
    bucket:
      span: 1h
      maxEvents: 50
    aggregates: [value]
    partitionBy: month
%s`, db, extra)
}

var partBase = time.Date(2026, 7, 10, 0, 0, 0, 0, time.UTC)

// partEvents are n events every 47 minutes (about 98 days for 3000, so
// July to October), unique times and unique values, 4 sensors.
func partEvents(n int, base time.Time) []bson.D {
	out := make([]bson.D, n)
	for i := range out {
		out[i] = bson.D{
			{Key: "_id", Value: bson.NewObjectID()},
			{Key: "ts", Value: base.Add(time.Duration(i)*47*time.Minute + time.Duration(i%4)*time.Second)},
			{Key: "sensor", Value: fmt.Sprintf("s-%d", i%4)},
			{Key: "value", Value: float64((i*7919)%3001) + 0.5},
			{Key: "status", Value: []string{"ok", "warn", "err"}[i%3]},
		}
	}
	return out
}

// partitionNames lists the partition collections of db.readings upstream.
func partitionNames(t *testing.T, ctx context.Context, db string) []string {
	t.Helper()
	return partitionNamesIn(t, ctx, direct(t), db)
}

// partitionNamesIn is partitionNames on the upstream c (a test's own).
func partitionNamesIn(t *testing.T, ctx context.Context, c *mongo.Client, db string) []string {
	t.Helper()
	names, err := c.Database(db).ListCollectionNames(ctx, bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`^readings\.buckets_\d{4}_\d{2}$`)
	var out []string
	for _, n := range names {
		if re.MatchString(n) {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// storedEvents sums the count of the buckets of every partition, checking
// that each bucket's window starts in its partition's month.
func storedEvents(t *testing.T, ctx context.Context, db string, parts []string) int64 {
	t.Helper()
	var total int64
	for _, p := range parts {
		cur, err := direct(t).Database(db).Collection(p).Find(ctx, bson.D{})
		if err != nil {
			t.Fatal(err)
		}
		var bs []struct {
			Start time.Time `bson:"start"`
			Count int64     `bson:"count"`
		}
		if err := cur.All(ctx, &bs); err != nil {
			t.Fatal(err)
		}
		for _, b := range bs {
			if want := "readings.buckets_" + b.Start.UTC().Format("2006_01"); want != p {
				t.Errorf("bucket starting %v is in %s, want %s", b.Start, p, want)
			}
			total += b.Count
		}
	}
	return total
}

func TestPartitionMonth(t *testing.T) {
	ctx := ctxFor(t)
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: partRule(db, "")})
	pc := connect(t, p.URI())
	readings := pc.Database(db).Collection("readings")
	plain := direct(t).Database(db).Collection("plain")
	rdURI["readings"], rdURI["plain"] = p.URI(), env.upstreamURI

	events := partEvents(3000, partBase)
	docs := make([]any, len(events))
	for i, e := range events {
		docs[i] = e
	}
	in := 0
	for i := 0; i < len(docs); i += 500 {
		batch := docs[i:min(i+500, len(docs))]
		o := options.InsertMany().SetOrdered(i%1000 == 0) // ordered and unordered batches
		res, err := readings.InsertMany(ctx, batch, o)
		if err != nil {
			t.Fatalf("insert through the proxy: %v", err)
		}
		in += len(res.InsertedIDs)
	}
	if _, err := plain.InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}
	if in != len(events) {
		t.Fatalf("acknowledged %d of %d events", in, len(events))
	}

	parts := partitionNames(t, ctx, db)
	wantParts := []string{"readings.buckets_2026_07", "readings.buckets_2026_08", "readings.buckets_2026_09", "readings.buckets_2026_10"}
	if !reflect.DeepEqual(parts, wantParts) {
		t.Fatalf("partitions %v, want %v", parts, wantParts)
	}
	if n := storedEvents(t, ctx, db, parts); n != int64(in) {
		t.Fatalf("partitions hold %d events, %d were acknowledged", n, in)
	}
	if n, _ := direct(t).Database(db).Collection("readings.buckets").CountDocuments(ctx, bson.D{}); n != 0 {
		t.Errorf("the unpartitioned bucket collection holds %d documents", n)
	}

	aug15, sep20 := time.Date(2026, 8, 15, 0, 0, 0, 0, time.UTC), time.Date(2026, 9, 20, 12, 30, 0, 0, time.UTC)
	aug1, aug10 := time.Date(2026, 8, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 8, 10, 0, 0, 0, 0, time.UTC)
	span := bson.D{{Key: "ts", Value: bson.D{{Key: "$gte", Value: aug15}, {Key: "$lt", Value: sep20}}}}
	asc, desc := bson.D{{Key: "ts", Value: 1}}, bson.D{{Key: "ts", Value: -1}}
	queries := []rdQuery{
		{name: "all, unsorted"},
		{name: "time range over two months, by time", filter: span, sort: asc, sorted: true},
		{name: "all by time desc, skip and limit", sort: desc, skip: 100, limit: 250, sorted: true},
		{name: "by value, projected, small batches", sort: bson.D{{Key: "value", Value: 1}}, limit: 300, batch: 50, sorted: true,
			proj: bson.D{{Key: "_id", Value: 0}, {Key: "value", Value: 1}, {Key: "sensor", Value: 1}}},
		{name: "one sensor by value desc, skip", filter: bson.D{{Key: "sensor", Value: "s-1"}}, sort: bson.D{{Key: "value", Value: -1}}, skip: 10, sorted: true},
		{name: "status then time, over months", filter: bson.D{{Key: "sensor", Value: "s-0"}}, sort: bson.D{{Key: "status", Value: 1}, {Key: "ts", Value: -1}}, limit: 400, sorted: true},
		{name: "within one month", filter: bson.D{{Key: "ts", Value: bson.D{{Key: "$gte", Value: aug1}, {Key: "$lt", Value: aug10}}}}, sort: asc, sorted: true},
		{name: "all by time, every batch", sort: asc, batch: 700, sorted: true},
		{name: "first by time, limit (early stop)", sort: asc, skip: 30, limit: 40, sorted: true},
		{name: "latest by time, limit (early stop)", sort: desc, limit: 60, sorted: true},
		{name: "latest of a sensor by time then value", filter: bson.D{{Key: "sensor", Value: "s-2"}}, sort: bson.D{{Key: "ts", Value: -1}, {Key: "value", Value: 1}}, limit: 700, sorted: true},
		{kind: "count", name: "count all"},
		{kind: "count", name: "count range, skip, limit", filter: span, skip: 20, limit: 100},
		{kind: "count", name: "count range, skip past the end", filter: span, skip: 100000},
		{kind: "countDocuments", name: "countDocuments of a sensor", filter: bson.D{{Key: "sensor", Value: "s-2"}}},
		{kind: "countDocuments", name: "countDocuments of a range", filter: span},
		{kind: "distinct", name: "distinct status", key: "status"},
		{kind: "distinct", name: "distinct sensor of a range", key: "sensor", filter: span},
	}
	for _, q := range queries {
		t.Run(q.name, func(t *testing.T) {
			got, err := rdRun(t, ctx, readings, q)
			if err != nil {
				t.Fatalf("proxy: %v", err)
			}
			want, err := rdRun(t, ctx, plain, q)
			if err != nil {
				t.Fatalf("plain: %v", err)
			}
			if len(got) == 0 && q.kind == "" {
				t.Fatal("no documents")
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("proxy and plain differ: %d vs %d documents\nproxy %v\nplain %v", len(got), len(want), head(got), head(want))
			}
		})
	}

	t.Run("aggregate from summaries, by sensor", func(t *testing.T) {
		pipeline := bson.A{bson.D{{Key: "$group", Value: bson.D{
			{Key: "_id", Value: "$sensor"},
			{Key: "n", Value: bson.D{{Key: "$sum", Value: 1}}},
			{Key: "total", Value: bson.D{{Key: "$sum", Value: "$value"}}},
		}}}}
		got := runAggregate(t, readings, pipeline)
		want := map[string][2]float64{}
		for _, e := range events {
			m := dmap(e)
			k := m["sensor"].(string)
			w := want[k]
			want[k] = [2]float64{w[0] + 1, w[1] + m["value"].(float64)}
		}
		if len(got) != len(want) {
			t.Fatalf("%d groups, want %d: %v", len(got), len(want), got)
		}
		for _, g := range got {
			m := dmap(g)
			w := want[m["_id"].(string)]
			n, _ := bson.Raw(mustMarshal(g)).Lookup("n").AsInt64OK()
			total, _ := bson.Raw(mustMarshal(g)).Lookup("total").AsFloat64OK()
			if float64(n) != w[0] || total != w[1] {
				t.Errorf("group %v: n %d total %v, want %v", m["_id"], n, total, w)
			}
		}
	})

	t.Run("aggregate the summaries cannot answer is refused", func(t *testing.T) {
		_, err := readings.Aggregate(ctx, bson.A{bson.D{{Key: "$sort", Value: bson.D{{Key: "value", Value: 1}}}}, bson.D{{Key: "$limit", Value: 3}}})
		if err == nil || !strings.Contains(err.Error(), "spanning 4 partitions") {
			t.Fatalf("got %v, want a refusal naming the partitions", err)
		}
	})

	t.Run("commands without a partitioned meaning are refused", func(t *testing.T) {
		for _, cmd := range []bson.D{
			{{Key: "collStats", Value: "readings"}},
			{{Key: "createIndexes", Value: "readings"}, {Key: "indexes", Value: bson.A{bson.D{{Key: "key", Value: bson.D{{Key: "value", Value: 1}}}, {Key: "name", Value: "v"}}}}},
			{{Key: "listIndexes", Value: "readings"}},
			{{Key: "explain", Value: bson.D{{Key: "find", Value: "readings"}}}},
		} {
			err := pc.Database(db).RunCommand(ctx, cmd).Err()
			if err == nil || !strings.Contains(err.Error(), "tsproxy rule "+db+".readings") || !strings.Contains(err.Error(), "partition") {
				t.Errorf("%s: %v, want a refusal naming the rule and the partitions", cmd[0].Key, err)
			}
		}
	})

	t.Run("cursors closed early", func(t *testing.T) {
		for _, f := range []bson.D{{}, {{Key: "ts", Value: bson.D{{Key: "$gte", Value: aug1}, {Key: "$lt", Value: aug10}}}}} {
			cur, err := readings.Find(ctx, f, options.Find().SetBatchSize(5).SetSort(asc))
			if err != nil {
				t.Fatal(err)
			}
			if !cur.Next(ctx) {
				t.Fatalf("no first document: %v", cur.Err())
			}
			if err := cur.Close(ctx); err != nil {
				t.Fatalf("killCursors: %v", err)
			}
		}
	})

	t.Run("listCollections hides the partitions", func(t *testing.T) {
		names, err := pc.Database(db).ListCollectionNames(ctx, bson.D{})
		if err != nil {
			t.Fatal(err)
		}
		readingsShown := 0
		for _, n := range names {
			if strings.HasPrefix(n, "readings.buckets") {
				t.Errorf("listCollections through the proxy shows %q", n)
			}
			if n == "readings" {
				readingsShown++
			}
		}
		if readingsShown != 1 {
			t.Errorf("listCollections shows readings %d times, want once: %v", readingsShown, names)
		}
		named, err := pc.Database(db).ListCollectionNames(ctx, bson.D{{Key: "name", Value: "readings"}})
		if err != nil || !reflect.DeepEqual(named, []string{"readings"}) {
			t.Errorf("listCollections filtered by name: %v, %v; want [readings]", named, err)
		}
	})

	t.Run("mongosh", func(t *testing.T) {
		out := runMongosh(t, p.URI(), fmt.Sprintf(`
const d = connect(process.env.TSPROXY_URI).getSiblingDB(%q);
const docs = d.readings.find({}, {_id: 0, ts: 1}).sort({ts: -1}).skip(5).limit(3).toArray();
print("LAST " + docs.map(x => x.ts.toISOString()).join(","));
print("COUNT " + d.readings.countDocuments({sensor: "s-0"}));
`, db))
		var want []string
		for i := len(events) - 6; i >= len(events)-8; i-- {
			want = append(want, dmap(events[i])["ts"].(time.Time).UTC().Format("2006-01-02T15:04:05.000Z"))
		}
		if !strings.Contains(out, "LAST "+strings.Join(want, ",")) || !strings.Contains(out, fmt.Sprintf("COUNT %d", len(events)/4)) {
			t.Fatalf("mongosh printed\n%s\nwant LAST %s and COUNT %d", out, strings.Join(want, ","), len(events)/4)
		}
	})

	t.Run("delete over months", func(t *testing.T) {
		f := bson.D{{Key: "sensor", Value: "s-3"}, {Key: "ts", Value: bson.D{{Key: "$gte", Value: aug15}}}}
		rp, err := readings.DeleteMany(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		rd, err := plain.DeleteMany(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		if rp.DeletedCount != rd.DeletedCount || rp.DeletedCount == 0 {
			t.Fatalf("deleted %d through the proxy, %d plainly", rp.DeletedCount, rd.DeletedCount)
		}
		for _, q := range []rdQuery{{name: "all by time", sort: asc, sorted: true}, {kind: "countDocuments", name: "count"}} {
			got, err := rdRun(t, ctx, readings, q)
			if err != nil {
				t.Fatal(err)
			}
			want, _ := rdRun(t, ctx, plain, q)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%s after delete: %d vs %d", q.name, len(got), len(want))
			}
		}
		if n := storedEvents(t, ctx, db, partitionNames(t, ctx, db)); n != int64(in)-rp.DeletedCount {
			t.Fatalf("partitions hold %d events, want %d - %d", n, in, rp.DeletedCount)
		}
		if _, err := readings.DeleteOne(ctx, bson.D{}); err == nil || !strings.Contains(err.Error(), "limit 1") {
			t.Fatalf("deleteOne over partitions: %v, want a refusal", err)
		}
	})

	t.Run("drop drops every partition", func(t *testing.T) {
		if err := readings.Drop(ctx); err != nil {
			t.Fatal(err)
		}
		if left := partitionNames(t, ctx, db); len(left) != 0 {
			t.Fatalf("partitions left after drop: %v", left)
		}
		if n, err := readings.CountDocuments(ctx, bson.D{}); err != nil || n != 0 {
			t.Fatalf("count after drop: %d, %v", n, err)
		}
		// Writing again starts afresh.
		if _, err := readings.InsertMany(ctx, docs[:100]); err != nil {
			t.Fatal(err)
		}
		if n, err := readings.CountDocuments(ctx, bson.D{}); err != nil || n != 100 {
			t.Fatalf("count after rewriting: %d, %v", n, err)
		}
	})
}

// TestPartitionRetention: with expireAfter, the sweeper drops the
// partitions whose every window has expired and deletes the expired
// buckets of the partly expired one; the events left are the others.
func TestPartitionRetention(t *testing.T) {
	ctx := ctxFor(t)
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: partRule(db, "    expireAfter: 60d\n    sweepInterval: 200ms\n")})
	readings := connect(t, p.URI()).Database(db).Collection("readings")

	now := time.Now().UTC()
	cutoff := now.Add(-60 * 24 * time.Hour) // a window expires when it ends by then
	var docs []any
	expired := 0
	for i := 0; i < 2000; i++ {
		ts := now.Add(-130*24*time.Hour + time.Duration(i)*89*time.Minute)
		end := ts.Truncate(time.Hour).Add(time.Hour)
		if d := end.Sub(cutoff); d > -2*time.Hour && d < 2*time.Hour {
			continue // too close to the moving cutoff to count
		}
		if !end.After(cutoff) {
			expired++
		}
		docs = append(docs, bson.D{{Key: "ts", Value: ts}, {Key: "sensor", Value: fmt.Sprintf("s-%d", i%3)}, {Key: "value", Value: 1.0}})
	}
	// Inserting old events races with the sweeper, which may drop a
	// partition between batches: insert everything in one batch, then wait.
	res, err := readings.InsertMany(ctx, docs)
	if err != nil || len(res.InsertedIDs) != len(docs) {
		t.Fatalf("insert: %v", err)
	}
	oldest := now.Add(-130 * 24 * time.Hour)
	var mustGo []string // partitions whose month ended before the cutoff
	for m := time.Date(oldest.Year(), oldest.Month(), 1, 0, 0, 0, 0, time.UTC); !m.AddDate(0, 1, 0).After(cutoff); m = m.AddDate(0, 1, 0) {
		mustGo = append(mustGo, "readings.buckets_"+m.Format("2006_01"))
	}
	if len(mustGo) < 2 {
		t.Fatalf("test data should span at least 2 expired months, got %v", mustGo)
	}
	deadline := time.Now().Add(ttlWait(20 * time.Second))
	for {
		parts := partitionNames(t, ctx, db)
		gone := true
		for _, m := range mustGo {
			for _, p := range parts {
				if p == m {
					gone = false
				}
			}
		}
		n, err := readings.CountDocuments(ctx, bson.D{})
		if err != nil {
			t.Fatal(err)
		}
		if gone && n == int64(len(docs)-expired) {
			t.Logf("in %d, expired %d, left %d; partitions left %v (dropped %v)", len(docs), expired, n, parts, mustGo)
			if len(parts) < 2 {
				t.Fatalf("the recent partitions should stay: %v", parts)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("partitions %v (want none of %v), %d events left, want %d - %d", parts, mustGo, n, len(docs), expired)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func head(d []bson.D) []bson.D {
	if len(d) > 3 {
		return d[:3]
	}
	return d
}

// TestPartitionOverhead measures what partitionBy: month costs: the same
// events (3 months) through the proxy into a rule without partitions and
// one with, interleaved over several runs; medians printed. Skipped
// unless TSPROXY_BENCH is set (it measures, it does not check).
func TestPartitionOverhead(t *testing.T) {
	if os.Getenv("TSPROXY_BENCH") == "" {
		t.Skip("set TSPROXY_BENCH=1 to measure")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	const runs, events, batch, reps = 3, 6000, 1000, 5
	base := time.Date(2026, 7, 1, 0, 0, 0, 0, time.UTC)
	mid := []time.Time{time.Date(2026, 8, 10, 0, 0, 0, 0, time.UTC), time.Date(2026, 8, 12, 0, 0, 0, 0, time.UTC)}
	timings := map[string][]float64{}
	for r := 0; r < runs; r++ {
		db := fmt.Sprintf("%s_%d", uniqueDB(t), r)
		yaml := fmt.Sprintf(`rules:
  - {namespace: %[1]s.flat, timeField: ts, metaField: sensor, aggregates: [value], bucket: {span: 1h, maxEvents: 200}}
  - {namespace: %[1]s.part, timeField: ts, metaField: sensor, aggregates: [value], bucket: {span: 1h, maxEvents: 200}, partitionBy: month}
`, db)
		p := startProxy(t, proxyOptions{yaml: yaml})
		via := connect(t, p.URI()).Database(db)
		for _, name := range []string{"flat", "part"} {
			coll := via.Collection(name)
			docs := make([]any, events)
			for i := range docs {
				docs[i] = bson.D{{Key: "ts", Value: base.Add(time.Duration(i) * 20 * time.Minute)}, {Key: "sensor", Value: fmt.Sprintf("s%d", i%5)}, {Key: "value", Value: float64(i % 97)}}
			}
			t0 := time.Now()
			for i := 0; i < len(docs); i += batch {
				if _, err := coll.InsertMany(ctx, docs[i:i+batch]); err != nil {
					t.Fatal(err)
				}
			}
			timings[name+" insert ms"] = append(timings[name+" insert ms"], float64(time.Since(t0).Milliseconds()))
			measure := func(what string, f func() error) {
				t0 := time.Now()
				for k := 0; k < reps; k++ {
					if err := f(); err != nil {
						t.Fatalf("%s %s: %v", name, what, err)
					}
				}
				ms := float64(time.Since(t0).Microseconds()) / 1000 / reps
				t.Logf("run %d %s %s: %.1f", r, name, what, ms)
				timings[name+" "+what] = append(timings[name+" "+what], ms)
			}
			inMonth := bson.D{{Key: "ts", Value: bson.D{{Key: "$gte", Value: mid[0]}, {Key: "$lt", Value: mid[1]}}}}
			measure("find 2 days ms", func() error {
				cur, err := coll.Find(ctx, inMonth, options.Find().SetSort(bson.D{{Key: "ts", Value: 1}}))
				if err != nil {
					return err
				}
				var out []bson.D
				return cur.All(ctx, &out)
			})
			measure("find all by ts limit 100 ms", func() error {
				cur, err := coll.Find(ctx, bson.D{}, options.Find().SetSort(bson.D{{Key: "ts", Value: -1}}).SetLimit(100))
				if err != nil {
					return err
				}
				var out []bson.D
				return cur.All(ctx, &out)
			})
			measure("count all ms", func() error {
				_, err := coll.CountDocuments(ctx, bson.D{})
				return err
			})
		}
	}
	med := func(v []float64) float64 { s := slices.Clone(v); slices.Sort(s); return s[len(s)/2] }
	t.Logf("median of %d runs, %d events over 3 months (batch %d), reads averaged over %d repetitions:", runs, events, batch, reps)
	for _, what := range []string{"insert ms", "find 2 days ms", "find all by ts limit 100 ms", "count all ms"} {
		f, p := med(timings["flat "+what]), med(timings["part "+what])
		t.Logf("%-28s flat %8.1f | partitioned %8.1f (%.2fx)", what, f, p, p/f)
	}
}
