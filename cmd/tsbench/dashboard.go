package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/tsproxy/tsproxy/cmd/tsbench/internal/benchenv"
	"github.com/tsproxy/tsproxy/rules"
)

// The dashboard benchmark: a rule with history (-prefill) takes per-event
// inserts while a dashboard reads it, one client doing both in turn: every
// -read-every inserts, the last five minutes of one series, read twice. A read
// of a staged rule merges what is staged first, so the
// first read pays for the merge of the inserts before it (on an open
// window: the top-up of each series' last bucket, which on the stock
// command and PostgreSQL rewrites it by _id and so scans the rule's
// buckets) and the second read does not: their difference is what the
// merge costs the dashboard, and how it grows with -prefill is the
// question. The direct path does the same on a plain collection, where
// FerretDB scans every event of the history at each read.

// dashboardDirectReads is how many rounds of the direct path read.
const dashboardDirectReads = 3

// dashboardDB is the database of run r (1-based).
func dashboardDB(r int) string { return fmt.Sprintf("tsbench_dash_r%d", r) }

// dashboardRules buckets <db>.events of every run as ingest does.
func dashboardRules(runs int) ([]rules.Rule, error) {
	var b strings.Builder
	b.WriteString("rules:\n")
	for r := 1; r <= max(runs, 1); r++ {
		writeIngestRule(&b, dashboardDB(r)+"."+ingestColl, "")
	}
	return benchenv.RulesFromYAML(b.String())
}

// dashboardPath is what one path (direct or proxy) measured in a run.
type dashboardPath struct {
	inserts      time.Duration   // the inserts' time, reads left out
	first, again []time.Duration // each read's time: after inserts, and right after that
	returned     []int           // the events each first read returned
	// fill is, for each read, how many events of the series read its
	// open bucket held (the bucket a top-up rewrites): the rule cuts a
	// series' window into buckets of maxEvents, in time order.
	fill []int
	// afterRead are the times of the first insert after each read,
	// otherCalls those of the other inserts.
	afterRead, otherCalls []time.Duration
}

func (p dashboardPath) rate(n int) float64 { return float64(n) / p.inserts.Seconds() }

// dashboardRun inserts batches (one event each) into coll, reading the
// last five minutes of series s0 after every `every` of them, twice, in
// the first maxReads rounds (a read of the plain collection takes seconds
// with history: a few place it).
func dashboardRun(ctx context.Context, coll *mongo.Collection, batches [][]any, every, maxReads int) (dashboardPath, error) {
	var p dashboardPath
	read := func(t time.Time) (time.Duration, int, error) {
		t0 := time.Now()
		cur, err := coll.Find(ctx, bson.D{{Key: "sensor", Value: "s0"}, {Key: "ts", Value: bson.D{{Key: "$gte", Value: t.Add(-5 * time.Minute)}}}})
		if err != nil {
			return 0, 0, err
		}
		var docs []bson.Raw
		if err := cur.All(ctx, &docs); err != nil {
			return 0, 0, err
		}
		return time.Since(t0), len(docs), nil
	}
	readBefore := false // the round before read
	for lo := 0; lo < len(batches); lo += every {
		chunk := batches[lo:min(lo+every, len(batches))]
		d, calls, err := ingest(ctx, coll, chunk, 1)
		if err != nil {
			return p, fmt.Errorf("insert: %w", err)
		}
		p.inserts += d
		if readBefore && len(calls) > 0 {
			// The first insert after a read: on a staged rule, the read's
			// merge froze the staging collection, and this insert makes
			// the next one.
			p.afterRead = append(p.afterRead, calls[0])
			calls = calls[1:]
		}
		p.otherCalls = append(p.otherCalls, calls...)
		if readBefore = len(p.first) < maxReads; !readBefore {
			continue
		}
		last := chunk[len(chunk)-1][0].(bson.D)
		t := last[0].Value.(time.Time)
		d1, n, err := read(t)
		if err != nil {
			return p, fmt.Errorf("read: %w", err)
		}
		d2, n2, err := read(t)
		if err != nil {
			return p, fmt.Errorf("read again: %w", err)
		}
		if n2 != n {
			return p, fmt.Errorf("read again returned %d events, the first read %d", n2, n)
		}
		p.first, p.again, p.returned = append(p.first, d1), append(p.again, d2), append(p.returned, n)
		p.fill = append(p.fill, openBucketFill(t))
	}
	return p, nil
}

func benchDashboard(e *benchenv.Env, runs, events, every int) error {
	if every <= 0 {
		return fmt.Errorf("-read-every must be positive")
	}
	ctx := context.Background()
	cs, err := e.ConnectBoth(10*time.Minute, 4)
	if err != nil {
		return err
	}
	defer cs.Close()
	if _, _, err := tsproxyFlush(ctx, cs.Proxy); err != nil {
		return fmt.Errorf("warm-up tsproxyFlush: %w", err)
	}
	batches := ingestBatches(events, 1)
	var direct, proxied []dashboardPath
	for r := 1; r <= runs; r++ {
		db := dashboardDB(r)
		if err := prefillRun(ctx, cs.Direct, cs.Proxy, db); err != nil {
			return err
		}
		// Alternate which path goes first: the machine drifts.
		paths := []struct {
			name  string
			coll  *mongo.Collection
			out   *[]dashboardPath
			reads int
		}{
			{"direct", cs.Direct.Database(db).Collection(plainColl), &direct, dashboardDirectReads},
			{"proxy", cs.Proxy.Database(db).Collection(ingestColl), &proxied, len(batches)},
		}
		if r%2 == 0 {
			paths[0], paths[1] = paths[1], paths[0]
		}
		var got [2]dashboardPath
		for i, p := range paths {
			res, err := dashboardRun(ctx, p.coll, batches, every, p.reads)
			if err != nil {
				return fmt.Errorf("run %d, %s: %w", r, p.name, err)
			}
			*p.out = append(*p.out, res)
			got[i] = res
		}
		common := min(len(got[0].returned), len(got[1].returned))
		if !slices.Equal(got[0].returned[:common], got[1].returned[:common]) {
			return fmt.Errorf("run %d: the reads returned different events: %s %v, %s %v", r, paths[0].name, got[0].returned, paths[1].name, got[1].returned)
		}
		// Where such a merge goes: one more round of inserts on both
		// paths, then a flush in place of the read, whose reply times
		// its steps.
		more := ingestBatchesFrom(ingestStart.Add(time.Duration(events/ingestSeries)*time.Second), every, 1)
		for _, p := range paths {
			if _, _, err := ingest(ctx, p.coll, more, 1); err != nil {
				return fmt.Errorf("run %d, %s: %w", r, p.name, err)
			}
		}
		fr, fd, err := tsproxyFlush(ctx, cs.Proxy)
		if err != nil {
			return fmt.Errorf("run %d: tsproxyFlush: %w", r, err)
		}
		fmt.Fprintf(os.Stderr, "  run %d: a flush of %d more inserts (and of the stale event-id index entries the reads' merges left waiting) took %.1f ms: %d events into %d buckets; %s\n", r, every, ms(fd), fr.events, fr.buckets, slowestSteps(fr.steps, 6))
		st, err := settled(ctx, cs.Direct.Database(db), e.IndexBytes)
		if err != nil {
			return fmt.Errorf("run %d: %w", r, err)
		}
		want := int64(events + every + max(ingestArgs.prefill, 0))
		if st.stored != want || st.plainN != want || len(st.leftover) > 0 {
			return fmt.Errorf("run %d: %d events in all; stored: %d in buckets, %d plain, staging left: %v", r, want, st.stored, st.plainN, st.leftover)
		}
		buckets := cs.Direct.Database(db).Collection(bucketColl)
		nBuckets, err := buckets.CountDocuments(ctx, bson.D{})
		if err != nil {
			return fmt.Errorf("run %d: count buckets: %w", r, err)
		}
		small, err := buckets.CountDocuments(ctx, bson.D{{Key: "count", Value: bson.D{{Key: "$lt", Value: 100}}}})
		if err != nil {
			return fmt.Errorf("run %d: count small buckets: %w", r, err)
		}
		d, p := direct[len(direct)-1], proxied[len(proxied)-1]
		fmt.Fprintf(os.Stderr, "  run %d: inserts direct %.0f ev/s, proxy %.0f ev/s; read p50 ms direct %.1f / %.1f, proxy %.1f / %.1f (first / again); %d buckets, %d of them with fewer than 100 events (%d documents with the event-id index and the records of merged retryable writes)\n",
			r, d.rate(events), p.rate(events), ms(p50(d.first)), ms(p50(d.again)), ms(p50(p.first)), ms(p50(p.again)), nBuckets, small, st.bucketN)
		if err := cs.Direct.Database(db).Drop(ctx); err != nil {
			return fmt.Errorf("drop %s: %w", db, err)
		}
	}
	med := func(ps []dashboardPath, f func(dashboardPath) float64) float64 {
		xs := make([]float64, len(ps))
		for i, p := range ps {
			xs[i] = f(p)
		}
		return benchenv.Median(xs)
	}
	first := func(p dashboardPath) float64 { return ms(p50(p.first)) }
	firstP95 := func(p dashboardPath) float64 { return ms(percentileOf(p.first, 0.95)) }
	firstMean := func(p dashboardPath) float64 {
		var sum time.Duration
		for _, d := range p.first {
			sum += d
		}
		return ms(sum) / float64(max(len(p.first), 1))
	}
	again := func(p dashboardPath) float64 { return ms(p50(p.again)) }
	rate := func(p dashboardPath) float64 { return p.rate(events) }
	fmt.Printf("\ndashboard: %d events of history (-prefill), then %d per-event inserts, the last 5 minutes of one series read twice after every %d (the direct path: in the first %d rounds); medians of %d runs\n\n",
		max(ingestArgs.prefill, 0), events, every, dashboardDirectReads, runs)
	fmt.Println("| path | inserts ev/s | read p50 ms, after inserts | read p50 ms, again | the merge's share (first - again) ms | read after inserts: mean / p95 ms | insert p50 ms: the first after a read / the others |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|")
	for _, row := range []struct {
		name string
		ps   []dashboardPath
	}{{"direct", direct}, {"proxy", proxied}} {
		f, a := med(row.ps, first), med(row.ps, again)
		fmt.Printf("| %s | %.0f | %.1f | %.1f | %.1f | %.1f / %.1f | %.2f / %.2f |\n", row.name, med(row.ps, rate), f, a, f-a, med(row.ps, firstMean), med(row.ps, firstP95),
			med(row.ps, func(p dashboardPath) float64 { return ms(p50(p.afterRead)) }), med(row.ps, func(p dashboardPath) float64 { return ms(p50(p.otherCalls)) }))
	}
	q := fillQuarters(proxied)
	fmt.Printf("\nThe merge's share of a read through the proxy (ms, median of every read of every run), by where the series read stood in its run of %d events (maxEvents; unbounded top-ups rewrote a bucket that full): 1-250 %.1f, 251-500 %.1f, 501-750 %.1f, 751-1000 %.1f\n",
		ingestMaxEvents, q[0], q[1], q[2], q[3])
	return nil
}

// openBucketFill is how many events of a series its open bucket would
// hold once its event at t is in, were buckets filled to maxEvents in time
// order: ingestBatchesFrom's series have one event a second from
// ingestStart (a window start of the rule's 1-hour span, writeIngestRule)
// on, and -prefill's end there. Merges of a few events top up a bucket
// only while it is small, so past that floor this
// is where the series stands in its run of maxEvents, not the fill of the
// bucket a merge rewrites: a merge's share flat across the quarters is
// what that bound is for.
func openBucketFill(t time.Time) int {
	inWindow := int(t.Sub(t.Truncate(time.Hour))/time.Second) + 1
	return (inWindow-1)%ingestMaxEvents + 1
}

// fillQuarters are the medians of the merge's share of a read (the first
// read less the second), by the quarter of maxEvents the open bucket's
// fill was in: whether a merge costs more the fuller the bucket it tops
// up. NaN for a quarter no read fell in.
func fillQuarters(ps []dashboardPath) [4]float64 {
	var by [4][]float64
	for _, p := range ps {
		for i := range p.fill {
			q := min((p.fill[i]-1)*4/ingestMaxEvents, 3)
			by[q] = append(by[q], ms(p.first[i]-p.again[i]))
		}
	}
	var out [4]float64
	for q := range by {
		out[q] = math.NaN()
		if len(by[q]) > 0 {
			out[q] = benchenv.Median(by[q])
		}
	}
	return out
}

func p50(ds []time.Duration) time.Duration { return percentileOf(ds, 0.5) }

// percentileOf is percentile of ds, unsorted.
func percentileOf(ds []time.Duration, q float64) time.Duration {
	return benchenv.Percentile(slices.Sorted(slices.Values(ds)), q)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
