package proxy

import (
	"github.com/tsproxy/tsproxy/rewrite/deletes"

	"github.com/tsproxy/tsproxy/rewrite/bucket"

	"github.com/tsproxy/tsproxy/rules"
)

// This file serves delete on a bucketed namespace (see rewrite/delete.go):
// per statement, the matching events are listed upstream, the buckets
// holding them are locked as the insert path locks them, read, and
// rewritten: replaced by the bucket of their remaining events, or removed
// when emptied and last of their (series, window), so the seq family of a
// key stays gapless. Fills of touched keys are forgotten afterwards.

// rewriteDelete serves delete (rewrite/deletes): the plan locks the
// buckets it rewrites as inserts lock them, through heldLocks, which
// releases whatever the plan still holds when it ends, however it ends.
// An unacknowledged delete (moreToCome) runs acknowledged upstream all the
// same, without answering the client.
func (c *conn) rewriteDelete(req *request, rule *rules.Rule) error {
	caps, err := c.startWrite(rule)
	if err != nil {
		return err
	}
	held := &heldLocks{c: c, ns: rule.BucketNamespace()}
	defer held.releaseAll()
	return c.servePlan(req, rule, routeRewrite, deletes.Plan(commandOf(req), rule, deletes.Env{Caps: caps, Lock: held.lock}))
}

// heldLocks are the bucket keys a running plan locked.
type heldLocks struct {
	c    *conn
	ns   string
	held []*lockedKeys
}

// lock takes the locks of keys; the release it returns also forgets their
// fills, as their buckets changed (or may have).
func (h *heldLocks) lock(keys []bucket.Key) func() {
	l := h.c.s.state.bucketCache().lock(h.ns, keys)
	h.held = append(h.held, l)
	return func() { h.release(l) }
}

func (h *heldLocks) release(l *lockedKeys) {
	for i, x := range h.held {
		if x == l {
			h.held = append(h.held[:i], h.held[i+1:]...)
			l.forgetAll()
			l.unlock()
			return
		}
	}
}

func (h *heldLocks) releaseAll() {
	for len(h.held) > 0 {
		h.release(h.held[0])
	}
}
