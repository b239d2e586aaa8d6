package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"

	"github.com/tsproxy/tsproxy/rules"
)

// TestPasswordNotLogged: a password holding '?' (which the driver,
// and so the config check, accepts) is written to the startup log.
func TestPasswordNotLogged(t *testing.T) {
	t.Chdir(t.TempDir())
	cfg := writeConfig(t, `
listen: 127.0.0.1:0
upstream:
  uri: "mongodb://app:s3cret?x@127.0.0.1:1/"
telemetry:
  metricsListen: ""
shutdownTimeout: 0s
`)
	_, logs, cancel, done := startRun(t, cfg)
	cancel()
	<-done
	if strings.Contains(logs.String(), "s3cret") {
		t.Errorf("log shows the password:\n%s", logs)
	}
}

// TestOTLPEndpointTrailingSlash: telemetry.otlpEndpoint
// "http://host:4318/" is accepted, and the metrics are then posted to
// "//v1/metrics", which an OTLP collector answers 404.
func TestOTLPEndpointTrailingSlash(t *testing.T) {
	var mu sync.Mutex
	var paths []string
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.URL.Path)
		mu.Unlock()
	}))
	defer hs.Close()
	ts, err := setupTelemetry(context.Background(), rules.Telemetry{ServiceName: "t", OTLPEndpoint: hs.URL + "/"})
	if err != nil {
		t.Fatal(err)
	}
	c, _ := otel.Meter("review").Int64Counter("review.c")
	c.Add(context.Background(), 1)
	ts.shutdown() // flushes the metrics
	time.Sleep(100 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if len(paths) == 0 {
		t.Fatal("nothing posted")
	}
	for _, p := range paths {
		if p != "/v1/metrics" && p != "/v1/traces" {
			t.Errorf("posted to %q", p)
		}
	}
}
