package handler

import (
	"context"
	"sync"
	"time"

	"github.com/tsproxy/tsproxy/proxy/exec"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/upstream"
)

// sweeper runs the background loops of every rule: retention
// where it has expireAfter, merges where it stages.
type sweeper struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	running map[string]ruleLoop // by loop kind and namespace
	stopped bool
}

// startSweeper starts the background loops once; Shutdown stops them.
func (s *Engine) startSweeper() {
	s.mu.Lock()
	if s.sweep != nil || s.closing.Load() {
		s.mu.Unlock()
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.sweep = &sweeper{ctx: ctx, cancel: cancel, running: map[string]ruleLoop{}}
	s.mu.Unlock()
	s.syncLoops(s.rules())
}

// stopSweeper stops the background loops and waits for them (a sweep in
// progress ends with its connection).
func (s *Engine) stopSweeper() {
	s.mu.Lock()
	sw := s.sweep
	if sw == nil {
		s.sweep = &sweeper{stopped: true, cancel: func() {}} // a later startSweeper does nothing
	}
	s.mu.Unlock()
	if sw != nil {
		sw.mu.Lock()
		sw.stopped = true
		sw.mu.Unlock()
		sw.cancel()
		sw.wg.Wait()
	}
}

// retentionHost is the Server as package retention sees it.
type retentionHost struct{ s *Engine }

func (h retentionHost) Background(ctx context.Context) *exec.Background {
	return exec.NewBackground(ctx, h.s.background)
}

func (h retentionHost) TakeLease(up *upstream.Conn, db, name string) error {
	return h.s.leases.Ensure(up, db, name, h.s.log)
}

func (h retentionHost) Routes(rule *rules.Rule) bool { return h.s.routesRule(rule) }

func (h retentionHost) BucketsDeleted(up *upstream.Conn, rule *rules.Rule, cutoff time.Time) {
	// The fills of the swept (series, window) keys are stale; the next
	// insert of any key loads its fill again.
	h.s.state.forgetBuckets(rule.BucketNamespace())
	h.s.tier.Directories().Wrote(rule.BucketNamespace())
	h.s.sweepIDIndex(up, rule, cutoff)
}

func (h retentionHost) NamespaceDropped(ns string) { h.s.forgetNamespace(ns) }

func (h retentionHost) LogDue(key string, every time.Duration) bool {
	return h.s.tier.OrphanLogDue(key, every)
}
