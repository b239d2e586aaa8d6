package proxy

import (
	"context"
	"time"

	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rules"
)

// ensureWriter returns nil when this proxy may write rule's buckets now:
// always on upstreams with isolated updates, and otherwise while it holds
// the rule's writer lease (package lease), taken or renewed on c's
// upstream connection, with the client's privileges.
func (c *conn) ensureWriter(rule *rules.Rule, caps caps.Upstream) error {
	if !caps.SingleWriter {
		return nil
	}
	if rule.Staged(caps.CostlyUpdates) {
		// A staged rule's first lease holder makes its format record
		// before its lease shows that a proxy worked on the rule.
		c.s.stagingFormat(c.up, rule)
	}
	return c.s.leases.Ensure(c.up, rule.DB, rule.Collection, c.log)
}

// releaseLeases gives up every lease this proxy holds, on a connection of
// its own (at shutdown, after the clients are gone). An upstream that
// needs credentials the proxy lacks refuses: the leases then lapse by
// themselves.
func (s *Server) releaseLeases(ctx context.Context) {
	hs := s.leases.TakeHeld()
	if len(hs) == 0 {
		return
	}
	up, err := s.opts.Dialer.Dial(ctx)
	if err != nil {
		s.log.Warn("writer leases not released; they lapse by themselves", "err", err.Error())
		return
	}
	defer up.Close()
	for _, h := range hs {
		if err := s.leases.Client(up, h.DB, h.Coll).Release(h.Term, time.Now()); err != nil {
			s.log.Warn("writer lease not released; it lapses by itself", "rule", h.DB+"."+h.Coll, "err", err.Error())
		}
	}
}
