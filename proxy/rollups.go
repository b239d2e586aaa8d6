package proxy

import (
	"fmt"
	"sync"

	"github.com/tsproxy/tsproxy/rewrite/rollup"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rules"
)

// Rollups are maintained after the bucket writes of an insert were
// acknowledged by the upstream, on the client's connection, before the
// client gets its reply: only events the reply reports written are
// counted. A rollup write is never retried, so a rollup never counts an
// event twice; if it fails, or the proxy dies between the bucket write and
// the rollup write, those events are missing from the rollup (at most once)
// while the events themselves are stored. Such failures are logged with the
// rule and the number of events not counted, and do not fail the insert:
// reporting an error for stored events would make the client write them
// again.

// maintainRollups runs the rollup upserts of an insert whose client reply
// is reply. Errors are logged, never returned (see above).
func (c *conn) maintainRollups(rule *rules.Rule, cmd rewrite.Command, reply []byte) {
	if len(rule.Rollups) == 0 || c.up == nil {
		return
	}
	caps, err := c.upstreamCaps()
	if err != nil {
		c.log.Error("rollups not updated: upstream capabilities unknown", "rule", rule.Namespace, "err", err.Error())
		return
	}
	plan, err := rollup.Rollups(cmd, rule, reply, rollup.RollupOptions{MaxStatements: caps.MaxUpdateStatements, StmtIDs: caps.StmtIDs})
	if err != nil || plan == nil {
		if err != nil {
			c.log.Error("rollups not updated", "rule", rule.Namespace, "err", err.Error())
		}
		return
	}
	if caps.SingleWriter {
		// Inserts into different windows of one series hold different
		// series locks but $inc the same coarser rollup documents; on an
		// upstream whose updates are not isolated, one would be lost.
		mu := c.s.life.rollupWriter(rule.Namespace)
		mu.Lock()
		defer mu.Unlock()
	}
	for i, cmd := range plan.Commands {
		if err := c.runRollupCommand(cmd, caps.MaxUpdateStatements > 0); err != nil {
			c.log.Error("rollup write failed; the events are stored but these rollup documents lag (rebuild them from the buckets if needed)",
				"rule", rule.Namespace, "events", plan.Events, "command", i+1, "of", len(plan.Commands), "err", err.Error())
			if c.up == nil {
				return // the connection is gone; the other commands would fail too
			}
		}
	}
}

// runRollupCommand sends one rollup update and checks its reply. On a
// transport error the upstream connection is dropped, so the next request
// dials a fresh one instead of reading this command's late reply.
func (c *conn) runRollupCommand(cmd []byte, slotted bool) error {
	body, err := c.roundTripInSlot(c.commandFrame(cmd), slotted)
	if err != nil {
		c.up.Close()
		c.up = nil
		c.upRef.Store(nil)
		return fmt.Errorf("rollup update: %w", err)
	}
	return rollup.RollupReplyError(cmd, body)
}

// lifecycleState remembers which rules' one-time lifecycle steps ran.
type lifecycleState struct {
	mu      sync.Mutex
	writers map[string]*sync.Mutex // rule namespace -> serializes its rollup writes
}

// rollupWriter is the mutex that serializes a rule's rollup writes.
func (l *lifecycleState) rollupWriter(ns string) *sync.Mutex {
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
