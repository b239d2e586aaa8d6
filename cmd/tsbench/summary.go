package main

import (
	"context"
	"fmt"
	"math"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/tsproxy/tsproxy/cmd/tsbench/internal/benchenv"
	"github.com/tsproxy/tsproxy/rules"
)

// summaryRules buckets tsbench.summary: 1-second data in 1-hour buckets
// with the value summarised.
func summaryRules() ([]rules.Rule, error) {
	yaml := `rules:
  - namespace: tsbench.summary
    timeField: ts
    metaField: sensor
    bucket: {span: 1h, maxEvents: 3600}
    aggregates: [value]
`
	return benchenv.RulesFromYAML(yaml)
}

// hourStats is one hour of the benchmark's answer.
type hourStats struct {
	n                  int64
	sum, min, max, avg float64
}

// benchSummary loads a day of 1-second data through the proxy (buckets)
// and directly (plain documents), then times, interleaved in each run:
//   - the hourly count/sum/min/max aggregate through the proxy (answered
//     from bucket summaries);
//   - the same computed from a direct scan of the plain collection (FerretDB
//     has neither $dateTrunc nor $min/$max accumulators to run it itself);
//   - a whole-day {$sum: "$value"} and a whole-day {$avg: "$value"}
//     through the proxy, and run by the upstream itself on the plain
//     collection (FerretDB lacks $avg: there the direct side is a $sum
//     and a count, two commands).
//
// The values are in steps of 1/64, so every sum is exact in doubles: the
// summaries answer (they decline sums that could round, see
// rewrite/summary) and the answers agree to the last bit.
func benchSummary(e *benchenv.Env, runs int) error {
	ctx := context.Background()
	cs, err := e.ConnectBoth(10*time.Minute, 0)
	if err != nil {
		return err
	}
	defer cs.Close()
	proxyC, directC := cs.Proxy, cs.Direct
	bucketed := proxyC.Database("tsbench").Collection("summary")
	plain := directC.Database("tsbench").Collection("summary_plain")
	day := time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC)
	if err := loadDay(ctx, bucketed, plain, day); err != nil {
		return err
	}
	hourly := bson.A{bson.D{{Key: "$group", Value: bson.D{
		{Key: "_id", Value: bson.D{{Key: "$dateTrunc", Value: bson.D{{Key: "date", Value: "$ts"}, {Key: "unit", Value: "hour"}}}}},
		{Key: "n", Value: bson.D{{Key: "$count", Value: bson.D{}}}},
		{Key: "sum", Value: bson.D{{Key: "$sum", Value: "$value"}}},
		{Key: "min", Value: bson.D{{Key: "$min", Value: "$value"}}},
		{Key: "max", Value: bson.D{{Key: "$max", Value: "$value"}}},
		{Key: "avg", Value: bson.D{{Key: "$avg", Value: "$value"}}},
	}}}}
	total := bson.A{bson.D{{Key: "$group", Value: bson.D{{Key: "_id", Value: nil}, {Key: "sum", Value: bson.D{{Key: "$sum", Value: "$value"}}}}}}}
	average := bson.A{bson.D{{Key: "$group", Value: bson.D{{Key: "_id", Value: nil}, {Key: "sum", Value: bson.D{{Key: "$avg", Value: "$value"}}}}}}}
	_, avgErr := daySum(ctx, plain, average)
	hasAvg := avgErr == nil
	// A $match on the value cuts buckets: the summaries decline it, and
	// the proxy's own engine runs the pipeline over the events.
	engine := append(bson.A{bson.D{{Key: "$match", Value: bson.D{{Key: "value", Value: bson.D{{Key: "$gte", Value: 0}}}}}}}, hourly...)
	var tProxy, tScan, tEngine, tProxyTotal, tDirectTotal, tProxyAvg, tDirectAvg []float64
	for r := 0; r < runs; r++ {
		t0 := time.Now()
		got, err := proxyHourly(ctx, bucketed, hourly)
		if err != nil {
			return fmt.Errorf("proxy hourly aggregate: %w", err)
		}
		tProxy = append(tProxy, time.Since(t0).Seconds()*1000)
		t0 = time.Now()
		want, err := scanHourly(ctx, plain)
		if err != nil {
			return fmt.Errorf("direct scan: %w", err)
		}
		tScan = append(tScan, time.Since(t0).Seconds()*1000)
		if err := sameHours(got, want); err != nil {
			return err
		}
		t0 = time.Now()
		fromEngine, err := proxyHourly(ctx, bucketed, engine)
		if err != nil {
			return fmt.Errorf("proxy hourly aggregate (engine): %w", err)
		}
		tEngine = append(tEngine, time.Since(t0).Seconds()*1000)
		if err := sameHours(fromEngine, want); err != nil {
			return fmt.Errorf("engine: %w", err)
		}
		var ps, ds float64
		t0 = time.Now()
		if ps, err = daySum(ctx, bucketed, total); err != nil {
			return fmt.Errorf("proxy day sum: %w", err)
		}
		tProxyTotal = append(tProxyTotal, time.Since(t0).Seconds()*1000)
		t0 = time.Now()
		if ds, err = daySum(ctx, plain, total); err != nil {
			return fmt.Errorf("direct day sum: %w", err)
		}
		tDirectTotal = append(tDirectTotal, time.Since(t0).Seconds()*1000)
		if ps != ds {
			return fmt.Errorf("day sums differ: proxy %v, direct %v", ps, ds)
		}
		t0 = time.Now()
		if ps, err = daySum(ctx, bucketed, average); err != nil {
			return fmt.Errorf("proxy day average: %w", err)
		}
		tProxyAvg = append(tProxyAvg, time.Since(t0).Seconds()*1000)
		t0 = time.Now()
		if ds, err = dayAvgDirect(ctx, plain, hasAvg, average, total); err != nil {
			return fmt.Errorf("direct day average: %w", err)
		}
		tDirectAvg = append(tDirectAvg, time.Since(t0).Seconds()*1000)
		if ps != ds {
			return fmt.Errorf("day averages differ: proxy %v, direct %v", ps, ds)
		}
	}
	fmt.Printf("a day of 1-second data (86400 events, 24 buckets), %d runs, medians:\n", runs)
	fmt.Printf("  hourly count/sum/min/max/avg proxy (summaries) %8.1f ms   direct scan + Go %8.1f ms   ratio %.3f\n", benchenv.Median(tProxy), benchenv.Median(tScan), benchenv.Median(tProxy)/benchenv.Median(tScan))
	fmt.Printf("  same, value filter           proxy (engine)    %8.1f ms   direct scan + Go %8.1f ms   ratio %.3f\n", benchenv.Median(tEngine), benchenv.Median(tScan), benchenv.Median(tEngine)/benchenv.Median(tScan))
	fmt.Printf("  day $sum                     proxy (summaries) %8.1f ms   direct $group    %8.1f ms   ratio %.3f\n", benchenv.Median(tProxyTotal), benchenv.Median(tDirectTotal), benchenv.Median(tProxyTotal)/benchenv.Median(tDirectTotal))
	fmt.Printf("  day $avg                     proxy (summaries) %8.1f ms   direct $sum+count %7.1f ms   ratio %.3f\n", benchenv.Median(tProxyAvg), benchenv.Median(tDirectAvg), benchenv.Median(tProxyAvg)/benchenv.Median(tDirectAvg))
	return nil
}

func loadDay(ctx context.Context, bucketed, plain *mongo.Collection, day time.Time) error {
	_ = bucketed.Drop(ctx)
	_ = plain.Drop(ctx)
	for h := 0; h < 24; h++ {
		docs := make([]any, 0, 3600)
		for s := 0; s < 3600; s++ {
			ts := day.Add(time.Duration(h*3600+s) * time.Second)
			v := math.Round((20+10*math.Sin(float64(h*3600+s)/5000))*64) / 64
			docs = append(docs, bson.D{{Key: "ts", Value: ts}, {Key: "sensor", Value: "s1"}, {Key: "value", Value: v}})
		}
		if _, err := bucketed.InsertMany(ctx, docs); err != nil {
			return fmt.Errorf("proxy insert: %w", err)
		}
		if _, err := plain.InsertMany(ctx, docs); err != nil {
			return fmt.Errorf("direct insert: %w", err)
		}
	}
	return nil
}

func proxyHourly(ctx context.Context, c *mongo.Collection, pipeline bson.A) (map[int64]hourStats, error) {
	cur, err := c.Aggregate(ctx, pipeline)
	if err != nil {
		return nil, err
	}
	var rows []struct {
		ID  bson.DateTime `bson:"_id"`
		N   int64         `bson:"n"`
		Sum float64       `bson:"sum"`
		Min float64       `bson:"min"`
		Max float64       `bson:"max"`
		Avg float64       `bson:"avg"`
	}
	if err := cur.All(ctx, &rows); err != nil {
		return nil, err
	}
	out := map[int64]hourStats{}
	for _, r := range rows {
		out[int64(r.ID)] = hourStats{n: r.N, sum: r.Sum, min: r.Min, max: r.Max, avg: r.Avg}
	}
	return out, nil
}

func scanHourly(ctx context.Context, c *mongo.Collection) (map[int64]hourStats, error) {
	cur, err := c.Find(ctx, bson.D{}, options.Find().SetProjection(bson.D{{Key: "ts", Value: 1}, {Key: "value", Value: 1}}))
	if err != nil {
		return nil, err
	}
	defer cur.Close(ctx)
	out := map[int64]hourStats{}
	for cur.Next(ctx) {
		var row struct {
			TS    bson.DateTime `bson:"ts"`
			Value float64       `bson:"value"`
		}
		if err := cur.Decode(&row); err != nil {
			return nil, err
		}
		h := int64(row.TS) - int64(row.TS)%3600000
		s, seen := out[h]
		if !seen || row.Value < s.min {
			s.min = row.Value
		}
		if !seen || row.Value > s.max {
			s.max = row.Value
		}
		s.n++
		s.sum += row.Value
		s.avg = s.sum / float64(s.n)
		out[h] = s
	}
	return out, cur.Err()
}

func sameHours(got, want map[int64]hourStats) error {
	if len(got) != len(want) {
		return fmt.Errorf("proxy answered %d hours, the scan %d", len(got), len(want))
	}
	for h, w := range want {
		g := got[h]
		if g != w {
			return fmt.Errorf("hour %v: proxy %+v, scan %+v", time.UnixMilli(h).UTC(), g, w)
		}
	}
	return nil
}

func daySum(ctx context.Context, c *mongo.Collection, pipeline bson.A) (float64, error) {
	cur, err := c.Aggregate(ctx, pipeline)
	if err != nil {
		return 0, err
	}
	var rows []struct {
		Sum float64 `bson:"sum"`
	}
	if err := cur.All(ctx, &rows); err != nil {
		return 0, err
	}
	if len(rows) != 1 {
		return 0, fmt.Errorf("%d rows, want 1", len(rows))
	}
	return rows[0].Sum, nil
}

// dayAvgDirect is the day's $avg run by the upstream: $avg where it has
// it (hasAvg), else its $sum divided by its count of events with a value.
func dayAvgDirect(ctx context.Context, c *mongo.Collection, hasAvg bool, avg, total bson.A) (float64, error) {
	if hasAvg {
		return daySum(ctx, c, avg)
	}
	sum, err := daySum(ctx, c, total)
	if err != nil {
		return 0, err
	}
	n, err := c.CountDocuments(ctx, bson.D{{Key: "value", Value: bson.D{{Key: "$type", Value: "number"}}}})
	if err != nil {
		return 0, err
	}
	return sum / float64(n), nil
}
