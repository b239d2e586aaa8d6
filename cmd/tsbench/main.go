package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sort"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/tsproxy/tsproxy/proxy"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/tests/backend"
	"github.com/tsproxy/tsproxy/upstream"
)

type benchEnv struct {
	upstreamURI string // what the direct path dials
	proxyURI    string
	stop        func()
	// indexIDs adds the embedded upstream's _id index to a collection
	// (nil elsewhere), as the proxy does to the collections it creates.
	indexIDs func(ctx context.Context, db, coll string) error
	// indexBytes is the size of that index, which collStats leaves out
	// (nil elsewhere).
	indexBytes func(ctx context.Context, db, coll string) (int64, error)
}

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
	fs.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: tsbench [flags] passthrough|ingest|calls|layouts|mergefill|shapes|range|summary|dashboard")
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
	up := upstreamSpec{uri: *upstreamURI, kind: *kind, durablePG: *pgDurable, proxyLink: *proxyLink, clientLink: *clientLink}
	stopProfile, err := startCPUProfile(*cpuProfile)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tsbench:", err)
		os.Exit(1)
	}
	switch mode {
	case "passthrough":
		err = withEnv(up, nil, func(e *benchEnv) error { return benchPassthrough(e, *runs, *n, *dur) })
	case "ingest":
		ingestArgs.png, ingestArgs.runs, ingestArgs.cases, ingestArgs.prefill, ingestArgs.records = *png, *runs, *cases, *prefill, *records
		ingestArgs.backend, ingestArgs.custom = up.name(), *upstreamURI != ""
		var rs []rules.Rule
		if rs, err = ingestRules(*threshold); err == nil {
			err = withEnv(up, rs, func(e *benchEnv) error { return benchIngest(e, *runs, *events, *cases) })
		}
	case "layouts":
		var rs []rules.Rule
		if rs, err = layoutRules(); err == nil {
			err = withEnv(up, rs, func(e *benchEnv) error { return benchLayouts(e, *runs, *events, *batch, *prefill) })
		}
	case "mergefill":
		var rs []rules.Rule
		if rs, err = layoutRules(); err == nil {
			err = withEnv(up, rs, func(e *benchEnv) error { return benchMergeFill(e, *runs) })
		}
	case "calls":
		var rs []rules.Rule
		if rs, err = callsRules(); err == nil {
			err = withEnv(up, rs, func(e *benchEnv) error { return benchCalls(e, *runs, *n) })
		}
	case "dashboard":
		ingestArgs.prefill = *prefill
		var rs []rules.Rule
		if rs, err = dashboardRules(*runs); err == nil {
			err = withEnv(up, rs, func(e *benchEnv) error { return benchDashboard(e, *runs, *events, *every) })
		}
	case "shapes":
		err = withEnv(up, nil, func(e *benchEnv) error { return benchShapes(e, *runs) })
	case "range":
		ro.runs = *runs
		var rs []rules.Rule
		if rs, err = rangeRules(ro.span); err == nil {
			err = withEnv(up, rs, func(e *benchEnv) error { return benchRange(e, ro) })
		}
	case "summary":
		var rs []rules.Rule
		if rs, err = summaryRules(); err == nil {
			err = withEnv(up, rs, func(e *benchEnv) error { return benchSummary(e, *runs) })
		}
	default:
		fs.Usage()
		os.Exit(2)
	}
	stopProfile()
	if perr := writeMemProfile(*memProfile); perr != nil && err == nil {
		err = perr
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "tsbench:", err)
		os.Exit(1)
	}
}

// upstreamSpec is the upstream to measure on: uri when set, else a new
// FerretDB of kind.
type upstreamSpec struct {
	uri, kind  string
	durablePG  bool   // -pg-durable
	proxyLink  string // -proxy-link: "", tcp or socket
	clientLink string // -client-link: tcp or socket
}

// name is the started upstream's kind, saying when its PostgreSQL is
// durable.
func (us upstreamSpec) name() string {
	if us.kind == backend.KindPostgreSQL && us.durablePG {
		return us.kind + " (durable: fsync and synchronous_commit on)"
	}
	return us.kind
}

// withEnv starts the upstream (unless given) and a proxy with rules, runs
// f, and stops them.
func withEnv(us upstreamSpec, rs []rules.Rule, f func(*benchEnv) error) error {
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	e := &benchEnv{upstreamURI: us.uri}
	proxyUpstream := us.uri   // what the proxy dials
	var clientUpstream string // the upstream's socket, for -client-link socket
	var indexIDs func(context.Context, string, string) error
	var dropOrphanedTable func(context.Context, string, string) (bool, error)
	if us.uri == "" {
		up, err := backend.Start(us.kind, backend.Options{Logger: quiet, DurablePostgres: us.durablePG})
		if err != nil {
			return err
		}
		defer up.Close()
		e.upstreamURI, proxyUpstream, clientUpstream = up.URI(), up.ProxyURI(), up.SocketURI()
		switch us.proxyLink {
		case "tcp":
			proxyUpstream = up.URI()
		case "socket":
			proxyUpstream = up.SocketURI()
		}
		indexIDs = up.IndexIDs()
		e.indexIDs = indexIDs
		e.indexBytes = up.IndexBytes()
		dropOrphanedTable = up.DropOrphanedTable()
		fmt.Printf("backend %s\n", us.name())
	}
	dialer, err := upstream.NewDialer(upstream.Options{URI: proxyUpstream})
	if err != nil {
		return err
	}
	srv, err := proxy.New(proxy.Options{Dialer: dialer, Rules: rules.NewSet(rs), Logger: quiet, IndexIDs: indexIDs, DropOrphanedTable: dropOrphanedTable})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	e.proxyURI = "mongodb://" + ln.Addr().String() + "/"
	var more []net.Listener
	if us.clientLink == "socket" {
		// Everything on one host: the apps reach the proxy, and the
		// direct path its server, over Unix sockets.
		dir, err := os.MkdirTemp("", "tsbench-*")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		uln, err := net.Listen("unix", filepath.Join(dir, "tsproxy.sock"))
		if err != nil {
			return err
		}
		more = append(more, uln)
		e.proxyURI, e.upstreamURI = upstream.SocketURI(uln.Addr().String()), clientUpstream
	}
	go func() { _ = srv.Serve(ln, more...) }()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}()
	fmt.Printf("upstream %s (the proxy dials %s), proxy %s, %s\n", redactURI(e.upstreamURI), redactURI(proxyUpstream), e.proxyURI, time.Now().UTC().Format(time.RFC3339))
	return f(e)
}

// startCPUProfile profiles the whole process (upstream, proxy and
// clients share it) until the returned function is called; path "" is a
// no-op.
func startCPUProfile(path string) (func(), error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// writeMemProfile writes the allocations of the run so far to path
// (nothing when it is empty).
func writeMemProfile(path string) error {
	if path == "" {
		return nil
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("memory profile: %w", err)
	}
	defer f.Close()
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		return fmt.Errorf("memory profile: %w", err)
	}
	return nil
}

func redactURI(s string) string { return rules.Redact(s) }

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)-1) * p)
	return sorted[i]
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// rulesFromYAML loads the rules of a config file's text, as tsproxy would.
func rulesFromYAML(yaml string) ([]rules.Rule, error) {
	dir, err := os.MkdirTemp("", "tsbench-config-*")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		return nil, err
	}
	cfg, err := rules.Load(rules.LoadOptions{ConfigFile: file, Flags: pflag.NewFlagSet("x", pflag.ContinueOnError)})
	if err != nil {
		return nil, err
	}
	return cfg.Rules, nil
}

// clients are one client through the proxy and one straight to the
// upstream, made alike so that every figure compares like with like.
type clients struct {
	proxy, direct *mongo.Client
}

// connectBoth connects a client to the proxy and one to the upstream with
// the same options; close disconnects both.
func (e *benchEnv) connectBoth(timeout time.Duration, maxPool uint64) (*clients, error) {
	connect := func(uri string) (*mongo.Client, error) {
		o := options.Client().ApplyURI(uri).SetTimeout(timeout)
		if maxPool > 0 {
			o.SetMaxPoolSize(maxPool)
		}
		return mongo.Connect(o)
	}
	p, err := connect(e.proxyURI)
	if err != nil {
		return nil, fmt.Errorf("connect to the proxy: %w", err)
	}
	d, err := connect(e.upstreamURI)
	if err != nil {
		_ = p.Disconnect(context.Background())
		return nil, fmt.Errorf("connect to the upstream: %w", err)
	}
	return &clients{proxy: p, direct: d}, nil
}

func (c *clients) close() {
	_ = c.proxy.Disconnect(context.Background())
	_ = c.direct.Disconnect(context.Background())
}
