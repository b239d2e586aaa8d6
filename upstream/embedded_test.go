package upstream

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// TestEmbeddedSocket: the embedded server answers on its Unix socket, which
// the Dialer reaches through LocalURI; a socket file left by a killed
// process does not stop the next start; a data dir whose path is too long
// for a socket's address gets its socket in a temporary directory, removed
// by Close.
func TestEmbeddedSocket(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ping := func(t *testing.T, e *Embedded) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		d, err := NewDialer(Options{URI: e.LocalURI()})
		if err != nil {
			t.Fatal(err)
		}
		c, err := d.Dial(ctx)
		if err != nil {
			t.Fatalf("dial %s: %v", e.LocalURI(), err)
		}
		defer c.Close()
		reply, err := c.Command(bson.D{{Key: "insert", Value: "c"}, {Key: "documents", Value: bson.A{bson.D{{Key: "x", Value: 1}}}}, {Key: "$db", Value: "d"}})
		if err != nil {
			t.Fatal(err)
		}
		if n, _ := reply.Lookup("n").AsInt64OK(); n != 1 {
			t.Fatalf("insert over the socket: %s", reply)
		}
	}

	t.Run("data dir, stale socket", func(t *testing.T) {
		dir := t.TempDir()
		// What a kill -9 leaves: the socket file, nobody listening.
		stale := filepath.Join(dir, socketFile)
		ln, err := net.Listen("unix", stale)
		if err != nil {
			t.Fatal(err)
		}
		ln.(*net.UnixListener).SetUnlinkOnClose(false)
		ln.Close()
		e, err := StartEmbedded(EmbeddedOptions{DataDir: dir, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		if want := SocketURI(stale); e.LocalURI() != want {
			t.Fatalf("LocalURI %s, want %s", e.LocalURI(), want)
		}
		ping(t, e)
	})

	t.Run("a file that is not a socket is left alone", func(t *testing.T) {
		dir := t.TempDir()
		file := filepath.Join(dir, socketFile)
		if err := os.WriteFile(file, []byte("mine"), 0o600); err != nil {
			t.Fatal(err)
		}
		e, err := StartEmbedded(EmbeddedOptions{DataDir: dir, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		if e.tempDir == "" || !strings.HasPrefix(e.socket, e.tempDir) {
			t.Fatalf("socket %s: want one in a temporary directory", e.socket)
		}
		if b, err := os.ReadFile(file); err != nil || string(b) != "mine" {
			t.Fatalf("the file at the socket's path: %q, %v", b, err)
		}
		ping(t, e)
	})

	t.Run("data dir without sockets, then no socket at all", func(t *testing.T) {
		dir := t.TempDir()
		// A directory where the socket would go stands for a file system
		// that holds no sockets: the listen there fails.
		if err := os.MkdirAll(filepath.Join(dir, socketFile, "x"), 0o700); err != nil {
			t.Fatal(err)
		}
		e, err := StartEmbedded(EmbeddedOptions{DataDir: dir, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		if e.tempDir == "" || !strings.HasPrefix(e.socket, e.tempDir) {
			t.Fatalf("socket %s: want one in a temporary directory", e.socket)
		}
		ping(t, e)
		e.Close()
		t.Setenv("TMPDIR", filepath.Join(dir, "missing")) // no temporary directory either
		if e, err = StartEmbedded(EmbeddedOptions{DataDir: dir, Logger: quiet}); err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		if e.socket != "" || e.LocalURI() != e.URI() {
			t.Fatalf("socket %q, LocalURI %s: want TCP (%s)", e.socket, e.LocalURI(), e.URI())
		}
		ping(t, e)
	})

	t.Run("long data dir", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), strings.Repeat("d", maxSocketPath))
		e, err := StartEmbedded(EmbeddedOptions{DataDir: dir, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(e.socket, dir) || len(e.socket) > maxSocketPath {
			t.Fatalf("socket %s: want one outside the long data dir", e.socket)
		}
		ping(t, e)
		e.Close()
		if _, err := os.Stat(filepath.Dir(e.socket)); !os.IsNotExist(err) {
			t.Fatalf("the socket's temporary directory is left after Close: %v", err)
		}
	})
}
