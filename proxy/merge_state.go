package proxy

import (
	"sync"
	"time"

	"github.com/tsproxy/tsproxy/proxy/telemetry"
	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rules"
)

// RetryHorizon is how long the records of merged retryable writes are
// kept: a driver retries within its server selection timeout (30 s by
// default), after a proxy restarts too.
const RetryHorizon = 10 * time.Minute

// mergeState is the proxy's side of its merges.
type mergeState struct {
	mu    sync.Mutex
	locks map[string]*sync.Mutex // by rule namespace
	// inflight, by rule namespace: staged inserts hold it shared, a
	// freeze exclusively, so no insert of this proxy is past FerretDB's
	// catalog lookup when a staging collection is renamed.
	inflight map[string]*sync.RWMutex
	// activity is what this proxy staged into each rule (by namespace)
	// since its last freeze of everything staged: the background
	// merger's measure of "took nothing new" and of the backlog. Nothing
	// is counted on the upstream for it: a count decodes every document
	// on FerretDB (it took 40% of the upstream's time under load), and on
	// FerretDB each proxy freezes only the staging collections it wrote.
	activity map[string]*stagedSince
	stats    map[string]*ruleStageStats // by rule namespace, for metrics
	// gens is the generation of this proxy's own staging collections, by
	// rule namespace (stage.Stager.Gen): moved on at every freeze, under
	// the rule's inflight lock.
	gens map[string]int64
}

// stagedSince is a rule's staging since its last freeze.
type stagedSince struct {
	last   time.Time // the last staged insert, or when staging was first seen
	events int64
}

// ruleStageStats are one rule's staging figures, for the metrics.
type ruleStageStats = telemetry.Staging

func newMergeState() *mergeState {
	return &mergeState{locks: map[string]*sync.Mutex{}, inflight: map[string]*sync.RWMutex{}, activity: map[string]*stagedSince{}, stats: map[string]*ruleStageStats{}, gens: map[string]int64{}}
}

func (m *mergeState) lock(ns string) *sync.Mutex {
	m.mu.Lock()
	defer m.mu.Unlock()
	return entry(m.locks, ns)
}

func (m *mergeState) inserts(ns string) *sync.RWMutex {
	m.mu.Lock()
	defer m.mu.Unlock()
	return entry(m.inflight, ns)
}

// gen is the generation of the rule's own staging collections; since
// (the start of this run, in ms) until the first freeze.
func (m *mergeState) gen(ns string, since int64) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	g, ok := m.gens[ns]
	if !ok {
		g = since
		m.gens[ns] = g
	}
	return g
}

// nextGen moves the rule's generation on, past now (ms): a freeze took
// the collections of the current one.
func (m *mergeState) nextGen(ns string, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.gens[ns] = max(m.gens[ns]+1, now.UnixMilli())
}

// entry is byName[name], made (zero) when missing. The caller holds mu.
func entry[T any](byName map[string]*T, name string) *T {
	v := byName[name]
	if v == nil {
		v = new(T)
		byName[name] = v
	}
	return v
}

// MaxStagedEvents bounds a rule's staging: once this proxy staged this
// many events since the last merge, everything staged is merged even
// while it still takes inserts (the records of merged retryable writes
// keep that safe), so what staging holds, and what one merge reads into
// memory, stays bounded.
const MaxStagedEvents = 50_000

// due is the background policy: a rule's staging collections are merged
// once it has staged nothing for the rule's mergeAfter, or once it holds
// MaxStagedEvents. Staging collections this proxy did not write (left by
// a restart, or written by another proxy) count as staged when first
// seen.
func (m *mergeState) due(rule *rules.Rule, now time.Time) func(c stage.Collection) bool {
	return func(stage.Collection) bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		a := m.stagedSince(rule)
		if a.last.IsZero() {
			a.last = now
		}
		return a.events >= MaxStagedEvents || now.Sub(a.last) >= rule.MergeAfter
	}
}

func (m *mergeState) stagedSince(rule *rules.Rule) *stagedSince {
	return entry(m.activity, rule.Namespace)
}

// frozeAll forgets rule's staging activity: a freeze took everything
// staged (the caller holds the rule's inserts off).
func (m *mergeState) frozeAll(rule *rules.Rule) {
	m.mu.Lock()
	defer m.mu.Unlock()
	*m.stagedSince(rule) = stagedSince{}
}

// record adds a merge's figures to the rule's.
func (m *mergeState) record(rule *rules.Rule, st stage.Stats, background bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.ruleStats(rule)
	r.Merged += int64(st.Events)
	r.Buckets += int64(st.Buckets)
	r.Retries += int64(st.Retries)
	if background || st.Pending == 0 {
		r.Pending, r.PendingEvents = int64(st.Pending), m.stagedSince(rule).events
		switch {
		case st.Pending == 0:
			r.Oldest = time.Time{}
		case r.Oldest.IsZero():
			r.Oldest = time.Now()
		}
	}
}

func (m *mergeState) ruleStats(rule *rules.Rule) *ruleStageStats {
	return entry(m.stats, rule.Namespace)
}

// staged records events acknowledged into a rule's staging tier.
func (m *mergeState) staged(rule *rules.Rule, n int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ruleStats(rule).Staged += n
	a := m.stagedSince(rule)
	a.last, a.events = time.Now(), a.events+n
}

// snapshot copies every rule's figures.
func (m *mergeState) snapshot() map[string]ruleStageStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]ruleStageStats, len(m.stats))
	for ns, r := range m.stats {
		out[ns] = *r
	}
	return out
}
