package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/tsproxy/tsproxy/upstream"
)

// TestRunListenUnix: with listenUnix the proxy takes clients on a Unix
// socket as well as on TCP, over a socket file a killed proxy left; an
// event written through one is read back through the other, exactly once
// (one proxy: its staging is the same whichever listener a client came
// in by).
func TestRunListenUnix(t *testing.T) {
	t.Chdir(t.TempDir())
	dir, err := os.MkdirTemp("", "tsx") // short: a socket's path is at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "tsproxy.sock")
	// What a kill -9 leaves: the socket file, nobody listening.
	stale, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()

	cfg := writeConfig(t, `
listen: 127.0.0.1:0
listenUnix: `+sock+`
upstream:
  uri: embedded
  dataDir: `+filepath.Join(t.TempDir(), "data")+`
telemetry:
  metricsListen: ""
shutdownTimeout: 5s
rules:
  - namespace: u.readings
    timeField: ts
    metaField: sensor
`)
	addr, logs, cancel, done := startRun(t, cfg)
	defer cancel()

	octx, ocancel := context.WithTimeout(context.Background(), time.Minute)
	defer ocancel()
	client := func(uri string) *mongo.Collection {
		t.Helper()
		c, err := mongo.Connect(options.Client().ApplyURI(uri).SetServerSelectionTimeout(10 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Disconnect(context.Background()) })
		return c.Database("u").Collection("readings")
	}
	overSocket, overTCP := client(upstream.SocketURI(sock)), client("mongodb://"+addr+"/")
	at := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	for i := range 10 {
		if _, err := overSocket.InsertOne(octx, bson.D{{Key: "ts", Value: at.Add(time.Duration(i) * time.Second)}, {Key: "sensor", Value: "s1"}, {Key: "v", Value: i}}); err != nil {
			t.Fatalf("insert over the socket: %v", err)
		}
	}
	for name, coll := range map[string]*mongo.Collection{"TCP": overTCP, "the socket": overSocket} {
		n, err := coll.CountDocuments(octx, bson.D{})
		if err != nil || n != 10 {
			t.Fatalf("count over %s: %d, %v; want the 10 events", name, n, err)
		}
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run after cancel: %v\n%s", err, logs)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run did not return after cancel")
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Fatalf("socket file left after shutdown: %v", err)
	}
}

// TestListenUnixRefuses: a path that is not a socket, or one another
// process listens on, is left alone.
func TestListenUnixRefuses(t *testing.T) {
	dir, err := os.MkdirTemp("", "tsx")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, "file.sock")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := listenUnix(file); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("listen over a file: %v", err)
	}
	live := filepath.Join(dir, "live.sock")
	other, err := net.Listen("unix", live)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := listenUnix(live); err == nil || !strings.Contains(err.Error(), "another process listens") {
		t.Fatalf("listen over a live socket: %v", err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Fatalf("the live socket was removed: %v", err)
	}
}
