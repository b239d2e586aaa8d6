// Package telemetry holds the proxy's OpenTelemetry instruments: the
// connection gauge, the command counter and latency histograms by command
// and route, error counts by kind, bytes in and out, and a span per
// command when tracing is on. The instruments come from the global
// providers, which cmd/tsproxy sets up (Prometheus, OTLP); without that
// setup they are no-ops.
//
// It must not see documents: only command names, routes and sizes.
package telemetry
