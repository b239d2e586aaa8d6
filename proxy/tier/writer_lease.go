package tier

import (
	"context"
	"time"

	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/upstream"
)

// EnsureWriter returns nil when this proxy may write rule's buckets now:
// always on upstreams with isolated updates, and otherwise while it holds
// the rule's writer lease (package lease), taken or renewed on c's
// upstream connection, with the client's privileges.
func (t *Tier) EnsureWriter(cl Client, rule *rules.Rule, caps caps.Upstream) error {
	if !caps.SingleWriter {
		return nil
	}
	if rule.Staged(caps.StagesEvents()) {
		// A staged rule's first lease holder makes its format record
		// before its lease shows that a proxy worked on the rule.
		t.StagingFormat(cl.Upstream(), rule)
	}
	return t.leases.Ensure(cl.Upstream(), rule.DB, rule.Collection, t.log)
}

// ReleaseLeases gives up every lease this proxy holds, on a connection of
// its own (at shutdown, after the clients are gone). An upstream that
// needs credentials the proxy lacks refuses: the leases then lapse by
// themselves.
func (t *Tier) ReleaseLeases(ctx context.Context, dial func(context.Context) (*upstream.Conn, error)) {
	hs := t.leases.TakeHeld()
	if len(hs) == 0 {
		return
	}
	up, err := dial(ctx)
	if err != nil {
		t.log.Warn("writer leases not released; they lapse by themselves", "err", err.Error())
		return
	}
	defer up.Close()
	for _, h := range hs {
		if err := t.leases.Client(up, h.DB, h.Coll).Release(h.Term, time.Now()); err != nil {
			t.log.Warn("writer lease not released; it lapses by itself", "rule", h.DB+"."+h.Coll, "err", err.Error())
		}
	}
}
