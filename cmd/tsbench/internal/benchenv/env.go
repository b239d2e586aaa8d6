package benchenv

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sort"
	"time"

	"github.com/spf13/pflag"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/tsproxy/tsproxy/proxy"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/tests/backend"
	"github.com/tsproxy/tsproxy/upstream"
)

// Env is one tsbench run's environment: the URIs of the direct path and
// of the proxy in front of the same upstream, and what the upstream offers.
type Env struct {
	UpstreamURI string // what the direct path dials
	ProxyURI    string
	// IndexIDs adds the embedded upstream's _id index to a collection
	// (nil elsewhere), as the proxy does to the collections it creates.
	IndexIDs func(ctx context.Context, db, coll string) error
	// IndexBytes is the size of that index, which collStats leaves out
	// (nil elsewhere).
	IndexBytes func(ctx context.Context, db, coll string) (int64, error)
}

// UpstreamSpec is the upstream to measure on: uri when set, else a new
// FerretDB of kind.
type UpstreamSpec struct {
	Uri, Kind  string
	DurablePG  bool   // -pg-durable
	ProxyLink  string // -proxy-link: "", tcp or socket
	ClientLink string // -client-link: tcp or socket
}

// Name is the started upstream's kind, saying when its PostgreSQL is
// durable.
func (us UpstreamSpec) Name() string {
	if us.Kind == backend.KindPostgreSQL && us.DurablePG {
		return us.Kind + " (durable: fsync and synchronous_commit on)"
	}
	return us.Kind
}

// WithEnv starts the upstream (unless given) and a proxy with rules, runs
// f, and stops them.
func WithEnv(us UpstreamSpec, rs []rules.Rule, f func(*Env) error) error {
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	e := &Env{UpstreamURI: us.Uri}
	proxyUpstream := us.Uri   // what the proxy dials
	var clientUpstream string // the upstream's socket, for -client-link socket
	var indexIDs func(context.Context, string, string) error
	var dropOrphanedTable func(context.Context, string, string) (bool, error)
	if us.Uri == "" {
		up, err := backend.Start(us.Kind, backend.Options{Logger: quiet, DurablePostgres: us.DurablePG})
		if err != nil {
			return err
		}
		defer up.Close()
		e.UpstreamURI, proxyUpstream, clientUpstream = up.URI(), up.ProxyURI(), up.SocketURI()
		switch us.ProxyLink {
		case "tcp":
			proxyUpstream = up.URI()
		case "socket":
			proxyUpstream = up.SocketURI()
		}
		indexIDs = up.IndexIDs()
		e.IndexIDs = indexIDs
		e.IndexBytes = up.IndexBytes()
		dropOrphanedTable = up.DropOrphanedTable()
		fmt.Printf("backend %s\n", us.Name())
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
	e.ProxyURI = "mongodb://" + ln.Addr().String() + "/"
	var more []net.Listener
	if us.ClientLink == "socket" {
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
		e.ProxyURI, e.UpstreamURI = upstream.SocketURI(uln.Addr().String()), clientUpstream
	}
	go func() { _ = srv.Serve(ln, more...) }()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}()
	fmt.Printf("upstream %s (the proxy dials %s), proxy %s, %s\n", redactURI(e.UpstreamURI), redactURI(proxyUpstream), e.ProxyURI, time.Now().UTC().Format(time.RFC3339))
	return f(e)
}

// StartCPUProfile profiles the whole process (upstream, proxy and
// clients share it) until the returned function is called; path "" is a
// no-op.
func StartCPUProfile(path string) (func(), error) {
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

// WriteMemProfile writes the allocations of the run so far to path
// (nothing when it is empty).
func WriteMemProfile(path string) error {
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

func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)-1) * p)
	return sorted[i]
}

func Median(xs []float64) float64 {
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

// RulesFromYAML loads the rules of a config file's text, as tsproxy would.
func RulesFromYAML(yaml string) ([]rules.Rule, error) {
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
	Proxy, Direct *mongo.Client
}

// ConnectBoth connects a client to the proxy and one to the upstream with
// the same options; close disconnects both.
func (e *Env) ConnectBoth(timeout time.Duration, maxPool uint64) (*clients, error) {
	connect := func(uri string) (*mongo.Client, error) {
		o := options.Client().ApplyURI(uri).SetTimeout(timeout)
		if maxPool > 0 {
			o.SetMaxPoolSize(maxPool)
		}
		return mongo.Connect(o)
	}
	p, err := connect(e.ProxyURI)
	if err != nil {
		return nil, fmt.Errorf("connect to the proxy: %w", err)
	}
	d, err := connect(e.UpstreamURI)
	if err != nil {
		_ = p.Disconnect(context.Background())
		return nil, fmt.Errorf("connect to the upstream: %w", err)
	}
	return &clients{Proxy: p, Direct: d}, nil
}

func (c *clients) Close() {
	_ = c.Proxy.Disconnect(context.Background())
	_ = c.Direct.Disconnect(context.Background())
}

// Flush runs tsproxyFlush through the proxy (every staged event merged
// into its bucket) and returns its reply and how long it took.
func Flush(ctx context.Context, proxyC *mongo.Client) (bson.Raw, time.Duration, error) {
	t0 := time.Now()
	var r bson.Raw
	err := proxyC.Database("admin").RunCommand(ctx, bson.D{{Key: "tsproxyFlush", Value: 1}}).Decode(&r)
	return r, time.Since(t0), err
}
