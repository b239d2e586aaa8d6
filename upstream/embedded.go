package upstream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"

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
	// Socket is the path of the Unix domain socket FerretDB also listens
	// on, for the proxy in this process (LocalURI): DataDir's
	// ferretdb.sock when empty; a file in a new temporary directory when
	// no socket can listen there (too long a path, a file system without
	// sockets); none, and a warning, when neither can.
	Socket string
	// Logger receives FerretDB's own logs; they are noisy at info level
	// (a line per connection), so callers usually pass a warn-level logger.
	Logger *slog.Logger
}

// Embedded is a FerretDB v1.24 server with its SQLite backend, running in
// this process. It is a real server with real storage: the proxy talks to
// it through the wire protocol exactly as it talks to any other upstream,
// over a Unix domain socket (LocalURI), which takes 10–25 µs less a
// command than loopback TCP here (3–5% of a one-event insert, see
// docs/benchmarks.md). It listens on loopback TCP too (URI), for tools and
// tests.
type Embedded struct {
	dir     string
	uri     string
	addr    string
	socket  string
	tempDir string // holds the socket when DataDir's path was too long; removed by Close
	cancel  context.CancelFunc
	done    chan struct{}
}

// maxSocketPath is the longest path a Unix socket's address holds on Linux
// (sun_path is 108 bytes, the last a NUL).
const maxSocketPath = 107

// socketFile is the name of the embedded server's socket in its data dir.
const socketFile = "ferretdb.sock"

// embeddedSocket is where the embedded server's socket goes: path if
// given, else the data dir's socketFile; else, when that path is too long
// for a socket or its file system holds no sockets (some container bind
// mounts), a file in a new temporary directory, which the caller removes;
// else "": none, and the proxy dials TCP. A socket file left by a process
// that was killed is removed (RemoveStaleSocket); a live one, or another
// file, sends the socket elsewhere.
func embeddedSocket(path, dataDir string) (socket, tempDir string) {
	if path == "" {
		path = filepath.Join(dataDir, socketFile)
	}
	err := canListenOn(path)
	if err == nil {
		return path, ""
	}
	tempDir, terr := os.MkdirTemp("", "tsproxy-*")
	if terr == nil {
		socket = filepath.Join(tempDir, socketFile)
		if terr = canListenOn(socket); terr == nil {
			return socket, tempDir
		}
		removeTemp(tempDir)
	}
	// The default logger: the one given for FerretDB's own lines keeps
	// only errors.
	slog.Warn("embedded upstream: no Unix socket; the proxy dials it over loopback TCP", "socket", path, "err", errors.Join(err, terr))
	return "", ""
}

// canListenOn checks that a Unix socket can listen at path (FerretDB's
// own listen, failing after its TCP one, would leave that one open).
func canListenOn(path string) error {
	if len(path) > maxSocketPath {
		return fmt.Errorf("%s: longer than a socket's %d bytes", path, maxSocketPath)
	}
	if err := RemoveStaleSocket(path); err != nil {
		return err
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return err
	}
	return ln.Close() // removes the file
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
	if strings.Contains(abs, "%") {
		// FerretDB hands the path on to SQLite in a URL of its own,
		// unescaped: SQLite read "a%41b" as "aAb", another directory.
		return nil, fmt.Errorf("embedded upstream: data dir %q: a %% in its path cannot reach SQLite as it is; choose a path without one", abs)
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
	socket, tempDir := embeddedSocket(opts.Socket, abs)
	f, err := ferretdb.New(&ferretdb.Config{
		Listener: ferretdb.ListenerConfig{TCP: listen, Unix: socket},
		Handler:  "sqlite",
		// Escaped: FerretDB reads a URL, where "#" or "?" in the data
		// dir's name cut it and "%41" was read as "A" (another directory).
		SQLiteURL: (&url.URL{Scheme: "file", Path: abs + "/"}).String(),
		Logger:    slog.New(lazyAttrs{h: logger.Handler()}),
	})
	if err != nil {
		removeTemp(tempDir)
		return nil, fmt.Errorf("embedded upstream: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &Embedded{dir: abs, uri: f.MongoDBURI(), socket: socket, tempDir: tempDir, cancel: cancel, done: make(chan struct{})}
	host, err := hostOfURI(e.uri)
	if err != nil {
		cancel()
		removeTemp(tempDir)
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

// LocalURI is what a proxy in this process dials: the mongodb:// URI of
// its Unix domain socket, or URI when it has none (embeddedSocket).
func (e *Embedded) LocalURI() string {
	if e.socket == "" {
		return e.uri
	}
	return SocketURI(e.socket)
}

// Close stops the server and waits for it to release its files.
func (e *Embedded) Close() error {
	e.cancel()
	<-e.done
	removeTemp(e.tempDir)
	return nil
}

// removeTemp removes the socket's temporary directory, if one was made.
func removeTemp(dir string) {
	if dir != "" {
		_ = os.RemoveAll(dir)
	}
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
