package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/tsproxy/tsproxy/proxy"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/upstream"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var err error
	switch {
	case len(os.Args) > 1 && os.Args[1] == "migrate":
		err = runMigrate(ctx, os.Args[2:], os.Stdout, os.Stderr)
	case len(os.Args) > 1 && os.Args[1] == "rollups":
		err = runRollups(ctx, os.Args[2:], os.Stdout, os.Stderr)
	case len(os.Args) > 1 && os.Args[1] == "unpack":
		err = runUnpack(ctx, os.Args[2:], os.Stdout, os.Stderr)
	case len(os.Args) > 1 && os.Args[1] == "summaries":
		err = runSummaries(ctx, os.Args[2:], os.Stdout, os.Stderr)
	default:
		err = run(ctx, os.Args[1:], os.Stderr, nil)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "tsproxy:", err)
		os.Exit(1)
	}
}

// run starts the proxy and serves until ctx ends; ready, when not nil,
// receives the proxy's address once it accepts clients.
func run(ctx context.Context, args []string, logOut io.Writer, ready chan<- string) error {
	fs := pflag.NewFlagSet("tsproxy", pflag.ContinueOnError)
	rules.RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg, err := rules.Load(rules.LoadOptions{Flags: fs})
	if err != nil {
		return err
	}
	log := newLogger(cfg.Telemetry, logOut)
	slog.SetDefault(log)

	tel, err := setupTelemetry(ctx, cfg.Telemetry)
	if err != nil {
		return err
	}
	defer tel.shutdown()

	up, err := startUpstream(cfg, log)
	if err != nil {
		return err
	}
	defer up.close()
	srv, lnTLS, err := newServer(cfg, up, tel, log)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	var more []net.Listener
	if cfg.ListenUnix != "" {
		uln, err := listenUnix(cfg.ListenUnix)
		if err != nil {
			ln.Close()
			return err
		}
		more = append(more, uln)
	}
	httpSrv, err := serveHTTP(cfg.Telemetry.MetricsListen, tel, srv, log)
	if err != nil {
		ln.Close()
		for _, l := range more {
			l.Close()
		}
		return err
	}
	if httpSrv != nil {
		defer httpSrv.Close()
	}

	checkCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	srv.CheckRules(checkCtx)
	cancel()

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln, more...) }()
	log.Info("tsproxy listening", "addr", ln.Addr().String(), "socket", cfg.ListenUnix, "upstream", rules.Redact(cfg.Upstream.URI), "rules", len(cfg.Rules), "tls", lnTLS != nil)
	if ready != nil {
		ready <- ln.Addr().String()
	}
	select {
	case err := <-serveErr:
		return err
	case <-ctx.Done():
	}
	return shutdown(srv, cfg.ShutdownTimeout, log)
}

// upstreamHandle is the server the proxy forwards to: the configured URI,
// or the embedded FerretDB started here (then with its hooks into its
// storage: the _id index, the mend of an orphaned table).
type upstreamHandle struct {
	uri               string
	indexIDs          func(context.Context, string, string) error
	dropOrphanedTable func(context.Context, string, string) (bool, error)
	close             func()
}

// listenUnix listens on the Unix socket at path, over a socket file a
// killed proxy left (upstream.RemoveStaleSocket).
func listenUnix(path string) (net.Listener, error) {
	if err := upstream.RemoveStaleSocket(path); err != nil {
		return nil, fmt.Errorf("listenUnix: %w", err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listenUnix %s: %w", path, err)
	}
	return ln, nil
}

func startUpstream(cfg *rules.Config, log *slog.Logger) (upstreamHandle, error) {
	if !cfg.Upstream.Embedded() {
		return upstreamHandle{uri: cfg.Upstream.URI, close: func() {}}, nil
	}
	emb, err := upstream.StartEmbedded(upstream.EmbeddedOptions{DataDir: cfg.Upstream.DataDir, Logger: embeddedLogger(log)})
	if err != nil {
		return upstreamHandle{}, err
	}
	log.Info("embedded upstream started (FerretDB, SQLite)", "data", cfg.Upstream.DataDir, "addr", emb.Addr(), "socket", emb.LocalURI())
	return upstreamHandle{uri: emb.LocalURI(), indexIDs: emb.IndexIDs, dropOrphanedTable: emb.DropOrphanedTable, close: func() { emb.Close() }}, nil
}

func newServer(cfg *rules.Config, up upstreamHandle, tel *telemetrySetup, log *slog.Logger) (*proxy.Server, *tls.Config, error) {
	upTLS, err := upstreamTLS(cfg.Upstream)
	if err != nil {
		return nil, nil, err
	}
	dialer, err := upstream.NewDialer(upstream.Options{URI: up.uri, DialTimeout: cfg.Upstream.DialTimeout, TLS: upTLS})
	if err != nil {
		return nil, nil, err
	}
	lnTLS, err := listenerTLS(cfg.ListenTLS)
	if err != nil {
		return nil, nil, err
	}
	srv, err := proxy.New(proxy.Options{
		Dialer:          dialer,
		Rules:           cfg.RuleSet(),
		TLS:             lnTLS,
		MaxConnections:  cfg.Limits.MaxConnections,
		MaxMessageBytes: cfg.Limits.MaxMessageBytes,
		MaxCursors:      cfg.Limits.MaxCursors,
		CursorTTL:       cfg.Limits.CursorTTL,
		FrameTimeout:    cfg.Limits.FrameTimeout,
		WriteTimeout:    cfg.Limits.WriteTimeout,
		RetryCacheSize:  cfg.Limits.RetryCacheSize,
		RetryCacheTTL:   cfg.Limits.RetryCacheTTL,
		AggregateMemory: cfg.Limits.AggregateMemory,
		StagedMemory:    stagedMemory(cfg.Limits.StagedMemory),
		Logger:          log,
		Tracing:         tel.tracing,
		IndexIDs:        up.indexIDs,

		DropOrphanedTable: up.dropOrphanedTable,

		CreateTimeseries: cfg.CreateTimeseries,
	})
	return srv, lnTLS, err
}

// shutdown stops taking connections and lets in-flight requests finish
// for up to timeout.
// stagedMemory is proxy.Options.StagedMemory for limits.stagedMemory,
// where 0 keeps nothing.
func stagedMemory(limit int) int64 {
	if limit == 0 {
		return -1
	}
	return int64(limit)
}

func shutdown(srv *proxy.Server, timeout time.Duration, log *slog.Logger) error {
	log.Info("shutting down: no new connections; finishing in-flight requests", "timeout", timeout.String())
	sctx, scancel := context.WithTimeout(context.Background(), timeout)
	defer scancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	log.Info("shutdown complete")
	return nil
}

func newLogger(t rules.Telemetry, out io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(t.LogLevel))
	opts := &slog.HandlerOptions{Level: level}
	if t.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(out, opts))
	}
	return slog.New(slog.NewTextHandler(out, opts))
}

// embeddedLogger quiets FerretDB, which logs every connection at info and
// every error reply, document included, at warn.
func embeddedLogger(log *slog.Logger) *slog.Logger {
	return slog.New(levelFloor{h: log.Handler(), min: slog.LevelError}).With("component", "embedded-upstream")
}

type levelFloor struct {
	h   slog.Handler
	min slog.Level
}

func (l levelFloor) Enabled(ctx context.Context, lv slog.Level) bool {
	return lv >= l.min && l.h.Enabled(ctx, lv)
}
func (l levelFloor) Handle(ctx context.Context, r slog.Record) error { return l.h.Handle(ctx, r) }
func (l levelFloor) WithAttrs(a []slog.Attr) slog.Handler {
	return levelFloor{h: l.h.WithAttrs(a), min: l.min}
}
func (l levelFloor) WithGroup(n string) slog.Handler {
	return levelFloor{h: l.h.WithGroup(n), min: l.min}
}
