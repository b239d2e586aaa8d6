package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// syncBuffer is a log sink safe for the concurrent writes of slog.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// logRecords parses the JSON log lines written so far.
func (s *syncBuffer) logRecords(t *testing.T) []map[string]any {
	t.Helper()
	var recs []map[string]any
	sc := bufio.NewScanner(strings.NewReader(s.String()))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("log line %q is not JSON: %v", sc.Text(), err)
		}
		recs = append(recs, m)
	}
	return recs
}

// startRun runs the program with config file cfg until cancel, and
// returns once it listens: its TCP address, its log, and run's result.
func startRun(t *testing.T, cfg string) (addr string, logs *syncBuffer, cancel context.CancelFunc, done chan error) {
	t.Helper()
	logs = &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done = make(chan error, 1)
	go func() { done <- run(ctx, []string{"--config", cfg}, logs, ready) }()
	select {
	case addr = <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("run ended before it was ready: %v\n%s", err, logs)
	case <-time.After(60 * time.Second):
		cancel()
		t.Fatalf("run not ready after 60s\n%s", logs)
	}
	return addr, logs, cancel, done
}

func writeConfig(t *testing.T, yaml string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(f, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestRunServesAndShutsDown starts the whole program (config file,
// embedded upstream, proxy, metrics endpoint), drives it with the Go
// driver and over HTTP, then cancels its context.
func TestRunServesAndShutsDown(t *testing.T) {
	// Every file the proxy writes is under its data folder: none in the
	// working directory (FerretDB's own command writes state.json there).
	work := t.TempDir()
	t.Chdir(work)
	data := filepath.Join(t.TempDir(), "data")
	cfg := writeConfig(t, `
listen: 127.0.0.1:0
upstream:
  uri: embedded
  dataDir: `+data+`
telemetry:
  metricsListen: 127.0.0.1:0
  logFormat: json
  logLevel: info
shutdownTimeout: 5s
`)
	addr, logs, cancel, done := startRun(t, cfg)
	defer cancel()

	// The metrics address is in the log line that announces the endpoint.
	var metricsAddr string
	for _, r := range logs.logRecords(t) {
		if msg, _ := r["msg"].(string); strings.HasPrefix(msg, "metrics on /metrics") {
			metricsAddr, _ = r["addr"].(string)
		}
	}
	if metricsAddr == "" || strings.HasSuffix(metricsAddr, ":0") {
		t.Fatalf("no metrics address in the log:\n%s", logs)
	}
	if _, err := os.Stat(data); err != nil {
		t.Fatalf("embedded upstream data dir: %v", err)
	}

	client, err := mongo.Connect(options.Client().ApplyURI("mongodb://" + addr + "/").SetServerSelectionTimeout(10 * time.Second).SetTimeout(30 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Disconnect(context.Background())
	octx, ocancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer ocancel()
	for i := 0; i < 3; i++ {
		if err := client.Ping(octx, nil); err != nil {
			t.Fatalf("ping through run's proxy: %v", err)
		}
	}
	coll := client.Database("runtest").Collection("c")
	if _, err := coll.InsertOne(octx, bson.D{{Key: "_id", Value: 1}, {Key: "x", Value: "y"}}); err != nil {
		t.Fatalf("insert: %v", err)
	}
	var back struct{ X string }
	if err := coll.FindOne(octx, bson.D{{Key: "_id", Value: 1}}).Decode(&back); err != nil || back.X != "y" {
		t.Fatalf("find: %+v, %v", back, err)
	}
	// A time-series collection: its catalog, staging and buckets.
	ts := options.CreateCollection().SetTimeSeriesOptions(options.TimeSeries().SetTimeField("ts"))
	if err := client.Database("runtest").CreateCollection(octx, "ts", ts); err != nil {
		t.Fatalf("create time-series: %v", err)
	}
	if _, err := client.Database("runtest").Collection("ts").InsertOne(octx, bson.D{{Key: "ts", Value: time.Now()}}); err != nil {
		t.Fatalf("insert into time-series: %v", err)
	}
	if n, err := client.Database("runtest").Collection("ts").CountDocuments(octx, bson.D{}); err != nil || n != 1 {
		t.Fatalf("count of time-series: %d, %v", n, err)
	}

	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + metricsAddr + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(b)
	}
	if code, body := get("/healthz"); code != 200 {
		t.Fatalf("/healthz: %d %s", code, body)
	}
	if code, body := get("/readyz"); code != 200 {
		t.Fatalf("/readyz: %d %s", code, body)
	}
	code, metrics := get("/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	found := map[string]bool{}
	for _, line := range strings.Split(metrics, "\n") {
		if strings.HasPrefix(line, "tsproxy_commands_total{") && strings.Contains(line, `command="ping"`) {
			found["ping"] = true
			// 3 pings at least (drivers may add their own)
			fields := strings.Fields(line)
			if v := fields[len(fields)-1]; v == "0" || v == "1" || v == "2" {
				t.Errorf("ping counter %s after 3 pings: %s", v, line)
			}
		}
		if strings.HasPrefix(line, "tsproxy_commands_total{") && strings.Contains(line, `command="insert"`) {
			found["insert"] = true
		}
		if strings.HasPrefix(line, "tsproxy_connections") {
			found["connections"] = true
		}
		if strings.HasPrefix(line, "tsproxy_command_duration_seconds_bucket{") {
			found["latency"] = true
		}
	}
	for _, k := range []string{"ping", "insert", "connections", "latency"} {
		if !found[k] {
			t.Errorf("/metrics lacks %s:\n%s", k, metrics)
		}
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run after cancel: %v\n%s", err, logs)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("run did not return 20s after cancel\n%s", logs)
	}
	if !strings.Contains(logs.String(), "shutdown complete") {
		t.Fatalf("no \"shutdown complete\" in the log:\n%s", logs)
	}
	if left, err := os.ReadDir(work); err != nil || len(left) != 0 {
		t.Fatalf("the proxy wrote into its working directory: %v %v", left, err)
	}
	// Everything is closed: the proxy and the metrics endpoint refuse.
	if _, err := http.Get("http://" + metricsAddr + "/healthz"); err == nil {
		t.Fatal("metrics endpoint still serving after run returned")
	}
	pctx, pcancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer pcancel()
	if err := client.Ping(pctx, nil); err == nil {
		t.Fatal("proxy still serving after run returned")
	}
}

// TestRunRejectsUnknownKey: a misspelt key stops run before it starts
// anything, with an error naming the key.
func TestRunRejectsUnknownKey(t *testing.T) {
	for _, tc := range []struct{ yaml, key string }{
		{"listen: 127.0.0.1:0\nlistenn: 127.0.0.1:0\n", `"listenn"`},
		{"listen: 127.0.0.1:0\nupstream:\n  uri: embedded\n  dataDri: x\n", `"upstream.dataDri"`},
		{"telemetry:\n  metricsListen: \"\"\n  bogus: 1\n", `"telemetry.bogus"`},
	} {
		cfg := writeConfig(t, tc.yaml)
		logs := &syncBuffer{}
		ready := make(chan string, 1)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := run(ctx, []string{"--config", cfg}, logs, ready)
		cancel()
		if err == nil {
			t.Fatalf("config %q: run succeeded", tc.yaml)
		}
		if !strings.Contains(strings.ToLower(err.Error()), strings.ToLower(tc.key)) || !strings.Contains(err.Error(), "unknown key") {
			t.Fatalf("config %q: error %q does not name unknown key %s", tc.yaml, err, tc.key)
		}
		select {
		case a := <-ready:
			t.Fatalf("run reported ready on %s with a bad config", a)
		default:
		}
	}
}

// TestRunBadFlag: an unknown flag is an error naming it.
func TestRunBadFlag(t *testing.T) {
	err := run(context.Background(), []string{"--no-such-flag"}, io.Discard, nil)
	if err == nil || !strings.Contains(err.Error(), "no-such-flag") {
		t.Fatalf("unknown flag: %v", err)
	}
}
