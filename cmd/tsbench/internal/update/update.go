// Package update is `tsbench update`: what an update costs per matched
// event through the proxy.
package update

import (
	"context"
	"fmt"
	"os"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/tsproxy/tsproxy/cmd/tsbench/internal/benchenv"
	"github.com/tsproxy/tsproxy/rules"
)

// `tsbench update`: what an update costs per matched event through the
// proxy against the same update of a plain collection holding the same
// events (indexed on {sensor: 1, ts: 1}), at 1, 100 and 10,000 matched
// events, interleaved run by run: 20 series of 1,000 events over a day,
// merged into buckets (maxEvents 1,000, 1-hour windows) before timing.

const (
	updSeries    = 20
	updPerSeries = 1000
	updEvery     = 86 * time.Second // 1,000 events a series over a day
)

var updBase = time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC)

// Rules are the rule the run writes through the proxy.
func Rules() ([]rules.Rule, error) {
	return benchenv.RulesFromYAML(`rules:
  - namespace: tsbench.upd
    timeField: ts
    metaField: sensor
    bucket: {span: 1h, maxEvents: 1000}
`)
}

// updateCase is one timed update: the same filter and update on both.
type updateCase struct {
	name    string
	matched int
	filter  func(run int) bson.D
}

func updateCases() []updateCase {
	series := func(i int) string { return fmt.Sprintf("s%02d", i) }
	return []updateCase{
		{"1 event (series and time)", 1, func(run int) bson.D {
			return bson.D{{Key: "sensor", Value: series(run % updSeries)}, {Key: "ts", Value: updBase.Add(time.Duration(500+run) * updEvery)}}
		}},
		{"100 events (1 series, a time range)", 100, func(run int) bson.D {
			from := updBase.Add(time.Duration(100*(run%9)) * updEvery)
			return bson.D{{Key: "sensor", Value: series(run % updSeries)}, {Key: "ts", Value: bson.D{{Key: "$gte", Value: from}, {Key: "$lt", Value: from.Add(100 * updEvery)}}}}
		}},
		{"10,000 events (10 series)", 10_000, func(run int) bson.D {
			in := bson.A{}
			for i := range 10 {
				in = append(in, series((run+i)%updSeries))
			}
			return bson.D{{Key: "sensor", Value: bson.D{{Key: "$in", Value: in}}}}
		}},
	}
}

// Run loads both sides and prints the table of updateCases, medians of
// runs.
func Run(e *benchenv.Env, runs int) error {
	ctx := context.Background()
	cs, err := e.ConnectBoth(30*time.Minute, 0)
	if err != nil {
		return err
	}
	defer cs.Close()
	proxied := cs.Proxy.Database("tsbench").Collection("upd")
	plain := cs.Direct.Database("tsbench").Collection("updplain")
	_ = proxied.Drop(ctx)
	_ = plain.Drop(ctx)
	if _, err := plain.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: "sensor", Value: 1}, {Key: "ts", Value: 1}}}); err != nil {
		return err
	}
	var docs []any
	for s := range updSeries {
		for i := range updPerSeries {
			docs = append(docs, bson.D{{Key: "ts", Value: updBase.Add(time.Duration(i) * updEvery)}, {Key: "sensor", Value: fmt.Sprintf("s%02d", s)}, {Key: "value", Value: float64(i)}})
		}
	}
	loadStart := time.Now()
	for i := 0; i < len(docs); i += 1000 {
		batch := docs[i:min(i+1000, len(docs))]
		if _, err := proxied.InsertMany(ctx, batch, options.InsertMany().SetOrdered(false)); err != nil {
			return fmt.Errorf("load through the proxy: %w", err)
		}
		if _, err := plain.InsertMany(ctx, batch, options.InsertMany().SetOrdered(false)); err != nil {
			return fmt.Errorf("load directly: %w", err)
		}
	}
	if _, _, err := benchenv.Flush(ctx, cs.Proxy); err != nil {
		return fmt.Errorf("tsproxyFlush: %w", err)
	}
	fmt.Fprintf(os.Stderr, "loaded %d events both ways and merged in %v\n", len(docs), time.Since(loadStart).Round(time.Millisecond))
	inc := bson.D{{Key: "$inc", Value: bson.D{{Key: "value", Value: 1.0}}}}
	fmt.Printf("tsbench update: %d series × %d events, upstream %s, %d runs (medians)\n\n", updSeries, updPerSeries, e.UpstreamURI, runs)
	fmt.Println("| update ($inc) | matched | direct ms | proxy ms | proxy µs/event | direct µs/event | proxy / direct time |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|")
	for _, c := range updateCases() {
		var pms, dms []float64
		for run := range runs {
			f := c.filter(run)
			for _, side := range []struct {
				coll *mongo.Collection
				out  *[]float64
			}{{proxied, &pms}, {plain, &dms}} {
				start := time.Now()
				res, err := side.coll.UpdateMany(ctx, f, inc)
				if err != nil {
					return fmt.Errorf("%s: %w", c.name, err)
				}
				if int(res.MatchedCount) != c.matched {
					return fmt.Errorf("%s on %s: matched %d, want %d", c.name, side.coll.Name(), res.MatchedCount, c.matched)
				}
				*side.out = append(*side.out, float64(time.Since(start).Microseconds())/1000)
				fmt.Fprintf(os.Stderr, "%s run %d %s: %v\n", c.name, run, side.coll.Name(), time.Since(start).Round(time.Millisecond))
			}
		}
		d, p := benchenv.Median(dms), benchenv.Median(pms)
		fmt.Printf("| %s | %d | %.1f | %.1f | %.0f | %.0f | %.2fx |\n", c.name, c.matched, d, p, p*1000/float64(c.matched), d*1000/float64(c.matched), p/d)
	}
	return nil
}
