package e2e

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// rollupDoc is a rollup document as read back through the proxy (a plain
// find, passed through).
type rollupDoc struct {
	ID    bson.ObjectID      `bson:"_id"`
	Meta  string             `bson:"meta"`
	Start time.Time          `bson:"start"`
	Count int64              `bson:"count"`
	Sum   map[string]float64 `bson:"sum"`
	Min   bson.M             `bson:"min"`
	Max   bson.M             `bson:"max"`
}

type rollupWant struct {
	count         int64
	sum, min, max float64
	minT, maxT    time.Time
}

func rollupKey(meta string, start time.Time) string {
	return meta + "|" + start.UTC().Format(time.RFC3339)
}

// expectedRollups sums the sent events per series and period of res.
func expectedRollups(sent []sentEvent, res time.Duration) map[string]*rollupWant {
	out := map[string]*rollupWant{}
	for _, e := range sent {
		start := time.UnixMilli(e.ts.UnixMilli() / res.Milliseconds() * res.Milliseconds()).UTC()
		k := rollupKey(e.sensor, start)
		w := out[k]
		if w == nil {
			w = &rollupWant{min: math.Inf(1), max: math.Inf(-1), minT: e.ts, maxT: e.ts}
			out[k] = w
		}
		w.count++
		w.sum += e.value
		w.min, w.max = math.Min(w.min, e.value), math.Max(w.max, e.value)
		if e.ts.Before(w.minT) {
			w.minT = e.ts
		}
		if e.ts.After(w.maxT) {
			w.maxT = e.ts
		}
	}
	return out
}

// TestRollups writes events through the proxy in batches of many sizes,
// some with invalid events, and checks every rollup document of three
// resolutions against the events that were acknowledged: counts and
// min/max exact, sums to rounding.
func TestRollups(t *testing.T) {
	ctx := ctxFor(t)
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: readingsRule(db, 500) + "    rollups: [1m, 1h, 1d]\n"})
	coll := connect(t, p.URI()).Database(db).Collection("readings")

	sent := genEvents(2500, 4, 2, 11)
	var acked []sentEvent
	t0 := time.Now()
	sizes := []int{1, 7, 250, 3, 600, 40}
	for i, b := 0, 0; i < len(sent); b++ {
		n := min(sizes[b%len(sizes)], len(sent)-i)
		var docs []any
		for _, e := range sent[i : i+n] {
			docs = append(docs, e.doc())
		}
		bad := b%4 == 1 // an event without its timeField inside the batch
		if bad {
			docs = append(docs[:n/2], append([]any{bson.D{{Key: "sensorId", Value: "sensor-00"}, {Key: "value", Value: 1e6}}}, docs[n/2:]...)...)
		}
		_, err := coll.InsertMany(ctx, docs, options.InsertMany().SetOrdered(false))
		if bad {
			var bwe mongo.BulkWriteException
			if !errors.As(err, &bwe) || len(bwe.WriteErrors) != 1 || bwe.WriteErrors[0].Index != n/2 {
				t.Fatalf("batch %d: want one write error at %d, got %v", b, n/2, err)
			}
		} else if err != nil {
			t.Fatalf("batch %d: %v", b, err)
		}
		acked = append(acked, sent[i:i+n]...)
		i += n
	}

	t.Logf("%d events inserted in %v", len(acked), time.Since(t0))
	dbh := connect(t, p.URI()).Database(db)
	for _, res := range []time.Duration{time.Minute, time.Hour, 24 * time.Hour} {
		checkRollups(t, ctx, dbh, res, acked)
	}
	n, err := coll.CountDocuments(ctx, bson.D{})
	if err != nil || n != int64(len(acked)) {
		t.Fatalf("events through the proxy: %d, %v; want %d", n, err, len(acked))
	}

	// mongosh reads a rollup collection with a plain find.
	want1d := expectedRollups(acked, 24*time.Hour)
	var wantCount int64
	for k, w := range want1d {
		if strings.HasPrefix(k, "sensor-01|") {
			wantCount += w.count
		}
	}
	out := runMongosh(t, p.URI(), fmt.Sprintf(`
const d = connect(process.env.TSPROXY_URI + %q);
const docs = d.getCollection("readings.rollup_1d").find({meta: "sensor-01"}).sort({start: 1}).toArray();
print(docs.length + " " + docs.reduce((a, x) => a + x.count, 0));
`, db))
	fields := strings.Fields(out)
	if len(fields) != 2 || fields[1] != strconv.FormatInt(wantCount, 10) {
		t.Fatalf("mongosh: %q, want 2 days totalling %d events", out, wantCount)
	}

	// Dropping the namespace drops its rollups; what is written next
	// counts alone.
	if err := coll.Drop(ctx); err != nil {
		t.Fatal(err)
	}
	names, err := direct(t).Database(db).ListCollectionNames(ctx, bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if strings.Contains(n, ".rollup_") {
			t.Fatalf("rollup collection %s left after drop", n)
		}
	}
	if _, err := coll.InsertMany(ctx, []any{sent[0].doc(), sent[1].doc(), sent[2].doc()}); err != nil {
		t.Fatal(err)
	}
	cur, err := dbh.Collection("readings.rollup_1d").Find(ctx, bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	var after []rollupDoc
	if err := cur.All(ctx, &after); err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, d := range after {
		total += d.Count
	}
	if total != 3 {
		t.Fatalf("after drop and 3 inserts, the 1d rollups count %d events", total)
	}
}

// TestRollupOverhead measures what rollups cost the write path: the same
// events inserted through the proxy into a rule without rollups, into one
// with rollups [1m, 1h, 1d], and directly as plain documents, interleaved
// over several runs; medians printed. Skipped unless TSPROXY_BENCH is set
// (it measures, it does not check).
func TestRollupOverhead(t *testing.T) {
	if os.Getenv("TSPROXY_BENCH") == "" {
		t.Skip("set TSPROXY_BENCH=1 to measure")
	}
	ctx := ctxFor(t)
	const runs, events, batch, series = 5, 10000, 1000, 10
	base := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	mk := func() []any {
		out := make([]any, events)
		for i := range out {
			out[i] = bson.D{{Key: "_id", Value: bson.NewObjectID()}, {Key: "ts", Value: base.Add(time.Duration(i/series) * time.Second)},
				{Key: "sensorId", Value: fmt.Sprintf("s%02d", i%series)}, {Key: "value", Value: float64(i % 97)}}
		}
		return out
	}
	rates := map[string][]float64{}
	for r := 0; r < runs; r++ {
		db := fmt.Sprintf("%s_%d", uniqueDB(t), r)
		yaml := fmt.Sprintf(`rules:
  - {namespace: %[1]s.plain, timeField: ts, metaField: sensorId, aggregates: [value], bucket: {span: 1h, maxEvents: 3600}}
  - {namespace: %[1]s.rolled, timeField: ts, metaField: sensorId, aggregates: [value], bucket: {span: 1h, maxEvents: 3600}, rollups: [1m, 1h, 1d]}
`, db)
		p := startProxy(t, proxyOptions{yaml: yaml})
		via := connect(t, p.URI()).Database(db)
		dir := direct(t).Database(db)
		for _, c := range []struct {
			name string
			coll *mongo.Collection
		}{
			{"direct", dir.Collection("direct")},
			{"proxy", via.Collection("plain")},
			{"proxy+rollups", via.Collection("rolled")},
		} {
			docs := mk()
			coll := c.coll
			t0 := time.Now()
			for i := 0; i < len(docs); i += batch {
				if _, err := coll.InsertMany(ctx, docs[i:i+batch]); err != nil {
					t.Fatal(err)
				}
			}
			rates[c.name] = append(rates[c.name], float64(events)/time.Since(t0).Seconds())
		}
	}
	med := func(v []float64) float64 { s := slices.Clone(v); slices.Sort(s); return s[len(s)/2] }
	d, pr, rr := med(rates["direct"]), med(rates["proxy"]), med(rates["proxy+rollups"])
	t.Logf("events/s, median of %d runs of %d events (batch %d, %d series, 1s cadence):", runs, events, batch, series)
	t.Logf("direct %.0f | proxy %.0f (%.2fx direct) | proxy+rollups[1m,1h,1d] %.0f (%.2fx direct, %.2fx proxy)", d, pr, pr/d, rr, rr/d, rr/pr)
}

// checkRollups compares the rollup collection of res with the events
// acknowledged: counts and min/max exact, sums to rounding.
func checkRollups(t *testing.T, ctx context.Context, dbh *mongo.Database, res time.Duration, acked []sentEvent) {
	t.Helper()
	label := map[time.Duration]string{time.Minute: "1m", time.Hour: "1h", 24 * time.Hour: "1d"}[res]
	want := expectedRollups(acked, res)
	cur, err := dbh.Collection("readings.rollup_"+label).Find(ctx, bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	var got []rollupDoc
	if err := cur.All(ctx, &got); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("%s: %d rollup documents, want %d", label, len(got), len(want))
	}
	var total int64
	for _, g := range got {
		k := rollupKey(g.Meta, g.Start)
		w := want[k]
		if w == nil {
			t.Fatalf("%s: unexpected rollup %s", label, k)
		}
		total += g.Count
		if g.Count != w.count || math.Abs(g.Sum["value"]-w.sum) > 1e-6*math.Max(1, math.Abs(w.sum)) ||
			g.Min["value"] != w.min || g.Max["value"] != w.max {
			t.Fatalf("%s %s: got count %d sum %v min %v max %v; want %d %v %v %v", label, k, g.Count, g.Sum["value"], g.Min["value"], g.Max["value"], w.count, w.sum, w.min, w.max)
		}
		if minT, ok := g.Min["ts"].(bson.DateTime); !ok || !minT.Time().Equal(w.minT) {
			t.Fatalf("%s %s: min.ts %v, want %v", label, k, g.Min["ts"], w.minT)
		}
		if maxT, ok := g.Max["ts"].(bson.DateTime); !ok || !maxT.Time().Equal(w.maxT) {
			t.Fatalf("%s %s: max.ts %v, want %v", label, k, g.Max["ts"], w.maxT)
		}
	}
	if total != int64(len(acked)) {
		t.Fatalf("%s: rollups count %d events, %d were acknowledged", label, total, len(acked))
	}
}

// TestRollupsConcurrentWriters: 8 clients insert at once into different
// hours of the same series and day; their inserts hold different series
// locks but all add to the same 1-day rollup document, whose count and sum
// must still hold every acknowledged event (on FerretDB two concurrent
// $inc of one document lose one unless the proxy serializes them).
func TestRollupsConcurrentWriters(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: readingsRule(db, 1000) + "    rollups: [1h, 1d]\n"})
	acked := rollupLoad(t, ctx, db, []*testProxy{p}, 8, 10, func(int) string { return "sensor-00" })
	dbh := connect(t, p.URI()).Database(db)
	checkRollups(t, ctx, dbh, time.Hour, acked)
	checkRollups(t, ctx, dbh, 24*time.Hour, acked)
}

// rollupLoad runs clients inserting batches of 5 events each, client c
// through proxies[c%len(proxies)] into series sensorOf(c), hour c of a
// day, and returns the acknowledged events.
func rollupLoad(t *testing.T, ctx context.Context, db string, proxies []*testProxy, clients, batches int, sensorOf func(c int) string) []sentEvent {
	t.Helper()
	const perBatch = 5
	day := time.Date(2026, 7, 1, 0, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	var acked []sentEvent
	colls := make([]*mongo.Collection, clients)
	for c := range colls {
		colls[c] = connect(t, proxies[c%len(proxies)].URI()).Database(db).Collection("readings")
	}
	runClients(t, clients, func(c int) error {
		for b := 0; b < batches; b++ {
			batch := seriesBatch(sensorOf(c), day.Add(time.Duration(c)*time.Hour), b*perBatch, perBatch)
			if _, err := colls[c].InsertMany(ctx, eventDocs(batch)); err != nil {
				return fmt.Errorf("client %d through proxy %d: %w", c, c%len(proxies), err)
			}
			mu.Lock()
			acked = append(acked, batch...)
			mu.Unlock()
		}
		return nil
	})
	return acked
}

// TestRollupsThreeProxies: a rule with rollups, ingested through three
// proxies on one upstream at once. Where the rule stages (FerretDB), no
// insert needs the writer lease (its rollups count the events when the
// one proxy holding it merges them), so every proxy takes inserts; the
// rollups read through any proxy count every acknowledged event once.
func TestRollupsThreeProxies(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	yaml := readingsRule(db, 1000) + "    rollups: [1h, 1d]\n"
	var proxies []*testProxy
	for range 3 {
		proxies = append(proxies, startProxy(t, proxyOptions{yaml: yaml}))
	}
	acked := rollupLoad(t, ctx, db, proxies, 9, 12, func(c int) string { return fmt.Sprintf("sensor-%02d", c%4) })
	for i, p := range proxies {
		dbh := connect(t, p.URI()).Database(db)
		checkRollups(t, ctx, dbh, time.Hour, acked)
		checkRollups(t, ctx, dbh, 24*time.Hour, acked)
		n, err := dbh.Collection("readings").CountDocuments(ctx, bson.D{})
		if err != nil || n != int64(len(acked)) {
			t.Fatalf("events through proxy %d: %d, %v; want %d", i, n, err, len(acked))
		}
	}
}
