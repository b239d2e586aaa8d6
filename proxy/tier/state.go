package tier

import (
	"fmt"
	"sync"
	"time"

	"github.com/tsproxy/tsproxy/proxy/telemetry"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rewrite/stage/merge"
	"github.com/tsproxy/tsproxy/rules"
)

// State is the proxy's side of its merges.
type State struct {
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
	// series is how many series the rule's last merge that wrote buckets
	// took (merge.Stats.Series), by namespace: the measure of how many
	// events a merge should take to fill its buckets (mergeBatch).
	series map[string]int
	// kicks wakes a rule's background merger, by namespace, when its
	// backlog makes a merge due (buffer of one: a wake-up pending is
	// enough).
	kicks map[string]chan struct{}
	// room, by namespace: closed when a freeze takes everything this
	// proxy staged into the rule, waking the inserts that wait for room
	// (admit).
	room map[string]chan struct{}
	// closing is closed by Server.Shutdown once it stops the merges:
	// nothing makes room any more, so inserts waiting for it are
	// refused at once (admit), where they held Shutdown up to their
	// maxTimeMS.
	closing     chan struct{}
	closingOnce sync.Once
}

// stagedSince is a rule's staging since its last freeze.
type stagedSince struct {
	last   time.Time // the last staged insert, or when staging was first seen
	events int64
	docs   int64 // staged inserts (about a staged document each)
}

// ruleStageStats are one rule's staging figures, for the metrics.
type ruleStageStats = telemetry.Staging

func NewState() *State {
	return &State{locks: map[string]*sync.Mutex{}, inflight: map[string]*sync.RWMutex{}, activity: map[string]*stagedSince{}, stats: map[string]*ruleStageStats{}, gens: map[string]int64{},
		series: map[string]int{}, kicks: map[string]chan struct{}{}, room: map[string]chan struct{}{}, closing: make(chan struct{})}
}

// Close wakes the inserts waiting for room, for good.
func (m *State) Close() { m.closingOnce.Do(func() { close(m.closing) }) }

func (m *State) Lock(ns string) *sync.Mutex {
	m.mu.Lock()
	defer m.mu.Unlock()
	return entry(m.locks, ns)
}

func (m *State) Inserts(ns string) *sync.RWMutex {
	m.mu.Lock()
	defer m.mu.Unlock()
	return entry(m.inflight, ns)
}

// Gen is the generation of the rule's own staging collections; since
// (the start of this run, in ms) until the first freeze.
func (m *State) Gen(ns string, since int64) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	g, ok := m.gens[ns]
	if !ok {
		g = since
		m.gens[ns] = g
	}
	return g
}

// NextGen moves the rule's generation on, past now (ms): a freeze took
// the collections of the current one.
func (m *State) NextGen(ns string, now time.Time) {
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

// MergeBatch is how many staged documents make a background merge due
// while inserts still arrive: as many as a full bucket's events for each
// series the rule's last merge took (of one staging collection: not its
// windows, or a backfill of history would make the batches of the live
// inserts after it as large as maxStagedEvents, and a read that must
// merge first wait for all of them), at least two buckets' worth and
// minMergeBatch.
// What a merge costs on FerretDB is mostly per staged document (it
// decodes each one, about 50 µs, whatever it holds), so small inserts
// (one event a document) are merged as they come, a batch at a time,
// alongside the inserts, and a flush or a read that must merge first
// finds one batch left, not the whole window; at one event a document a
// batch fills about one bucket a key, and on FerretDB the next merge
// tops up the partial one (rewrite/stage's top-up), so each bucket is
// rewritten about once. Large inserts (many events a document) are left
// for maxStagedEvents or the window's end: merging them as they come by
// events cost the inserts more than it saved the flush (tsbench ingest,
// batch 100 with one client: 1.17x, then 0.87–0.99x).
// The caller holds mu.
func (m *State) MergeBatch(rule *rules.Rule) int64 {
	per := int64(max(rule.MaxEvents, 1))
	return max(int64(m.series[rule.Namespace])*per, 2*per, minMergeBatch)
}

// minMergeBatch is the smallest merge batch, in staged documents: a
// merge costs a dozen upstream commands besides its documents (listing,
// the freeze, the plan, the probe, the drop), paid once per batch.
const minMergeBatch = 1000

// DueNow says whether a's backlog makes a merge due. The caller holds mu.
// A counter or slots rule has no merge batch: each of its merges rewrites
// the whole bucket of every open window it reaches (one per series, a
// whole hour of slots in a 1-hour window), so merging 1,000 staged
// documents at a time rewrote those buckets again and again while the
// windows filled: tsbench layouts at batch 1 on the stock command, 1-hour
// slots, 0.80 with merges at the flush only, 0.70 with a merge batch. Its
// staging is merged at maxStagedEvents, when quiet, and before a read.
func (m *State) DueNow(rule *rules.Rule, a *stagedSince) bool {
	if a.events >= maxStagedEvents(rule) {
		return true
	}
	return !rule.SlotLayout() && a.docs >= m.MergeBatch(rule)
}

// maxStagedEvents is the backlog, in events, that makes a merge due:
// MaxStagedEvents, or half the rule's maxStaged when that is less, so the
// merge starts well before inserts must wait for it.
func maxStagedEvents(rule *rules.Rule) int64 {
	if rule.MaxStaged > 0 {
		return min(MaxStagedEvents, int64(rule.MaxStaged)/2)
	}
	return MaxStagedEvents
}

// ErrNoRoom answers a staged insert that waited for room in staging
// until its deadline.
type ErrNoRoom struct {
	rule   string
	staged int64
	limit  int
	waited time.Duration
}

func (e ErrNoRoom) Error() string {
	return fmt.Sprintf("tsproxy: staging of %s is full (%d events staged by this proxy, maxStaged %d) and its merge did not make room within %s; the merge is behind or failing (see the proxy's log and tsproxy_staging_lag_seconds)", e.rule, e.staged, e.limit, e.waited.Round(time.Millisecond))
}

// Admit is the staging tier's backpressure: it returns once this proxy
// holds fewer than the rule's maxStaged events staged and not frozen, or
// ErrNoRoom at deadline. While it waits the background merger is woken;
// a freeze of everything staged (frozeAll) makes room. waited says
// whether the insert had to wait.
func (m *State) Admit(rule *rules.Rule, deadline time.Time) (waited bool, err error) {
	began := time.Now()
	for {
		m.mu.Lock()
		a := m.stagedSince(rule)
		if rule.MaxStaged <= 0 || a.events < int64(rule.MaxStaged) {
			m.mu.Unlock()
			return waited, nil
		}
		if !waited {
			m.ruleStats(rule).Throttled++
		}
		staged := a.events
		room, ok := m.room[rule.Namespace]
		if !ok {
			room = make(chan struct{})
			m.room[rule.Namespace] = room
		}
		m.mu.Unlock()
		waited = true
		select {
		case m.Kick(rule.Namespace) <- struct{}{}:
		default:
		}
		wait := time.Until(deadline)
		if wait <= 0 {
			return waited, ErrNoRoom{rule: rule.Namespace, staged: staged, limit: rule.MaxStaged, waited: time.Since(began)}
		}
		t := time.NewTimer(wait)
		select {
		case <-room:
			t.Stop()
		case <-t.C:
		case <-m.closing:
			t.Stop()
			return waited, ErrShuttingDown
		}
	}
}

// ErrShuttingDown refuses a staged insert that waited for room while the
// proxy shuts down.
var ErrShuttingDown = &mongoerr.Error{Code: mongoerr.InterruptedAtShutdown, Msg: "tsproxy: the proxy is shutting down and merges no more; staging has no room"}

// Due is the background policy: a rule's staging collections are merged
// once it has staged nothing for the rule's mergeAfter, or once it holds
// maxStagedEvents or a merge batch of documents. Staging collections
// this proxy did not write (left by a restart, or written by another
// proxy) count as staged when first seen.
func (m *State) Due(rule *rules.Rule, now time.Time) func(c stage.Collection) bool {
	return func(stage.Collection) bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		a := m.stagedSince(rule)
		if a.last.IsZero() {
			a.last = now
		}
		return m.DueNow(rule, a) || now.Sub(a.last) >= rule.MergeAfter
	}
}

// Kick is the channel that wakes rule's background merger.
func (m *State) Kick(ns string) chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	k, ok := m.kicks[ns]
	if !ok {
		k = make(chan struct{}, 1)
		m.kicks[ns] = k
	}
	return k
}

func (m *State) stagedSince(rule *rules.Rule) *stagedSince {
	return entry(m.activity, rule.Namespace)
}

// FrozeAll forgets rule's staging activity: a freeze took everything
// staged (the caller holds the rule's inserts off).
func (m *State) FrozeAll(rule *rules.Rule) {
	m.mu.Lock()
	defer m.mu.Unlock()
	*m.stagedSince(rule) = stagedSince{}
	if room, ok := m.room[rule.Namespace]; ok {
		close(room)
		delete(m.room, rule.Namespace)
	}
}

// Record adds a merge's figures to the rule's and sets its backlog
// gauges (pending, lag) from it.
func (m *State) Record(rule *rules.Rule, st merge.Stats, background bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.countLocked(rule, st, false)
	m.gaugesLocked(rule, st, background)
}

// ForgetFigures drops the figures of a rule that left the rule set, so
// that its metrics' series go with it. Its locks stay: a merge of it may
// still be running.
func (m *State) ForgetFigures(ns string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.stats, ns)
	delete(m.activity, ns)
	delete(m.series, ns)
}

// RecordFailed adds the figures of a merge that failed (or of a pass of
// one) and leaves the backlog gauges as they were: a failed merge is no
// sign of a caught-up backlog (its Pending counted nothing, and the lag
// read 0 while every merge failed), and what it took from what the proxy
// kept (Kept) was merged by nobody (collections{from="read"}, which is
// Collections - Kept, went negative).
func (m *State) RecordFailed(rule *rules.Rule, st merge.Stats) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.countLocked(rule, st, true)
}

// RecordCounts adds the figures of a pass of a merge that goes on,
// without its gauges.
func (m *State) RecordCounts(rule *rules.Rule, st merge.Stats) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.countLocked(rule, st, false)
}

func (m *State) countLocked(rule *rules.Rule, st merge.Stats, failed bool) {
	r := m.ruleStats(rule)
	if st.Series > 0 {
		m.series[rule.Namespace] = st.Series
	}
	r.Merged += int64(st.Events)
	r.Buckets += int64(st.Buckets)
	r.Retries += int64(st.Retries)
	r.Collections += int64(st.Collections)
	if !failed {
		r.Kept += int64(st.Kept)
	}
}

func (m *State) gaugesLocked(rule *rules.Rule, st merge.Stats, background bool) {
	r := m.ruleStats(rule)
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

func (m *State) ruleStats(rule *rules.Rule) *ruleStageStats {
	return entry(m.stats, rule.Namespace)
}

// Failed counts a merge of rule that failed.
func (m *State) Failed(rule *rules.Rule) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ruleStats(rule).Failures++
}

// Staged records events acknowledged into a rule's staging tier, and
// wakes the rule's background merger when that makes a merge due.
func (m *State) Staged(rule *rules.Rule, n int64) {
	m.mu.Lock()
	m.ruleStats(rule).Staged += n
	a := m.stagedSince(rule)
	a.last, a.events, a.docs = time.Now(), a.events+n, a.docs+1
	full := m.DueNow(rule, a)
	m.mu.Unlock()
	if full {
		select {
		case m.Kick(rule.Namespace) <- struct{}{}:
		default: // a wake-up is pending already
		}
	}
}

// Snapshot copies every rule's figures.
func (m *State) Snapshot() map[string]ruleStageStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]ruleStageStats, len(m.stats))
	for ns, r := range m.stats {
		out[ns] = *r
	}
	return out
}
