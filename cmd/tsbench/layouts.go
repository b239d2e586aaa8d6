package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/tsproxy/tsproxy/cmd/tsbench/internal/benchenv"
	"github.com/tsproxy/tsproxy/rules"
)

// layoutRules: tsbench.hits counts page hits per second in 1-minute
// buckets (tsbench.hitshour in 1-hour ones, for mergefill); tsbench.cpu
// keeps one sample per second in 1-hour buckets
// (values nested by minute), tsbench.cpumin in 1-minute buckets (flat):
// on an upstream where an update rewrites the whole document, the bucket
// size sets the write cost.
func layoutRules() ([]rules.Rule, error) {
	yaml := `rules:
  - namespace: tsbench.hits
    timeField: ts
    metaField: page
    layout: counter
    window: minute
    slot: second
  - namespace: tsbench.hitshour
    timeField: ts
    metaField: page
    layout: counter
    window: hour
    slot: second
  - namespace: tsbench.cpu
    timeField: ts
    metaField: host
    layout: slots
    valueField: value
    aggregates: [value]
    window: hour
    slot: second
  - namespace: tsbench.cpumin
    timeField: ts
    metaField: host
    layout: slots
    valueField: value
    aggregates: [value]
    window: minute
    slot: second
`
	return benchenv.RulesFromYAML(yaml)
}

// layoutCase is one layout and its events: the k-th event of n.
type layoutCase struct {
	name, coll, plain string
	event             func(k int) bson.D
	// stored is what the proxy's count of the namespace must be after n
	// events: every event for both (a counter counts events; a sample is
	// one document per slot, and each event has a slot of its own here).
	stored func(n int) int64
}

var layoutBase = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

var layoutCases = []layoutCase{
	{name: "counter (10 pages, 10 hits/s each)", coll: "hits", plain: "plain_hits",
		event: func(k int) bson.D {
			return bson.D{{Key: "page", Value: fmt.Sprintf("/p%d", k%10)}, {Key: "ts", Value: layoutBase.Add(time.Duration(k/100)*time.Second + time.Duration(k%100)*time.Millisecond)}}
		}, stored: func(n int) int64 { return int64(n) }},
	{name: "slots, 1-hour window (10 hosts, 1 sample/s each)", coll: "cpu", plain: "plain_cpu",
		event: func(k int) bson.D {
			return bson.D{{Key: "host", Value: fmt.Sprintf("h%02d", k%10)}, {Key: "ts", Value: layoutBase.Add(time.Duration(k/10) * time.Second)}, {Key: "value", Value: float64(k%1000) / 10}}
		}, stored: func(n int) int64 { return int64(n) }},
	{name: "slots, 1-minute window (flat)", coll: "cpumin", plain: "plain_cpumin",
		event: func(k int) bson.D {
			return bson.D{{Key: "host", Value: fmt.Sprintf("h%02d", k%10)}, {Key: "ts", Value: layoutBase.Add(time.Duration(k/10) * time.Second)}, {Key: "value", Value: float64(k%1000) / 10}}
		}, stored: func(n int) int64 { return int64(n) }},
}

// benchLayouts inserts the same events through the proxy into the counter
// and slots layouts and directly as plain documents, in the order A B B A
// (layoutRun), and reports events/s, documents and sizes. With prefill,
// each run's collections first get that many events, the ones before
// the timed events (at batch 1000, flushed): a rule with history.
func benchLayouts(e *benchenv.Env, runs, events, batch, prefill int) error {
	ctx := context.Background()
	cs, err := e.ConnectBoth(10*time.Minute, 0)
	if err != nil {
		return err
	}
	defer cs.Close()
	proxyC, directC := cs.Proxy, cs.Direct
	db := func(c *mongo.Client) *mongo.Database { return c.Database("tsbench") }
	rates := map[string][]float64{}
	flushes := map[string][]float64{} // seconds
	for r := 0; r < runs; r++ {
		for _, lc := range layoutCases {
			_ = db(directC).Collection(lc.plain).Drop(ctx)
			_ = db(proxyC).Collection(lc.coll).Drop(ctx)
			if err := prefillLayout(ctx, db(directC).Collection(lc.plain), db(proxyC).Collection(lc.coll), proxyC, lc, prefill); err != nil {
				return fmt.Errorf("%s: prefill: %w", lc.name, err)
			}
			res, err := layoutRun(ctx, db(directC).Collection(lc.plain), db(proxyC).Collection(lc.coll), proxyC, lc, prefill, prefill+events, batch)
			if err != nil {
				return fmt.Errorf("%s: %w", lc.name, err)
			}
			direct, proxy, flush := res.direct, res.proxy, res.flush
			rates[lc.name+"direct"] = append(rates[lc.name+"direct"], direct)
			rates[lc.name+"proxy"] = append(rates[lc.name+"proxy"], proxy)
			flushes[lc.name] = append(flushes[lc.name], flush.Seconds())
			fmt.Fprintf(os.Stderr, "  run %d %s: direct %.0f events/s, proxy %.0f events/s sustained (flush %.2f s, its slowest steps: %s); ratio %.2f\n",
				r+1, lc.name, direct, proxy, flush.Seconds(), res.slowest, proxy/direct)
		}
		fmt.Printf("run %d/%d done\n", r+1, runs)
	}
	fmt.Printf("\nmedians of %d runs; %d events per case (after %d prefilled), insertMany of %d, one client; the proxy's time includes a tsproxyFlush\n\n", runs, events, prefill, batch)
	fmt.Println("| layout | direct plain events/s | proxy events/s | proxy/direct | median of the runs' ratios | flush s |")
	fmt.Println("|---|---:|---:|---:|---:|---:|")
	for _, lc := range layoutCases {
		ds, ps := rates[lc.name+"direct"], rates[lc.name+"proxy"]
		var ratios []float64
		for i := range min(len(ds), len(ps)) {
			ratios = append(ratios, ps[i]/ds[i])
		}
		d, p := benchenv.Median(ds), benchenv.Median(ps)
		fmt.Printf("| %s | %.0f | %.0f | %.2f | %.2f | %.2f |\n", lc.name, d, p, p/d, benchenv.Median(ratios), benchenv.Median(flushes[lc.name]))
	}
	fmt.Printf("\nstorage after %d events (collStats), and the proxy's count of them:\n\n", events)
	fmt.Println("| layout | plain documents | bucket documents | plain data bytes | bucket data bytes | plain index bytes | bucket index bytes | count via proxy |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|---:|")
	for _, lc := range layoutCases {
		for _, c := range []*mongo.Collection{db(directC).Collection(lc.plain), db(proxyC).Collection(lc.coll)} {
			_ = c.Drop(ctx)
			if _, err := insertLayout(ctx, c, lc, 0, events, batch); err != nil {
				return err
			}
		}
		if _, _, err := tsproxyFlush(ctx, proxyC); err != nil {
			return err
		}
		pl, err := stats(ctx, db(directC), lc.plain)
		if err != nil {
			return err
		}
		bu, err := stats(ctx, db(directC), lc.coll+".buckets")
		if err != nil {
			return err
		}
		own, err := ruleOwnStats(ctx, db(directC), lc.coll+".buckets")
		if err != nil {
			return err
		}
		for _, o := range own {
			bu.add(o.collStats)
		}
		n, err := db(proxyC).Collection(lc.coll).CountDocuments(ctx, bson.D{})
		if err != nil {
			return err
		}
		if n != lc.stored(events) {
			return fmt.Errorf("%s: the proxy counts %d, want %d", lc.name, n, lc.stored(events))
		}
		fmt.Printf("| %s | %d | %d | %d | %d | %d | %d | %d |\n", lc.name, pl.count, bu.count, pl.size, bu.size, pl.indexSize, bu.indexSize, n)
	}
	return nil
}

// prefillLayout writes events 0 to n of lc into plain directly and into
// coll through the proxy, at batch 1000, and flushes.
func prefillLayout(ctx context.Context, plain, coll *mongo.Collection, proxyC *mongo.Client, lc layoutCase, n int) error {
	if n == 0 {
		return nil
	}
	for _, c := range []*mongo.Collection{plain, coll} {
		if _, err := insertLayout(ctx, c, lc, 0, n, 1000); err != nil {
			return err
		}
	}
	_, _, err := tsproxyFlush(ctx, proxyC)
	return err
}

// layoutRun times one run of a layout case, events from to to, in the
// order ingestRun uses, A B B A: the first half of the events direct
// into plain, all of them through the proxy into coll (in the same two
// halves, then a tsproxyFlush: sustained, until every event is in its
// bucket; on FerretDB the layouts stage, then merge), then the second
// half direct. Both paths' times are then centred on the same moment, so
// a machine whose speed drifts through the run slows or speeds both
// alike.
func layoutRun(ctx context.Context, plain, coll *mongo.Collection, proxyC *mongo.Client, lc layoutCase, from, to, batch int) (layoutResult, error) {
	n, half := to-from, from+(to-from)/2
	d1, err := insertLayout(ctx, plain, lc, from, half, batch)
	if err != nil {
		return layoutResult{}, fmt.Errorf("direct: %w", err)
	}
	var p time.Duration
	for _, r := range [][2]int{{from, half}, {half, to}} {
		d, err := insertLayout(ctx, coll, lc, r[0], r[1], batch)
		if err != nil {
			return layoutResult{}, fmt.Errorf("proxy: %w", err)
		}
		p += d
	}
	fr, flush, err := tsproxyFlush(ctx, proxyC)
	if err != nil {
		return layoutResult{}, fmt.Errorf("tsproxyFlush: %w", err)
	}
	d2, err := insertLayout(ctx, plain, lc, half, to, batch)
	if err != nil {
		return layoutResult{}, fmt.Errorf("direct: %w", err)
	}
	return layoutResult{direct: float64(n) / (d1 + d2).Seconds(), proxy: float64(n) / (p + flush).Seconds(), flush: flush, slowest: fr.slowest}, nil
}

// layoutResult is one layoutRun: both paths' events/s, the flush's time
// and its slowest kinds of upstream step.
type layoutResult struct {
	direct, proxy float64
	flush         time.Duration
	slowest       string
}

// insertLayout inserts events from to to of lc, in insertMany calls of
// batch events, and times it.
func insertLayout(ctx context.Context, coll *mongo.Collection, lc layoutCase, from, to, batch int) (time.Duration, error) {
	docs := make([]any, 0, batch)
	t0 := time.Now()
	for k := from; k < to; k++ {
		docs = append(docs, lc.event(k))
		if len(docs) == batch || k == to-1 {
			if _, err := coll.InsertMany(ctx, docs); err != nil {
				return 0, err
			}
			docs = docs[:0]
		}
	}
	return time.Since(t0), nil
}
