package main

import (
	"fmt"
	"math"
	"runtime"
	"strings"
	"time"

	"github.com/tsproxy/tsproxy/cmd/tsbench/internal/benchenv"
)

// What tsbench ingest prints: its Markdown tables and the targets missed.

// ingestSetup is what tsbench ingest measured before its cases ran.
type ingestSetup struct {
	nRules   int
	warm     flushReply // the first tsproxyFlush's
	warmTime time.Duration
	// idleFlush: seconds of a tsproxyFlush with nothing staged;
	// idleOthers: cores other processes kept busy before the runs.
	idleFlush, idleOthers float64
	// forms counts the runs and cases by the staged document form of
	// their rule.
	forms map[int]int
}

// report prints the Markdown tables.
func report(cases []ingestCase, samples [][]ingestSample, runs, events int, setup ingestSetup) {
	nRules, warm, warmTime, idleFlush, idleOthers := setup.nRules, setup.warm, setup.warmTime, setup.idleFlush, setup.idleOthers
	med := func(i int, f func(ingestSample) float64) float64 { return benchenv.Median(field(samples[i], f)) }
	num := func(v float64, format string) string {
		if v == 0 {
			return "–"
		}
		return fmt.Sprintf(format, v)
	}
	var counts []string
	seen := map[int]bool{}
	for _, c := range cases {
		if n := ingestEvents(events, c); !seen[c.batch] {
			seen[c.batch] = true
			counts = append(counts, fmt.Sprintf("batch %d: %d", c.batch, n))
		}
	}
	fmt.Printf("\n## tsbench ingest, backend %s\n\n", ingestBackend())
	fmt.Printf("- rule: %d series of 1-second data, `bucket: {span: 1h, maxEvents: 1000}`, `aggregates: [value]`, `ingest: %s`; one database per run and case (%d rules)\n", ingestSeries, ingestArgs.mode, nRules)
	fmt.Printf("- events per case: %s; unordered insertMany (insertOne for batch 1), the clients take batches of consecutive events from one queue\n", strings.Join(counts, ", "))
	if ingestArgs.records > 0 {
		fmt.Printf("- `-records %d`: before each case, its rule's records of merged retryable writes held %d derived ids (written straight to the upstream, as 10 minutes, the retry horizon, of %d retryable inserts a second leave them)\n", ingestArgs.records, ingestArgs.records, ingestArgs.records/600)
	}
	if ingestArgs.prefill > 0 {
		fmt.Printf("- `-prefill %d`: before each case, its rule and plain collection were given %d events of the same series in the time before the case's (through the proxy at batch 1000, then `tsproxyFlush`): the case is timed on a rule with history, as a long-running one is\n", ingestArgs.prefill, ingestArgs.prefill)
	}
	fmt.Printf("- medians of %d runs; proxy sustained = events / (insert time + time of `tsproxyFlush: 1` through the proxy right after); direct = plain inserts of the same events into a plain collection on the same upstream; order A B B A: the first half of the batches direct, then both halves through the proxy and the flush, then the second half direct (the two paths' times centred on the same moment)\n", runs)
	fmt.Printf("- warm-up `tsproxyFlush: 1` (first one: every rule's bucket index and lease): %.2f s, staged rules %d of %d; `tsproxyFlush: 1` with nothing staged: %.3f s (part of every flush s below)\n", warmTime.Seconds(), warm.rules, nRules, idleFlush)
	var forms []string
	for f := 0; f <= 2; f++ {
		if n := setup.forms[f]; n > 0 {
			forms = append(forms, fmt.Sprintf("form %d: %d", f, n))
		}
	}
	fmt.Printf("- staged document form of the rule at the end of each run and case (`tsproxyStagingFormat`; 0: not recorded or not answered): %s\n", strings.Join(forms, ", "))
	if warm.rules == 0 {
		fmt.Println("- WARNING: tsproxyFlush reports no staged rule: on this upstream and build the proxy writes these rules' buckets directly (ingest mode direct), so this measures the direct path, not the staging tier")
	}
	fmt.Printf("- the machine has %d cores; other processes (not tsbench, its proxy, its upstream) kept %.2f cores busy in the 3 s before the runs, and the median shown per case below while it ran\n\n", runtime.NumCPU(), idleOthers)

	fmt.Println("| batch | clients | direct ev/s | proxy sustained ev/s | ratio | runs' ratios | flush s | docs ratio | index ratio |")
	fmt.Println("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	var below []string
	for i, c := range cases {
		rat := med(i, func(s ingestSample) float64 { return s.proxy / s.direct })
		fmt.Printf("| %d | %d | %s | %s | %s | %s | %s | %s | %s |\n", c.batch, c.conc,
			num(med(i, func(s ingestSample) float64 { return s.direct }), "%.0f"),
			num(med(i, func(s ingestSample) float64 { return s.proxy }), "%.0f"),
			num(rat, "%.2f"),
			spread(field(samples[i], func(s ingestSample) float64 { return s.proxy / s.direct })),
			num(med(i, func(s ingestSample) float64 { return s.flush.Seconds() }), "%.2f"),
			num(med(i, func(s ingestSample) float64 { return s.st.docsRat }), "%.0f"),
			num(med(i, func(s ingestSample) float64 { return s.st.idxRat }), "%.1f"))
		if t, ok := ingestTargets[c.batch]; ok && rat < t {
			below = append(below, fmt.Sprintf("%d/%d (%.2f < %.1f)", c.batch, c.conc, rat, t))
		}
		below = append(below, belowStorage(c, med(i, func(s ingestSample) float64 { return s.st.docsRat }), med(i, func(s ingestSample) float64 { return s.st.idxRat }))...)
	}
	fmt.Println()
	fmt.Println("ratio: proxy sustained / direct events/s, the median of the runs' own (the machine drifts between runs: their lowest and highest are shown beside it); docs ratio, index ratio: plain / bucketed (documents counted, collStats totalIndexSize)")
	if len(below) > 0 {
		fmt.Printf("\nbelow issue 13's targets (0.8 at batch 1, 1.0 at 10, 1.5 at 100 and 1000; settled, %dx fewer documents and %dx smaller indexes): %s\n", docsTarget, indexTarget, strings.Join(below, ", "))
	} else {
		fmt.Println("\nevery case meets issue 13's targets (0.8 at batch 1, 1.0 at 10, 1.5 at 100 and 1000)")
	}

	fmt.Printf("\n### insert calls and flush (medians of %d runs)\n\n", runs)
	fmt.Println("| batch | clients | events | direct p50 ms/call | proxy p50 ms/call | p50 ratio proxy/direct | p99 ratio | mean ratio | proxy inserts alone ev/s | flush s | events merged by the flush | buckets written by the flush | other load, cores |")
	fmt.Println("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for i, c := range cases {
		dp := med(i, func(s ingestSample) float64 { return s.directCalls.p50.Seconds() * 1e3 })
		pp := med(i, func(s ingestSample) float64 { return s.proxyCalls.p50.Seconds() * 1e3 })
		ratio := func(f func(callTimes) time.Duration) string {
			return num(med(i, func(s ingestSample) float64 { return f(s.proxyCalls).Seconds() / f(s.directCalls).Seconds() }), "%.2f")
		}
		fmt.Printf("| %d | %d | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %.2f |\n", c.batch, c.conc, ingestEvents(events, c),
			num(dp, "%.2f"), num(pp, "%.2f"),
			ratio(func(t callTimes) time.Duration { return t.p50 }),
			ratio(func(t callTimes) time.Duration { return t.p99 }),
			ratio(func(t callTimes) time.Duration { return t.mean }),
			num(med(i, func(s ingestSample) float64 { return s.proxyInsert }), "%.0f"),
			num(med(i, func(s ingestSample) float64 { return s.flush.Seconds() }), "%.2f"),
			num(med(i, func(s ingestSample) float64 { return float64(s.flushed.events) }), "%.0f"),
			num(med(i, func(s ingestSample) float64 { return float64(s.flushed.buckets) }), "%.0f"),
			med(i, func(s ingestSample) float64 { return s.others }))
	}

	fmt.Printf("\n### storage after the flush (last good run; straight from the upstream)\n\n")
	fmt.Println("| batch | clients | events stored (sum of bucket counts) | plain docs | bucket docs | collStats count plain / bucket | plain index bytes | bucket index bytes | plain data bytes | bucket data bytes | bucket BSON bytes | staging left | stage.txns docs | bucketed index bytes by collection | bucket fills (events×buckets) |")
	fmt.Println("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---|---|")
	for i, c := range cases {
		if len(samples[i]) == 0 {
			fmt.Printf("| %d | %d | – | – | – | – | – | – | – | – | – | – | – | – | – |\n", c.batch, c.conc)
			continue
		}
		st := samples[i][len(samples[i])-1].st
		left, txns := "none", "–"
		if len(st.leftover) > 0 {
			left = strings.Join(st.leftover, ", ")
		}
		if st.txns {
			txns = fmt.Sprint(st.txnsDocs)
		}
		fmt.Printf("| %d | %d | %d | %d | %d | %d / %d | %d | %d | %d | %d | %d | %s | %s | %s | %s |\n", c.batch, c.conc, st.stored, st.plainN, st.bucketN,
			st.plain.count, st.bucket.count, st.plain.indexSize, st.bucket.indexSize, st.plain.size, st.bucket.size, st.bucketBSON, left, txns, strings.Join(st.indexBy, ", "), strings.Join(st.fills, " "))
	}
}

// field is f of every sample.
func field[T any](ss []T, f func(T) float64) []float64 {
	out := make([]float64, len(ss))
	for i, s := range ss {
		out[i] = f(s)
	}
	return out
}

func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// spread is the lowest and highest of a case's values, "0.71–0.90"; "–"
// for none.
func spread(vals []float64) string {
	var lo, hi float64
	n := 0
	for _, v := range vals {
		if v == 0 || math.IsNaN(v) || math.IsInf(v, 0) {
			continue // a run that failed
		}
		if n == 0 || v < lo {
			lo = v
		}
		if n == 0 || v > hi {
			hi = v
		}
		n++
	}
	if n == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f–%.2f", lo, hi)
}
