package engine

import (
	"context"
	"time"

	"github.com/tsproxy/tsproxy/proxy/exec"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/upstream"
)

// retentionHost is the Server as package retention sees it.
type retentionHost struct{ s *Engine }

func (h retentionHost) Background(ctx context.Context) *exec.Background {
	return exec.NewBackground(ctx, h.s.background)
}

func (h retentionHost) TakeLease(up *upstream.Conn, db, name string) error {
	return h.s.Leases.Ensure(up, db, name, h.s.log)
}

func (h retentionHost) Routes(rule *rules.Rule) bool { return h.s.routesRule(rule) }

func (h retentionHost) BucketsDeleted(up *upstream.Conn, rule *rules.Rule, cutoff time.Time) {
	// The fills of the swept (series, window) keys are stale; the next
	// insert of any key loads its fill again.
	h.s.Fills.Forget(rule.BucketNamespace())
	h.s.tier.Directories().Wrote(rule.BucketNamespace())
	h.s.sweepIDIndex(up, rule, cutoff)
}

func (h retentionHost) NamespaceDropped(ns string) { h.s.ForgetNamespace(ns) }

func (h retentionHost) LogDue(key string, every time.Duration) bool {
	return h.s.tier.OrphanLogDue(key, every)
}
