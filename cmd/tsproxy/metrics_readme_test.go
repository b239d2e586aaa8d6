package main

import (
	"context"
	"io"
	"net/http/httptest"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tsproxy/tsproxy/proxy/telemetry"
	"github.com/tsproxy/tsproxy/rules"
)

// TestREADMEScrapeMatchesExport: every line of the sample scrape in
// docs/operations.md (## Metrics, linked from the README) must be a
// series the exporter set up by setupTelemetry produces: the same name
// and the same label names.
func TestREADMEScrapeMatchesExport(t *testing.T) {
	readme, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	sec := string(readme)
	sec = sec[strings.Index(sec, "## Metrics"):]
	sec = sec[strings.Index(sec, "```\n")+4:]
	sec = sec[:strings.Index(sec, "```")]

	ts, err := setupTelemetry(context.Background(), rules.Telemetry{ServiceName: "t"})
	if err != nil {
		t.Fatal(err)
	}
	defer ts.shutdown()
	stop, err := telemetry.ObserveStaging(func() map[string]telemetry.Staging {
		return map[string]telemetry.Staging{"iot.readings": {Staged: 3208, Merged: 3200, Buckets: 4, Collections: 3, Kept: 3, Oldest: time.Time{}}}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(ts.registry, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	b, _ := io.ReadAll(rec.Body)

	series := regexp.MustCompile(`^([a-z_]+)\{([^}]*)\}`)
	labelNames := func(s string) string {
		var names []string
		for _, kv := range strings.Split(s, ",") {
			names = append(names, strings.SplitN(kv, "=", 2)[0])
		}
		sort.Strings(names)
		return strings.Join(names, ",")
	}
	exported := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if m := series.FindStringSubmatch(line); m != nil {
			exported[m[1]] = labelNames(m[2])
		}
	}
	for _, line := range strings.Split(strings.TrimSpace(sec), "\n") {
		m := series.FindStringSubmatch(line)
		if m == nil {
			t.Errorf("docs/operations.md line not a series: %q", line)
			continue
		}
		got, ok := exported[m[1]]
		if !ok {
			t.Errorf("docs/operations.md shows %s, which is not exported", m[1])
			continue
		}
		if want := labelNames(m[2]); got != want {
			t.Errorf("docs/operations.md shows %s with labels {%s}; exported with {%s}", m[1], want, got)
		}
	}
}
