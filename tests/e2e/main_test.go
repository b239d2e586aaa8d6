package e2e

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/tsproxy/tsproxy/proxy"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/tests/backend"
	"github.com/tsproxy/tsproxy/upstream"
	"github.com/tsproxy/tsproxy/wire"
)

// env is the shared upstream of the whole run.
var env struct {
	upstreamURI string // what the proxies dial: the embedded upstream's Unix socket, as tsproxy dials it, or TCP
	external    bool   // TSPROXY_E2E_UPSTREAM: a real MongoDB, not a FerretDB of this run
	kind        string // TSPROXY_E2E_BACKEND: which FerretDB (backend.Kinds)
	emb         *upstream.Embedded
	pg          *backend.Postgres // kind postgresql: the cluster, for the tests' own upstreams
}

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if uri := os.Getenv("TSPROXY_E2E_UPSTREAM"); uri != "" {
		env.upstreamURI, env.external = uri, true
		return m.Run()
	}
	env.kind = cmp.Or(os.Getenv("TSPROXY_E2E_BACKEND"), backend.KindEmbedded)
	up, err := backend.Start(env.kind, backend.Options{})
	if err != nil {
		fmt.Fprintf(os.Stderr, "start the %s upstream: %v\n", env.kind, err)
		return 1
	}
	defer up.Close()
	env.emb, env.pg, env.upstreamURI = up.Embedded, up.Postgres, up.ProxyURI()
	fmt.Fprintf(os.Stderr, "e2e upstream: %s at %s\n", env.kind, env.upstreamURI)
	return m.Run()
}

func quietLogger() *slog.Logger {
	level := slog.LevelWarn
	if os.Getenv("TSPROXY_E2E_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// proxyOptions tunes startProxy.
type proxyOptions struct {
	// yaml is extra config (e.g. a rules: block) read through the real
	// config loader.
	yaml string
	// upstreamURI overrides the shared upstream (a fault-injecting relay).
	upstreamURI string
	// edit changes the proxy options after the config is applied.
	edit func(*proxy.Options)
}

// testProxy is a proxy running for one test.
type testProxy struct {
	srv  *proxy.Server
	addr string
	cfg  *rules.Config
}

// URI is a connection string with only the proxy's address.
func (p *testProxy) URI() string { return "mongodb://" + p.addr + "/" }

// startProxy runs a proxy in-process on a free port until the test ends.
func startProxy(t testing.TB, po proxyOptions) *testProxy {
	t.Helper()
	dir := t.TempDir()
	file := filepath.Join(dir, "config.yaml")
	yaml := "listen: 127.0.0.1:0\ntelemetry:\n  metricsListen: \"\"\n" + po.yaml
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := rules.Load(rules.LoadOptions{ConfigFile: file, Flags: pflag.NewFlagSet("none", pflag.ContinueOnError)})
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	uri := env.upstreamURI
	if po.upstreamURI != "" {
		uri = po.upstreamURI
	}
	dialer, err := upstream.NewDialer(upstream.Options{URI: uri, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ruleSet := cfg.RuleSet()
	// TSPROXY_E2E_INGEST=direct|staged|auto sets the ingest mode of the
	// suite's events rules (default auto: staged on FerretDB) unless a
	// test set the mode itself.
	if mode := os.Getenv("TSPROXY_E2E_INGEST"); mode != "" {
		for i, r := range cfg.Rules {
			if r.Layout == rules.LayoutEvents && !r.Partitioned() && r.Ingest == rules.DefaultIngest && !strings.Contains(po.yaml, "ingest:") {
				cfg.Rules[i].Ingest = mode
			}
		}
		ruleSet = rules.NewSet(cfg.Rules)
	}
	opts := proxy.Options{
		Dialer:          dialer,
		Rules:           ruleSet,
		MaxConnections:  cfg.Limits.MaxConnections,
		MaxMessageBytes: cfg.Limits.MaxMessageBytes,
		MaxCursors:      cfg.Limits.MaxCursors,
		CursorTTL:       cfg.Limits.CursorTTL,
		RetryCacheSize:  cfg.Limits.RetryCacheSize,
		RetryCacheTTL:   cfg.Limits.RetryCacheTTL,
		AggregateMemory: cfg.Limits.AggregateMemory,
		Logger:          quietLogger(),

		CreateTimeseries: cfg.CreateTimeseries,
	}
	if env.emb != nil && po.upstreamURI == "" {
		opts.IndexIDs = env.emb.IndexIDs
		opts.DropOrphanedTable = env.emb.DropOrphanedTable
	}
	if po.edit != nil {
		po.edit(&opts)
	}
	srv, err := proxy.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var more []net.Listener
	if cfg.ListenUnix != "" {
		uln, err := net.Listen("unix", cfg.ListenUnix)
		if err != nil {
			t.Fatal(err)
		}
		more = append(more, uln)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln, more...) }()
	tp := &testProxy{srv: srv, addr: ln.Addr().String(), cfg: cfg}
	live.Lock()
	live.proxies[tp] = liveProxy{owner: t.Name()}
	live.Unlock()
	t.Cleanup(func() {
		live.Lock()
		delete(live.proxies, tp)
		live.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	})
	return tp
}

// connect opens a Go driver client; extra is appended to the URI options.
func connect(t testing.TB, uri string, extra ...string) *mongo.Client {
	t.Helper()
	if len(extra) > 0 {
		sep := "?"
		if strings.Contains(uri, "?") {
			sep = "&"
		}
		uri += sep + strings.Join(extra, "&")
	}
	c, err := mongo.Connect(options.Client().ApplyURI(uri).SetServerSelectionTimeout(10 * time.Second).SetTimeout(60 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Disconnect(context.Background()) })
	return c
}

// direct is a client straight to the upstream, bypassing the proxy, for
// checking what the proxy stored. It first settles what the running test
// proxies staged (settleLive), so what it finds is complete buckets.
func direct(t testing.TB) *mongo.Client {
	settleLive(t)
	return connect(t, env.upstreamURI)
}

// live are the test proxies running now, with a client of each for
// settling their staging tiers.
var live = struct {
	sync.Mutex
	proxies map[*testProxy]liveProxy
}{proxies: map[*testProxy]liveProxy{}}

// liveProxy is a running test proxy: the test that started it.
type liveProxy struct {
	owner string
}

// settleLive merges the staging tier of the running proxies of test t
// and its parents (tsproxyFlush): a test that reads the upstream
// directly sees what reads through the proxy see. A proxy that cannot
// (its upstream is down, another proxy holds the rule's lease) is
// skipped. Other tests' proxies are left alone: a flush in the middle
// of their inserts would change how their events are bucketed.
func settleLive(t testing.TB) {
	live.Lock()
	var addrs []string
	for tp, lp := range live.proxies {
		if t.Name() == lp.owner || strings.HasPrefix(t.Name(), lp.owner+"/") {
			addrs = append(addrs, tp.addr)
		}
	}
	live.Unlock()
	// A raw connection of its own, closed at once: tests count the
	// proxy's client connections.
	for _, addr := range addrs {
		if err := flushAt(addr); err != nil {
			t.Logf("settle a test proxy's staging tier: %v", err)
		}
	}
}

// uniqueDB names a database of its own for a test.
func uniqueDB(t testing.TB) string {
	name := strings.NewReplacer("/", "_", " ", "_", "#", "_").Replace(t.Name())
	if len(name) > 40 {
		name = name[:40]
	}
	return fmt.Sprintf("e2e_%s_%d", name, time.Now().UnixNano()%1_000_000)
}

func ctxFor(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

var mongoshOnce struct {
	sync.Once
	path string
	err  error
}

// mongosh returns the path of the real mongosh, installing it from npm
// (pinned in package.json) on first use.
func mongosh(t testing.TB) string {
	t.Helper()
	mongoshOnce.Do(func() {
		wd, err := os.Getwd()
		if err != nil {
			mongoshOnce.err = err
			return
		}
		bin := filepath.Join(wd, "node_modules", ".bin", "mongosh")
		_, errMongosh := os.Stat(bin)
		_, errMongoose := os.Stat(filepath.Join(wd, "node_modules", "mongoose", "package.json"))
		if errMongosh != nil || errMongoose != nil {
			cmd := exec.Command("npm", "install", "--no-audit", "--no-fund", "--loglevel=error")
			cmd.Dir = wd
			out, err := cmd.CombinedOutput()
			if err != nil {
				mongoshOnce.err = fmt.Errorf("npm install (mongosh, mongoose): %v\n%s", err, out)
				return
			}
		}
		mongoshOnce.path = bin
	})
	if mongoshOnce.err != nil {
		t.Fatal(mongoshOnce.err)
	}
	return mongoshOnce.path
}

// runMongosh runs a script with the real mongosh against uri and returns
// its output; it fails the test if mongosh exits non-zero.
func runMongosh(t testing.TB, uri, script string) string {
	t.Helper()
	bin := mongosh(t)
	f := filepath.Join(t.TempDir(), "script.js")
	if err := os.WriteFile(f, []byte(script), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--nodb", "--quiet", "--norc", f)
	cmd.Env = append(os.Environ(), "TSPROXY_URI="+uri, "MONGOSH_SKIP_NODE_VERSION_CHECK=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("mongosh: %v\n%s", err, out)
	}
	return string(out)
}

// mustD unmarshals a raw document for comparisons.
func mustD(t testing.TB, raw bson.Raw) bson.D {
	t.Helper()
	var d bson.D
	if err := bson.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	return d
}

// runClients runs f(0..n-1) at once, one goroutine each, and fails the
// test with the first error any returned.
func runClients(t testing.TB, n int, f func(c int) error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for c := 0; c < n; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			if err := f(c); err != nil {
				errs <- err
			}
		}(c)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// flushAt runs tsproxyFlush on the proxy at addr over a connection of its
// own, and returns the command's error.
func flushAt(addr string) error {
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer nc.Close()
	body, err := bson.Marshal(bson.D{{Key: "tsproxyFlush", Value: 1}, {Key: "$db", Value: "admin"}})
	if err != nil {
		return err
	}
	frame, err := (&wire.Msg{Body: body}).Encode(nil, wire.Header{RequestID: 1})
	if err != nil {
		return err
	}
	_ = nc.SetDeadline(time.Now().Add(time.Minute))
	if _, err := nc.Write(frame); err != nil {
		return err
	}
	_, rf, err := wire.ReadMessage(bufio.NewReader(nc), nil, 48_000_000)
	if err != nil {
		return err
	}
	var reply wire.Msg
	if err := reply.Decode(rf); err != nil {
		return err
	}
	if ok, _ := bson.Raw(reply.Body).Lookup("ok").AsFloat64OK(); ok != 1 {
		return fmt.Errorf("tsproxyFlush: %s", bson.Raw(reply.Body))
	}
	return nil
}
