package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/tsproxy/tsproxy/cmd/tsbench/internal/benchenv"
	"github.com/tsproxy/tsproxy/cmd/tsbench/internal/grow"
	"github.com/tsproxy/tsproxy/cmd/tsbench/internal/update"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/tests/backend"
)

func main() {
	fs := flag.NewFlagSet("tsbench", flag.ExitOnError)
	upstreamURI := fs.String("upstream", "", "upstream URI (default: a FerretDB of -backend's kind in a temp dir)")
	kind := fs.String("backend", backend.KindEmbedded, "the FerretDB to start when -upstream is empty: "+strings.Join(backend.Kinds, " | "))
	runs := fs.Int("runs", 5, "runs; medians are reported")
	n := fs.Int("n", 5000, "operations per latency run")
	dur := fs.Duration("dur", 2*time.Second, "duration of each throughput run")
	events := fs.Int("events", 100_000, "ingest: events per configuration")
	batch := fs.Int("batch", 1000, "layouts: events per insertMany")
	cases := fs.String("cases", "", "ingest: batch/clients pairs to run, e.g. 1000/1,1000/16 (default: all six)")
	threshold := fs.Int("insert-threshold", 0, "ingest: the rule's bucket.insertThreshold (0: the default)")
	ingestMode := fs.String("ingest", "staged", "ingest: the rule's ingest setting, staged or direct (into open buckets)")
	records := fs.Int("records", 0, "ingest: derived ids of merged retryable writes recorded in each case's rule before it is timed, as 10 minutes (the retry horizon) of records/600 retryable inserts a second leave them")
	prefill := fs.Int("prefill", 0, "ingest, layouts, dashboard: events written into each case's rule (through the proxy, batch 1000, flushed) and plain collection before it is timed (ingest: in the day before its events; layouts: the events before them): a rule with history, whose merges must not cost more for it")
	png := fs.String("png", "", "ingest: write a chart of the proxy/direct ratios to `file` (PNG)")
	pgDurable := fs.Bool("pg-durable", false, "-backend postgresql: run the cluster with PostgreSQL's default durability (fsync and synchronous_commit on), as a user's server runs; default off, as the tests run it (every commit cheaper)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run (proxy, upstream and clients) to `file`")
	memProfile := fs.String("memprofile", "", "write a profile of the whole run's allocations (proxy, embedded upstream and clients) to `file` at its end")
	proxyLink := fs.String("proxy-link", "", "how the proxy dials the upstream it started: tcp (loopback, as the direct path does) or socket (its Unix socket: a proxy beside its server); default: socket on embedded, as tsproxy dials its own embedded upstream, tcp on the others")
	clientLink := fs.String("client-link", "tcp", "how the clients dial: tcp (loopback), or socket: the proxy path's clients its Unix socket (listenUnix) and the direct path's the upstream's, as apps on the host of both would (needs an upstream tsbench starts)")
	every := fs.Int("read-every", 50, "dashboard: per-event inserts between two reads")
	ro := addRangeFlags(fs)
	sizes := fs.String("sizes", "100k,1M", "grow: the rule's sizes (events) to measure at, ascending; k and M suffixes")
	directReads := fs.String("direct-reads-up-to", "1M", "grow: time the plain collection's reads up to this size only (each scans it on FerretDB v1.24)")
	fs.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: tsbench [flags] passthrough|ingest|calls|layouts|mergefill|shapes|range|summary|dashboard|update|grow")
		fs.PrintDefaults()
	}
	_ = fs.Parse(os.Args[1:])
	if fs.NArg() != 1 {
		fs.Usage()
		os.Exit(2)
	}
	mode := fs.Arg(0)
	if err := backend.ParseKind(*kind); err != nil {
		fmt.Fprintln(os.Stderr, "tsbench: -backend:", err)
		os.Exit(2)
	}
	if *pgDurable && (*kind != backend.KindPostgreSQL || *upstreamURI != "") {
		fmt.Fprintln(os.Stderr, "tsbench: -pg-durable needs -backend postgresql (and no -upstream)")
		os.Exit(2)
	}
	switch {
	case *proxyLink != "" && *proxyLink != "tcp" && *proxyLink != "socket":
		fmt.Fprintf(os.Stderr, "tsbench: -proxy-link %q: want tcp or socket\n", *proxyLink)
		os.Exit(2)
	case *proxyLink != "" && *upstreamURI != "":
		fmt.Fprintln(os.Stderr, "tsbench: -proxy-link is for an upstream tsbench starts (no -upstream)")
		os.Exit(2)
	case *clientLink != "tcp" && *clientLink != "socket":
		fmt.Fprintf(os.Stderr, "tsbench: -client-link %q: want tcp or socket\n", *clientLink)
		os.Exit(2)
	case *clientLink == "socket" && *upstreamURI != "":
		fmt.Fprintln(os.Stderr, "tsbench: -client-link socket is for an upstream tsbench starts (no -upstream)")
		os.Exit(2)
	}
	up := benchenv.UpstreamSpec{Uri: *upstreamURI, Kind: *kind, DurablePG: *pgDurable, ProxyLink: *proxyLink, ClientLink: *clientLink}
	stopProfile, err := benchenv.StartCPUProfile(*cpuProfile)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tsbench:", err)
		os.Exit(1)
	}
	switch mode {
	case "passthrough":
		err = benchenv.WithEnv(up, nil, func(e *benchenv.Env) error { return benchPassthrough(e, *runs, *n, *dur) })
	case "ingest":
		ingestArgs.png, ingestArgs.runs, ingestArgs.cases, ingestArgs.prefill, ingestArgs.records, ingestArgs.mode = *png, *runs, *cases, *prefill, *records, *ingestMode
		if *ingestMode != "staged" && *ingestMode != "direct" {
			fmt.Fprintf(os.Stderr, "tsbench: -ingest is staged or direct, not %q\n", *ingestMode)
			os.Exit(2)
		}
		ingestArgs.backend, ingestArgs.custom = up.Name(), *upstreamURI != ""
		var rs []rules.Rule
		if rs, err = ingestRules(*threshold); err == nil {
			err = benchenv.WithEnv(up, rs, func(e *benchenv.Env) error { return benchIngest(e, *runs, *events, *cases) })
		}
	case "layouts":
		var rs []rules.Rule
		if rs, err = layoutRules(); err == nil {
			err = benchenv.WithEnv(up, rs, func(e *benchenv.Env) error { return benchLayouts(e, *runs, *events, *batch, *prefill) })
		}
	case "mergefill":
		var rs []rules.Rule
		if rs, err = layoutRules(); err == nil {
			err = benchenv.WithEnv(up, rs, func(e *benchenv.Env) error { return benchMergeFill(e, *runs) })
		}
	case "calls":
		var rs []rules.Rule
		if rs, err = callsRules(); err == nil {
			err = benchenv.WithEnv(up, rs, func(e *benchenv.Env) error { return benchCalls(e, *runs, *n) })
		}
	case "dashboard":
		ingestArgs.prefill = *prefill
		var rs []rules.Rule
		if rs, err = dashboardRules(*runs); err == nil {
			err = benchenv.WithEnv(up, rs, func(e *benchenv.Env) error { return benchDashboard(e, *runs, *events, *every) })
		}
	case "shapes":
		err = benchenv.WithEnv(up, nil, func(e *benchenv.Env) error { return benchShapes(e, *runs) })
	case "range":
		ro.runs = *runs
		var rs []rules.Rule
		if rs, err = rangeRules(ro.span); err == nil {
			err = benchenv.WithEnv(up, rs, func(e *benchenv.Env) error { return benchRange(e, ro) })
		}
	case "grow":
		var sz []int
		var upTo []int
		if upTo, err = grow.ParseSizes(*directReads); err == nil && len(upTo) != 1 {
			err = fmt.Errorf("-direct-reads-up-to: one size, got %q", *directReads)
		}
		if err == nil {
			sz, err = grow.ParseSizes(*sizes)
		}
		if err == nil {
			var rs []rules.Rule
			if rs, err = grow.Rules(); err == nil {
				err = benchenv.WithEnv(up, rs, func(e *benchenv.Env) error { return grow.Run(e, sz, upTo[0]) })
			}
		}
	case "update":
		var rs []rules.Rule
		if rs, err = update.Rules(); err == nil {
			err = benchenv.WithEnv(up, rs, func(e *benchenv.Env) error { return update.Run(e, *runs) })
		}
	case "summary":
		var rs []rules.Rule
		if rs, err = summaryRules(); err == nil {
			err = benchenv.WithEnv(up, rs, func(e *benchenv.Env) error { return benchSummary(e, *runs) })
		}
	default:
		fs.Usage()
		os.Exit(2)
	}
	stopProfile()
	if perr := benchenv.WriteMemProfile(*memProfile); perr != nil && err == nil {
		err = perr
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "tsbench:", err)
		os.Exit(1)
	}
}
