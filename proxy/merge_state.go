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
	// quiet remembers, per staging collection (db.coll), its count and
	// since when it has had that count: the background merger's measure
	// of "took nothing new".
	quiet map[string]quietSeen
	stats map[string]*ruleStageStats // by rule namespace, for metrics
}

type quietSeen struct {
	count int64
	since time.Time
}

// ruleStageStats are one rule's staging figures, for the metrics.
type ruleStageStats = telemetry.Staging

func newMergeState() *mergeState {
	return &mergeState{locks: map[string]*sync.Mutex{}, inflight: map[string]*sync.RWMutex{}, quiet: map[string]quietSeen{}, stats: map[string]*ruleStageStats{}}
}

func (m *mergeState) lock(ns string) *sync.Mutex {
	m.mu.Lock()
	defer m.mu.Unlock()
	l := m.locks[ns]
	if l == nil {
		l = &sync.Mutex{}
		m.locks[ns] = l
	}
	return l
}

func (m *mergeState) inserts(ns string) *sync.RWMutex {
	m.mu.Lock()
	defer m.mu.Unlock()
	l := m.inflight[ns]
	if l == nil {
		l = &sync.RWMutex{}
		m.inflight[ns] = l
	}
	return l
}

// MaxStagedDocs bounds a staging collection: one that holds this many
// staged documents is merged even while it still takes inserts (the
// records of merged retryable writes keep that safe), so what staging
// holds, and what one merge reads into memory, stays bounded.
const MaxStagedDocs = 20_000

// due is the background policy: a staging collection is merged once its
// count has not changed for the rule's mergeAfter, or once it holds
// MaxStagedDocs.
func (m *mergeState) due(rule *rules.Rule, now time.Time) func(c stage.Collection, count int64) bool {
	return func(c stage.Collection, count int64) bool {
		if count >= MaxStagedDocs {
			return true
		}
		key := rule.DB + "." + c.Name
		m.mu.Lock()
		defer m.mu.Unlock()
		q, ok := m.quiet[key]
		if !ok || q.count != count {
			m.quiet[key] = quietSeen{count: count, since: now}
			return false
		}
		if now.Sub(q.since) < rule.MergeAfter {
			return false
		}
		delete(m.quiet, key)
		return true
	}
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
		r.Pending, r.PendingDocs = int64(st.Pending), st.Staged
		switch {
		case st.Pending == 0:
			r.Oldest = time.Time{}
		case r.Oldest.IsZero():
			r.Oldest = time.Now()
		}
	}
}

func (m *mergeState) ruleStats(rule *rules.Rule) *ruleStageStats {
	r := m.stats[rule.Namespace]
	if r == nil {
		r = &ruleStageStats{}
		m.stats[rule.Namespace] = r
	}
	return r
}

// staged records events acknowledged into a rule's staging tier.
func (m *mergeState) staged(rule *rules.Rule, n int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ruleStats(rule).Staged += n
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
