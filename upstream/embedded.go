package upstream

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"

	"github.com/FerretDB/FerretDB/ferretdb"
)

// EmbeddedOptions configures the in-process FerretDB upstream.
type EmbeddedOptions struct {
	// DataDir holds the SQLite files; created if missing.
	DataDir string
	// Listen is the loopback address FerretDB listens on; "127.0.0.1:0"
	// (a free port) when empty. It is never exposed to clients: they reach
	// it only through the proxy.
	Listen string
	// Logger receives FerretDB's own logs; they are noisy at info level
	// (a line per connection), so callers usually pass a warn-level logger.
	Logger *slog.Logger
}

// Embedded is a FerretDB v1.24 server with its SQLite backend, running in
// this process. It is a real server with real storage: the proxy talks to it
// over loopback TCP exactly as it talks to any other upstream.
type Embedded struct {
	dir    string
	uri    string
	addr   string
	cancel context.CancelFunc
	done   chan struct{}
}

// StartEmbedded starts FerretDB and returns once it is listening.
func StartEmbedded(opts EmbeddedOptions) (*Embedded, error) {
	dir := opts.DataDir
	if dir == "" {
		dir = "data"
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("embedded upstream: data dir %q: %w", dir, err)
	}
	if err := os.MkdirAll(abs, 0o750); err != nil {
		return nil, fmt.Errorf("embedded upstream: data dir %q: %w", dir, err)
	}
	listen := opts.Listen
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	f, err := ferretdb.New(&ferretdb.Config{
		Listener:  ferretdb.ListenerConfig{TCP: listen},
		Handler:   "sqlite",
		SQLiteURL: "file:" + abs + "/",
		Logger:    slog.New(lazyAttrs{h: logger.Handler()}),
	})
	if err != nil {
		return nil, fmt.Errorf("embedded upstream: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &Embedded{dir: abs, uri: f.MongoDBURI(), cancel: cancel, done: make(chan struct{})}
	host, err := hostOfURI(e.uri)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("embedded upstream: %w", err)
	}
	e.addr = host
	go func() {
		defer close(e.done)
		_ = f.Run(ctx) // returns only when ctx is cancelled
	}()
	return e, nil
}

// URI is the mongodb:// URI of the embedded server.
func (e *Embedded) URI() string { return e.uri }

// Addr is its host:port.
func (e *Embedded) Addr() string { return e.addr }

// Close stops the server and waits for it to release its files.
func (e *Embedded) Close() error {
	e.cancel()
	<-e.done
	return nil
}

func hostOfURI(uri string) (string, error) {
	u, err := ParseURI(uri)
	if err != nil {
		return "", err
	}
	if len(u.Hosts) != 1 {
		return "", fmt.Errorf("unexpected URI %q", uri)
	}
	if _, _, err := net.SplitHostPort(u.Hosts[0]); err != nil {
		return "", err
	}
	return u.Hosts[0], nil
}
