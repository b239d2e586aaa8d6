package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"

	"github.com/tsproxy/tsproxy/proxy"
	"github.com/tsproxy/tsproxy/rules"
)

// telemetrySetup holds the OpenTelemetry providers the proxy reports to.
type telemetrySetup struct {
	registry *prometheus.Registry
	tracing  bool
	closers  []func(context.Context) error
}

// setupTelemetry installs global meter (Prometheus, and OTLP when an
// endpoint is set) and tracer (OTLP only) providers.
func setupTelemetry(ctx context.Context, t rules.Telemetry) (*telemetrySetup, error) {
	res := resource.NewSchemaless(semconv.ServiceName(t.ServiceName))
	ts := &telemetrySetup{registry: prometheus.NewRegistry()}
	exp, err := otelprom.New(otelprom.WithRegisterer(ts.registry), otelprom.WithoutScopeInfo()) // the series README shows: no otel_scope_* labels
	if err != nil {
		return nil, fmt.Errorf("telemetry: prometheus exporter: %w", err)
	}
	mopts := []sdkmetric.Option{sdkmetric.WithResource(res), sdkmetric.WithReader(exp)}
	if t.OTLPEndpoint != "" {
		mexp, err := otlpmetrichttp.New(ctx, otlpmetrichttp.WithEndpointURL(strings.TrimSuffix(t.OTLPEndpoint, "/")+"/v1/metrics"))
		if err != nil {
			return nil, fmt.Errorf("telemetry: OTLP metrics: %w", err)
		}
		mopts = append(mopts, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(mexp)))
		texp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(strings.TrimSuffix(t.OTLPEndpoint, "/")+"/v1/traces"))
		if err != nil {
			return nil, fmt.Errorf("telemetry: OTLP traces: %w", err)
		}
		tp := sdktrace.NewTracerProvider(sdktrace.WithResource(res), sdktrace.WithBatcher(texp))
		otel.SetTracerProvider(tp)
		ts.tracing = true
		ts.closers = append(ts.closers, tp.Shutdown)
	}
	mp := sdkmetric.NewMeterProvider(mopts...)
	otel.SetMeterProvider(mp)
	ts.closers = append(ts.closers, mp.Shutdown)
	return ts, nil
}

func (ts *telemetrySetup) shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, c := range ts.closers {
		_ = c(ctx)
	}
}

// serveHTTP serves /metrics, /healthz (the process is up) and /readyz
// (the upstream can be reached) on addr; nil when addr is empty.
func serveHTTP(addr string, ts *telemetrySetup, srv *proxy.Server, log *slog.Logger) (*http.Server, error) {
	if addr == "" {
		return nil, nil
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(ts.registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := srv.Ready(ctx); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("telemetry.metricsListen %s: %w", addr, err)
	}
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics endpoint stopped", "err", err.Error())
		}
	}()
	log.Info("metrics on /metrics, health on /healthz and /readyz", "addr", ln.Addr().String())
	return hs, nil
}
