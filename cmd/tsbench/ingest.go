package main

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/tsproxy/tsproxy/cmd/tsbench/internal/benchenv"
	"github.com/tsproxy/tsproxy/rules"
)

// The ingest benchmark (issue 13): 4 series of 1-second data, bucketed
// with span 1h and maxEvents 1000. Each run of each case gets a database
// of its own (a rule per database, as rules name exact namespaces), so
// runs do not interfere; it is dropped after the run.
const (
	ingestSeries = 4
	ingestColl   = "events" // the bucketed namespace's collection
	plainColl    = "plain"  // the direct path's collection, same database
	bucketColl   = ingestColl + rules.BucketCollectionSuffix
)

// ingestDB is the database of run (1-based) of the i-th case.
func ingestDB(run, i int, c ingestCase) string {
	return fmt.Sprintf("tsbench_ingest_r%d_k%d_b%d_c%d", run, i, c.batch, c.conc)
}

// ingestNamespaces are the namespaces ingestRules made rules for.
var ingestNamespaces = map[string]bool{}

// ingestRules buckets <db>.events of every run and case (-runs and -cases,
// read by readIngestArgs): 1-second data in 1-hour buckets of at most 1000
// events; threshold is the insertThreshold (0: the default). The rules
// stage their inserts (ingest: staged) whatever the default ingest mode:
// this measures the staging tier (issue 13).
func ingestRules(threshold int) ([]rules.Rule, error) {
	cases, err := parseCases(ingestArgs.cases)
	if err != nil {
		return nil, err
	}
	extra := ""
	if threshold > 0 {
		extra = fmt.Sprintf(", insertThreshold: %d", threshold)
	}
	var b strings.Builder
	b.WriteString("rules:\n")
	for r := 1; r <= max(ingestArgs.runs, 1); r++ {
		for i, c := range cases {
			ns := ingestDB(r, i, c) + "." + ingestColl
			ingestNamespaces[ns] = true
			writeIngestRule(&b, ns, extra)
		}
	}
	return benchenv.RulesFromYAML(b.String())
}

// ingestMaxEvents is the ingest rule's maxEvents.
const ingestMaxEvents = 1000

// writeIngestRule writes the YAML of the ingest rule on ns; extra adds
// to its bucket options (", insertThreshold: N").
func writeIngestRule(b *strings.Builder, ns, extra string) {
	fmt.Fprintf(b, `  - namespace: %s
    timeField: ts
    metaField: sensor
    bucket: {span: 1h, maxEvents: %d%s}
    aggregates: [value]
    ingest: %s
`, ns, ingestMaxEvents, extra, ingestArgs.mode)
}

type ingestCase struct{ batch, conc int }

var allIngestCases = []ingestCase{
	{1000, 1}, {1000, 16}, {100, 1}, {100, 16}, {10, 1}, {10, 16}, {1, 1}, {1, 16},
}

// parseCases reads "batch/clients,..." ("" is every case).
func parseCases(s string) ([]ingestCase, error) {
	if s == "" {
		return allIngestCases, nil
	}
	var cs []ingestCase
	for _, part := range strings.Split(s, ",") {
		var c ingestCase
		if _, err := fmt.Sscanf(part, "%d/%d", &c.batch, &c.conc); err != nil || c.batch < 1 || c.conc < 1 {
			return nil, fmt.Errorf("-cases: %q is not batch/clients (e.g. 1000/16)", part)
		}
		cs = append(cs, c)
	}
	return cs, nil
}

// ingestEvents is the event count of a case: half of -events, the same
// for every case. Storage is compared at equal counts: a rule's own
// collections (the buckets, the event-id index, the records, the leases)
// each take a page or btree that does not grow with the events, so at a
// tenth of the events (what batches of 1 and 10 got until 2026-11-30, to
// end the matrix sooner) the index ratio measured how many events there
// were rather than how they were batched.
func ingestEvents(events int, _ ingestCase) int {
	return max(events/2, 1)
}

// ingestSample is what one run of one case measured.
type ingestSample struct {
	direct, proxy float64 // events/s; proxy: sustained (inserts + flush)
	proxyInsert   float64 // events/s of the proxy's inserts alone
	flush         time.Duration
	flushed       flushReply
	directCalls   callTimes // per insert call
	proxyCalls    callTimes
	others        float64 // cores other processes kept busy meanwhile
	st            ingestStorage
}

// benchIngest measures, for each batch size and client count, sustained
// ingest through the proxy (inserts, then tsproxyFlush) against plain
// inserts of the same events straight to the upstream, and what each
// stores, and checks that every event sent is stored once.
func benchIngest(e *benchenv.Env, runs, events int, only string) error {
	cases, err := parseCases(only)
	if err != nil {
		return err
	}
	for r := 1; r <= runs; r++ {
		for i, c := range cases {
			if ns := ingestDB(r, i, c) + "." + ingestColl; !ingestNamespaces[ns] {
				return fmt.Errorf("no rule for %s: ingestRules saw -runs %d -cases %q", ns, ingestArgs.runs, ingestArgs.cases)
			}
		}
	}
	ctx := context.Background()
	cs, err := e.ConnectBoth(10*time.Minute, 32)
	if err != nil {
		return err
	}
	defer cs.Close()
	proxyC, directC := cs.Proxy, cs.Direct

	// The first tsproxyFlush does every rule's one-time steps (bucket
	// index, writer lease); then time one with nothing staged: the fixed
	// part of every flush below (it visits every rule).
	t0 := time.Now()
	warm, _, err := tsproxyFlush(ctx, proxyC)
	if err != nil {
		return fmt.Errorf("warm-up tsproxyFlush: %w", err)
	}
	warmTime := time.Since(t0)
	var idle []float64
	for range 3 {
		_, d, err := tsproxyFlush(ctx, proxyC)
		if err != nil {
			return fmt.Errorf("idle tsproxyFlush: %w", err)
		}
		idle = append(idle, d.Seconds())
	}
	c0 := readCPU()
	time.Sleep(3 * time.Second)
	idleOthers := othersCores(c0, readCPU(), runtime.NumCPU())

	forms := map[int]int{}          // runs and cases by staged document form
	batches := map[[2]int][][]any{} // by events and batch size
	samples := make([][]ingestSample, len(cases))
	var failures []string
	fail := func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		failures = append(failures, msg)
		fmt.Printf("ERROR: %s\n", msg)
		fmt.Fprintf(os.Stderr, "ERROR: %s\n", msg)
	}
	start := time.Now()
	for r := 1; r <= runs; r++ {
		for i, c := range cases {
			n := ingestEvents(events, c)
			k := [2]int{n, c.batch}
			if batches[k] == nil {
				batches[k] = ingestBatches(n, c.batch)
			}
			db := ingestDB(r, i, c)
			if err := prefillRecords(ctx, directC, db); err != nil {
				return err
			}
			if err := prefillRun(ctx, directC, proxyC, db); err != nil {
				return err
			}
			cpu0 := readCPU()
			s, err := ingestRun(ctx, directC, proxyC, db, batches[k], n, c)
			s.others = othersCores(cpu0, readCPU(), runtime.NumCPU())
			if err != nil {
				fail("run %d batch %d clients %d: %v", r, c.batch, c.conc, err)
			} else {
				st, err := settled(ctx, directC.Database(db), e.IndexBytes)
				s.st = st
				switch {
				case err != nil:
					fail("run %d batch %d clients %d: %v", r, c.batch, c.conc, err)
				case st.stored != int64(n+max(ingestArgs.prefill, 0)) || st.plainN != int64(n+max(ingestArgs.prefill, 0)):
					fail("run %d batch %d clients %d: %d events sent (and -prefill %d); stored after tsproxyFlush: %d in buckets (sum of count, %d bucket documents), %d plain documents",
						r, c.batch, c.conc, n, max(ingestArgs.prefill, 0), st.stored, st.bucketN, st.plainN)
				case len(st.leftover) > 0:
					fail("run %d batch %d clients %d: staging collections left after tsproxyFlush: %s", r, c.batch, c.conc, strings.Join(st.leftover, ", "))
				}
				samples[i] = append(samples[i], s) // failed checks still fail the command
				fmt.Fprintf(os.Stderr, "  run %d batch %d clients %d: %d events: direct %.0f ev/s; proxy %.0f ev/s sustained (inserts %.0f ev/s, flush %.2f s merged %d events into %d buckets); ratio %.2f; buckets %d, %d stored; other load %.2f cores\n",
					r, c.batch, c.conc, n, s.direct, s.proxy, s.proxyInsert, s.flush.Seconds(), s.flushed.events, s.flushed.buckets, s.proxy/s.direct, st.bucketN, st.stored, s.others)
			}
			countStagingForm(ctx, proxyC, db+"."+ingestColl, forms)
			if err := directC.Database(db).Drop(ctx); err != nil {
				fail("drop database %s: %v", db, err)
			}
		}
		fmt.Fprintf(os.Stderr, "run %d/%d done (%s)\n", r, runs, time.Since(start).Round(time.Second))
	}

	report(cases, samples, runs, events, ingestSetup{nRules: len(ingestNamespaces), warm: warm, warmTime: warmTime,
		idleFlush: benchenv.Median(idle), idleOthers: idleOthers, forms: forms})
	left, err := directC.ListDatabaseNames(ctx, bson.D{{Key: "name", Value: bson.D{{Key: "$regex", Value: "^tsbench_ingest_"}}}})
	if err != nil {
		fail("listDatabases: %v", err)
	}
	var small []string
	for _, name := range left {
		colls, _ := directC.Database(name).ListCollectionNames(ctx, bson.D{})
		small = append(small, fmt.Sprintf("%s [%s]", name, strings.Join(colls, " ")))
	}
	fmt.Printf("\nbenchmark databases on the upstream after the runs (each was dropped after its run; a writer lease renewal may recreate %s): %d", rules.LeaseCollection, len(left))
	if len(small) > 0 {
		fmt.Printf(": %s", strings.Join(small, ", "))
	}
	fmt.Println()
	if ingestArgs.png != "" {
		ratios := map[ingestCase]float64{}
		for i, c := range cases {
			ratios[c] = benchenv.Median(field(samples[i], func(s ingestSample) float64 { return s.proxy / s.direct }))
		}
		title := fmt.Sprintf("tsbench ingest on %s: sustained proxy/direct (median of %d runs)", ingestBackend(), runs)
		if err := writeIngestPNG(ingestArgs.png, title, ratios); err != nil {
			return fmt.Errorf("-png: %w", err)
		}
		fmt.Printf("\nchart: %s\n", ingestArgs.png)
	}
	if len(failures) > 0 {
		return fmt.Errorf("%d failed check(s); the first: %s", len(failures), failures[0])
	}
	return nil
}

func ingestBackend() string {
	if ingestArgs.custom {
		return "upstream"
	}
	return ingestArgs.backend
}

// ingestRun inserts the events of one case directly into db.plain and
// through the proxy into db.events, then flushes the proxy. The order is
// A B B A: the first half of the batches direct, then all of them through
// the proxy (in the same two halves, the flush after the second), then
// the second half direct. The two paths' timed halves are then centred on
// the same moment, so a machine whose speed drifts through the run (this
// one's does, by more than the differences measured) slows or speeds
// both alike, where "all of one path, then all of the other" charged the
// drift to whichever path ran second. Each path runs its batches as two
// halves, so both pay for two starts and two tails of their clients.
func ingestRun(ctx context.Context, directC, proxyC *mongo.Client, db string, batches [][]any, n int, c ingestCase) (ingestSample, error) {
	var s ingestSample
	if ingestArgs.prefill <= 0 { // else the prefill made it
		if err := directC.Database(db).CreateCollection(ctx, plainColl); err != nil {
			return s, fmt.Errorf("create %s.%s: %w", db, plainColl, err)
		}
	}
	halves := [2][][]any{batches[:len(batches)/2], batches[len(batches)/2:]}
	direct := &pathTime{coll: directC.Database(db).Collection(plainColl), what: "direct insert"}
	proxy := &pathTime{coll: proxyC.Database(db).Collection(ingestColl), what: "insert through the proxy"}
	runtime.GC()
	if err := direct.run(ctx, halves[0], c.conc); err != nil {
		return s, err
	}
	runtime.GC()
	for _, half := range halves {
		if err := proxy.run(ctx, half, c.conc); err != nil {
			return s, err
		}
	}
	f, fd, err := tsproxyFlush(ctx, proxyC)
	if err != nil {
		return s, fmt.Errorf("tsproxyFlush after %d events: %w", n, err)
	}
	runtime.GC()
	if err := direct.run(ctx, halves[1], c.conc); err != nil {
		return s, err
	}
	s.direct, s.directCalls = float64(n)/direct.total.Seconds(), summarizeCalls(direct.calls)
	s.proxy = float64(n) / (proxy.total + fd).Seconds()
	s.proxyInsert = float64(n) / proxy.total.Seconds()
	s.flush, s.flushed, s.proxyCalls = fd, f, summarizeCalls(proxy.calls)
	return s, nil
}

// pathTime adds up the halves one path (direct or through the proxy)
// inserted: their time and the times of their calls.
type pathTime struct {
	coll  *mongo.Collection
	what  string
	total time.Duration
	calls []time.Duration
}

// run inserts half of a case's batches with conc clients.
func (p *pathTime) run(ctx context.Context, half [][]any, conc int) error {
	d, calls, err := ingest(ctx, p.coll, half, conc)
	if err != nil {
		return fmt.Errorf("%s: %w", p.what, err)
	}
	p.total += d
	p.calls = append(p.calls, calls...)
	return nil
}

// countStagingForm adds the form of ns's staged documents
// (tsproxyStagingFormat) to forms; a proxy that does not answer the
// command counts as form 0.
func countStagingForm(ctx context.Context, proxyC *mongo.Client, ns string, forms map[int]int) {
	var r struct {
		Rules []struct {
			Format int `bson:"format"`
		} `bson:"rules"`
	}
	if err := proxyC.Database("admin").RunCommand(ctx, bson.D{{Key: "tsproxyStagingFormat", Value: ns}}).Decode(&r); err != nil {
		forms[0]++
		return
	}
	for _, rule := range r.Rules {
		forms[rule.Format]++
	}
}

// flushReply is tsproxyFlush's answer.
type flushReply struct {
	rules, collections, events, buckets, retries int64
	slowest                                      string // its slowest kinds of upstream step (upstreamMs)
	steps                                        bson.RawValue
}

// tsproxyFlush merges everything staged, through the proxy, and times it.
func tsproxyFlush(ctx context.Context, proxyC *mongo.Client) (flushReply, time.Duration, error) {
	r, d, err := benchenv.Flush(ctx, proxyC)
	if err != nil {
		return flushReply{}, d, err
	}
	get := func(k string) int64 { v, _ := r.Lookup(k).AsInt64OK(); return v }
	return flushReply{rules: get("rules"), collections: get("collections"), events: get("events"), buckets: get("buckets"),
		retries: get("retries"), slowest: slowestSteps(r.Lookup("upstreamMs"), 2), steps: r.Lookup("upstreamMs")}, d, nil
}

// slowestSteps names the n kinds of step of a flush reply's upstreamMs
// that took longest, with their milliseconds.
func slowestSteps(upstreamMs bson.RawValue, n int) string {
	type kind struct {
		name string
		ms   float64
	}
	var kinds []kind
	doc, _ := upstreamMs.DocumentOK()
	elems, _ := doc.Elements()
	for _, e := range elems {
		step, _ := e.Value().DocumentOK()
		ms, _ := step.Lookup("ms").AsFloat64OK()
		kinds = append(kinds, kind{e.Key(), ms})
	}
	slices.SortFunc(kinds, func(a, b kind) int { return cmp.Compare(b.ms, a.ms) })
	var out []string
	for _, k := range kinds[:min(n, len(kinds))] {
		out = append(out, fmt.Sprintf("%s %.0f ms", k.name, k.ms))
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ", ")
}

// ingestBatches cuts n events of ingestSeries series at a 1-second cadence
// (event k: series k%4, second k/4) into batches of batch consecutive
// events. The same batches go to both paths.
func ingestBatches(n, batch int) [][]any {
	return ingestBatchesFrom(ingestStart, n, batch)
}

// ingestStart is the time of ingestBatches' first event: -prefill's
// events end there, and what a mode sends after them starts from it.
var ingestStart = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// ingestBatchesFrom cuts n events from base on, one a second a series,
// into batches.
func ingestBatchesFrom(base time.Time, n, batch int) [][]any {
	var out [][]any
	for k := 0; k < n; k += batch {
		b := make([]any, 0, min(batch, n-k))
		for j := k; j < min(n, k+batch); j++ {
			b = append(b, bson.D{
				{Key: "ts", Value: base.Add(time.Duration(j/ingestSeries) * time.Second)},
				{Key: "sensor", Value: fmt.Sprintf("s%d", j%ingestSeries)},
				{Key: "value", Value: float64(j%1000) / 10},
			})
		}
		out = append(out, b)
	}
	return out
}

// callTimes summarizes the times of a run's insert calls. With many
// clients the median alone misleads: an upstream that serves clients
// unfairly answers most calls fast and a few very late.
type callTimes struct{ p50, p99, mean time.Duration }

func summarizeCalls(calls []time.Duration) callTimes {
	sorted := slices.Sorted(slices.Values(calls))
	var sum time.Duration
	for _, d := range sorted {
		sum += d
	}
	t := callTimes{p50: benchenv.Percentile(sorted, 0.5), p99: benchenv.Percentile(sorted, 0.99)}
	if len(sorted) > 0 {
		t.mean = sum / time.Duration(len(sorted))
	}
	return t
}

// ingest writes batches with conc clients that take them in turn from a
// shared queue (as concurrent writers of one stream of events would):
// insertOne for a batch of one, else an unordered insertMany. It returns
// the time it took and the times of its insert calls, unsorted.
func ingest(ctx context.Context, coll *mongo.Collection, batches [][]any, conc int) (time.Duration, []time.Duration, error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, conc)
	calls := make([][]time.Duration, conc)
	unordered := options.InsertMany().SetOrdered(false)
	t0 := time.Now()
	for g := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				b := int(next.Add(1) - 1)
				if b >= len(batches) {
					return
				}
				c0 := time.Now()
				var err error
				if len(batches[b]) == 1 {
					_, err = coll.InsertOne(ctx, batches[b][0])
				} else {
					_, err = coll.InsertMany(ctx, batches[b], unordered)
				}
				calls[g] = append(calls[g], time.Since(c0))
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	d := time.Since(t0)
	close(errs)
	if err := <-errs; err != nil {
		return 0, nil, err
	}
	return d, slices.Concat(calls...), nil
}
