package engine

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tsproxy/tsproxy/proxy/exec"
	"github.com/tsproxy/tsproxy/proxy/replycache"
	"github.com/tsproxy/tsproxy/proxy/tier/lease"
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/layout"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/upstream"
)

// indexRetry is how long after a failed step the proxy tries again.
const indexRetry = time.Minute

// onceSteps remembers, per step and namespace, that a step was done, or
// when it last failed.
type onceSteps struct {
	mu   sync.Mutex
	last map[string]time.Time // key: kind NUL namespace; zero time: done
}

func newOnceSteps() *onceSteps { return &onceSteps{last: map[string]time.Time{}} }

// Begin says whether the step should run now (and marks it attempted).
func (o *onceSteps) Begin(kind, ns string) bool {
	key := kind + "\x00" + ns
	o.mu.Lock()
	defer o.mu.Unlock()
	last, seen := o.last[key]
	if seen && (last.IsZero() || time.Since(last) < indexRetry) {
		return false
	}
	o.last[key] = time.Now()
	return true
}

// Abort forgets an attempt, so the step runs again at the next Begin.
func (o *onceSteps) Abort(kind, ns string) {
	o.mu.Lock()
	delete(o.last, kind+"\x00"+ns)
	o.mu.Unlock()
}

func (o *onceSteps) Done(kind, ns string) {
	o.mu.Lock()
	o.last[kind+"\x00"+ns] = time.Time{}
	o.mu.Unlock()
}

// forget makes every step of ns run again (its collection was dropped).
func (o *onceSteps) forget(ns string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for key := range o.last {
		if strings.HasSuffix(key, "\x00"+ns) {
			delete(o.last, key)
		}
	}
}

// ForgetNamespace forgets everything the proxy keeps of a namespace that
// was dropped or emptied: its one-time steps, its open-bucket fills and
// the shells it preallocated.
func (s *Engine) ForgetNamespace(ns string) {
	s.Once.forget(ns)
	s.Fills.Forget(ns)
	s.tier.Directories().Wrote(ns)
	s.Shells.forget(ns)
	s.IdIndexOff.Delete(ns)
}

// EnsureIndexOn is ensureIndex on any step runner (a background merge's
// connection); the error is logged, and returned for a caller that needs
// the index. On an upstream that reads by no such index
// (caps.UnusedIndexes) the step only creates the collection, which the
// index's create would have, and its later steps (IndexIDs) need.
func (s *Engine) EnsureIndexOn(r exec.Runner, rule *rules.Rule, coll, failure string, caps caps.Upstream) error {
	ns := rule.DB + "." + coll
	if !s.Once.Begin("index", ns) {
		return nil
	}
	cmd := bucket.IndexCommand(rule.DB, coll)
	if caps.UnusedIndexes {
		cmd = bucket.CreateCommand(rule.DB, coll)
	}
	res, err := exec.Drive(r, rewrite.Passthrough(cmd, nil))
	if err == nil {
		err = mongoerr.ReplyError(res.Reply)
		if caps.UnusedIndexes && mongoerr.CodeOf(err) == mongoerr.NamespaceExists {
			err = nil
		}
	}
	if err == nil && s.Opts.IndexIDs != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err = s.Opts.IndexIDs(ctx, rule.DB, coll)
		cancel()
	}
	if err != nil {
		s.log.Error(failure, "rule", rule.Namespace, "collection", ns, "err", err.Error())
		return err
	}
	s.Once.Done("index", ns)
	s.log.Info("index ensured", "rule", rule.Namespace, "collection", ns, "proxy index", !caps.UnusedIndexes)
	return nil
}

// indexIDIndexLookups makes lookups by _id of rule's event-id index an
// index lookup on the embedded upstream (Options.IndexIDs), once the
// index exists: the reads of one series look up its series entry and
// the marker there, which would otherwise scan an entry a bucket. Keyed
// by the bucket namespace, so a drop of the rule forgets it.
func (s *Engine) indexIDIndexLookups(rule *rules.Rule) {
	if s.Opts.IndexIDs == nil || rule.Layout != rules.LayoutEvents || !s.Once.Begin("id-index lookups", rule.BucketNamespace()) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.Opts.IndexIDs(ctx, rule.DB, rule.IDIndexCollection()); err != nil {
		if errors.Is(err, upstream.ErrNoSuchCollection) {
			// No merge wrote the index yet: the next merge tries again.
			s.Once.Abort("id-index lookups", rule.BucketNamespace())
			return
		}
		s.log.Error("event-id index lookups not indexed", "rule", rule.Namespace, "err", err.Error())
		return // tried again after indexRetry
	}
	s.Once.Done("id-index lookups", rule.BucketNamespace())
}

// BucketIndexFailure is what a missing bucket index is logged as.
const BucketIndexFailure = "could not create the bucket index {meta: 1, start: 1}; writes are stored, reads will be slow. Grant createIndex on the bucket collection, or create the index yourself"

// sweepIDIndex deletes the event-id index entries of the buckets the
// sweeper deleted (those whose window starts before cutoff). A failure
// only leaves stale entries, which cost a lookup and never an answer.
func (s *Engine) sweepIDIndex(up *upstream.Conn, rule *rules.Rule, cutoff time.Time) {
	reply, err := exec.RunDoc(up, bucket.IDIndexSweepCommand(rule, cutoff))
	if err == nil {
		err = upstream.CommandError(reply)
	}
	if err != nil {
		s.log.Warn("retention: stale event-id index entries left", "rule", rule.Namespace, "err", err.Error())
	}
}

// idIndexCache keeps the event-id indexes reads by event _id read
// (bucket.IDIndexCache), within maxIDIndexCacheBytes: a read whose
// index's marker still shows the version kept reads the marker alone.
type idIndexCache struct {
	mu    sync.Mutex
	snaps map[string]*bucket.IDIndexSnapshot
	order []string // insertion order, oldest first, for eviction
	Bytes int
}

// MaxIDIndexCacheBytes bounds the indexes kept: about 2 KB per 1,000
// events, so 64 MB covers 30M events' worth of buckets.
const MaxIDIndexCacheBytes = 64 << 20

func NewIDIndexCache() *idIndexCache {
	return &idIndexCache{snaps: map[string]*bucket.IDIndexSnapshot{}}
}

func (c *idIndexCache) Get(ns string) *bucket.IDIndexSnapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.snaps[ns]
}

// Put keeps s as ns's index (nil forgets it), evicting the oldest kept
// indexes past the bound.
func (c *idIndexCache) Put(ns string, s *bucket.IDIndexSnapshot) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.snaps[ns]; old != nil {
		c.Bytes -= old.Bytes
		delete(c.snaps, ns)
		c.order = slices.DeleteFunc(c.order, func(n string) bool { return n == ns })
	}
	if s == nil || s.Bytes > MaxIDIndexCacheBytes {
		return
	}
	for c.Bytes+s.Bytes > MaxIDIndexCacheBytes && len(c.order) > 0 {
		oldest := c.order[0]
		c.order = c.order[1:]
		c.Bytes -= c.snaps[oldest].Bytes
		delete(c.snaps, oldest)
	}
	c.snaps[ns] = s
	c.order = append(c.order, ns)
	c.Bytes += s.Bytes
}

// shellMemory remembers the (bucket namespace, series, window) shells a
// proxy inserted, so that each is tried once. It is bounded: past
// maxPreallocated it starts over (a shell tried again only meets a
// duplicate key).
type shellMemory struct {
	mu   sync.Mutex
	seen map[string]bool
}

const maxPreallocated = 100_000

func newShellMemory() *shellMemory { return &shellMemory{seen: map[string]bool{}} }

// Claim returns the keys of keys not tried yet, and marks them tried.
func (m *shellMemory) Claim(ns string, keys []bucket.Key) []bucket.Key {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.seen) > maxPreallocated {
		m.seen = map[string]bool{}
	}
	var out []bucket.Key
	for _, k := range keys {
		name := ns + "\x00" + k.String()
		if !m.seen[name] {
			m.seen[name] = true
			out = append(out, k)
		}
	}
	return out
}

// forget forgets the shells of a dropped bucket collection, so the windows
// written after the drop get theirs again.
func (m *shellMemory) forget(ns string) {
	prefix := ns + "\x00"
	m.mu.Lock()
	defer m.mu.Unlock()
	for k := range m.seen {
		if strings.HasPrefix(k, prefix) {
			delete(m.seen, k)
		}
	}
}

// writeIDs remembers the write ids of the retryable counter inserts this
// proxy saw, to recognise a
// driver's retry: a write id seen before is checked against its buckets'
// marks. Until checkAllUntil (the proxy's start, or forgetting ids under
// load) an unseen id may be a retry of a write sent to a proxy that is
// gone, so every write is checked.
type writeIDs struct {
	mu            sync.Mutex
	seen          map[string]time.Time
	checkAllUntil time.Time
}

func NewWriteIDs(start time.Time) *writeIDs {
	return &writeIDs{seen: map[string]time.Time{}, checkAllUntil: start.Add(layout.MarkerLife)}
}

// maxCounterWrites bounds that memory; past it, ids older than
// layout.MarkerLife are forgotten, then all if need be.
const maxCounterWrites = 200_000

// Attempt says whether a write id must be checked for an earlier attempt,
// or is a retry too late to be checked (its marks may be gone).
func (w *writeIDs) Attempt(id string, now time.Time) (check bool, late time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if first, ok := w.seen[id]; ok {
		// Some margin: the mark's period was picked when the first
		// attempt was planned, and it reached the upstream later.
		if age := now.Sub(first); age > layout.MarkerLife-time.Second {
			return false, age
		}
		return true, 0
	}
	if len(w.seen) >= maxCounterWrites {
		for k, t := range w.seen {
			if now.Sub(t) > layout.MarkerLife {
				delete(w.seen, k)
			}
		}
		if len(w.seen) >= maxCounterWrites {
			w.seen = map[string]time.Time{}
			w.checkAllUntil = now.Add(layout.MarkerLife)
		}
	}
	w.seen[id] = now
	return now.Before(w.checkAllUntil), 0
}

// lifecycleState remembers which rules' one-time lifecycle steps ran.
type lifecycleState struct {
	mu      sync.Mutex
	writers map[string]*sync.Mutex // rule namespace -> serializes its rollup writes
}

// RollupWriter is the mutex that serializes a rule's rollup writes.
func (l *lifecycleState) RollupWriter(ns string) *sync.Mutex {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := l.writers[ns]
	if m == nil {
		m = &sync.Mutex{}
		l.writers[ns] = m
	}
	return m
}

func newLifecycleState() *lifecycleState {
	return &lifecycleState{writers: make(map[string]*sync.Mutex)}
}

// Rules is the latest rule set (maybe stale: for background work, which
// re-reads it every round).
func (s *Engine) Rules() *rules.Set { return s.Cat.Load().Rules }

// routesRule reports whether the proxy still routes rule's namespace by a
// rule (true when the catalog cannot be read: nothing says otherwise).
func (s *Engine) routesRule(rule *rules.Rule) bool {
	if rule.Declared == nil {
		return true // config rules change with the config file only
	}
	snap, err := s.Cat.Fresh()
	if err != nil {
		return true
	}
	return snap.Rules.Lookup(rule.DB, rule.Collection) != nil
}

// EarlierTermRetryPossible says whether a retryable write of a session
// whose last write this proxy recorded at previous (zero: none) may be a
// retry of one that went through an earlier term of rule's writer lease.
// Only where writes need the lease (elsewhere the upstream recognises
// retries itself); without a lease held, it cannot be ruled out.
func (s *Engine) EarlierTermRetryPossible(rule *rules.Rule, caps caps.Upstream, previous time.Time) bool {
	if !caps.SingleWriter {
		return false
	}
	term, held := s.Leases.Current(rule.DB, rule.Collection)
	return RetryOfEarlierTerm(term, held, previous, time.Now())
}

func RetryOfEarlierTerm(term lease.Term, held bool, previous, now time.Time) bool {
	switch {
	case !held:
		return true
	case term.EarlierWritesBefore.IsZero() || now.Sub(term.EarlierWritesBefore) >= replycache.RetryWindow:
		return false
	}
	return previous.IsZero() || previous.Before(term.Since)
}
