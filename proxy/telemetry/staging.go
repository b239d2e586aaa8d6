package telemetry

import (
	"context"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Staging are one rule's staging-tier figures (rewrite/stage): totals
// since the proxy started, and the backlog its last background merge saw.
type Staging struct {
	Staged, Merged, Buckets, Retries int64
	// Pending staging collections and the events this proxy staged in
	// them; Oldest is when the oldest of them was first seen pending
	// (zero when none is).
	Pending       int64
	PendingEvents int64
	Oldest        time.Time
	// Throttled counts the staged inserts that waited for room (the
	// rule's maxStaged).
	Throttled int64
	// Collections counts the staging collections merged, and Kept those
	// of them merged from what the proxy kept of its inserts, without
	// reading them back (limits.stagedMemory).
	Collections, Kept int64
	// Failures counts the merges that failed: before a read or at a
	// flush, and the background merger's rounds (its upstream
	// unreachable included). The next merge finishes what one left.
	Failures int64
}

// ObserveStaging reports snapshot's figures, per rule, at each collection
// of the metrics: tsproxy.staging.events{state=staged|merged},
// tsproxy.staging.buckets, tsproxy.staging.retries,
// tsproxy.staging.throttled,
// tsproxy.staging.pending{unit=collections|events},
// tsproxy.staging.collections{from=kept|read} (staging collections
// merged, from what the proxy kept or read back),
// tsproxy.staging.merge_failures and
// tsproxy.staging.lag (seconds the oldest pending collection has waited).
// The mean fill of merged buckets is merged events / buckets. stop ends
// the reports (a Server's Shutdown calls it: the meter is global).
func ObserveStaging(snapshot func() map[string]Staging) (stop func() error, err error) {
	m := otel.Meter(instrumentationName)
	events, err := m.Int64ObservableCounter("tsproxy.staging.events", metric.WithDescription("Events staged and merged into buckets, by rule."))
	if err != nil {
		return nil, err
	}
	buckets, err := m.Int64ObservableCounter("tsproxy.staging.buckets", metric.WithDescription("Buckets written by merges, by rule."))
	if err != nil {
		return nil, err
	}
	retries, err := m.Int64ObservableCounter("tsproxy.staging.retries", metric.WithDescription("Staged documents left out of a merge as retries of writes merged before, by rule."))
	if err != nil {
		return nil, err
	}
	pending, err := m.Int64ObservableGauge("tsproxy.staging.pending", metric.WithDescription("Merge backlog: staging collections and the events this proxy staged in them, not merged yet, by rule."))
	if err != nil {
		return nil, err
	}
	throttled, err := m.Int64ObservableCounter("tsproxy.staging.throttled", metric.WithDescription("Staged inserts that waited for the merge to make room (the rule's maxStaged), by rule."))
	if err != nil {
		return nil, err
	}
	colls, err := m.Int64ObservableCounter("tsproxy.staging.collections", metric.WithDescription("Staging collections merged, from what the proxy kept of its inserts or read back, by rule."))
	if err != nil {
		return nil, err
	}
	failures, err := m.Int64ObservableCounter("tsproxy.staging.merge_failures", metric.WithDescription("Merges that failed, by rule: before a read, at a flush, or a background round (its upstream unreachable included). The next merge finishes what one left; the background merger waits longer after each failure in a row, up to 10 s."))
	if err != nil {
		return nil, err
	}
	lag, err := m.Float64ObservableGauge("tsproxy.staging.lag", metric.WithDescription("How long the oldest pending staging collection has waited, by rule."), metric.WithUnit("s"))
	if err != nil {
		return nil, err
	}
	reg, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		now := time.Now()
		for ns, s := range snapshot() {
			rule := attribute.String("rule", ns)
			o.ObserveInt64(events, s.Staged, metric.WithAttributes(rule, attribute.String("state", "staged")))
			o.ObserveInt64(events, s.Merged, metric.WithAttributes(rule, attribute.String("state", "merged")))
			o.ObserveInt64(buckets, s.Buckets, metric.WithAttributes(rule))
			o.ObserveInt64(retries, s.Retries, metric.WithAttributes(rule))
			o.ObserveInt64(throttled, s.Throttled, metric.WithAttributes(rule))
			o.ObserveInt64(colls, s.Kept, metric.WithAttributes(rule, attribute.String("from", "kept")))
			o.ObserveInt64(colls, s.Collections-s.Kept, metric.WithAttributes(rule, attribute.String("from", "read")))
			o.ObserveInt64(failures, s.Failures, metric.WithAttributes(rule))
			o.ObserveInt64(pending, s.Pending, metric.WithAttributes(rule, attribute.String("unit", "collections")))
			o.ObserveInt64(pending, s.PendingEvents, metric.WithAttributes(rule, attribute.String("unit", "events")))
			var waited float64
			if !s.Oldest.IsZero() {
				waited = now.Sub(s.Oldest).Seconds()
			}
			o.ObserveFloat64(lag, waited, metric.WithAttributes(rule))
		}
		return nil
	}, events, buckets, retries, throttled, pending, colls, failures, lag)
	if err != nil {
		return nil, err
	}
	return reg.Unregister, nil
}
