package handler

import (
	"errors"
	"time"

	"github.com/tsproxy/tsproxy/proxy/fills"
	"github.com/tsproxy/tsproxy/proxy/tier/lease"
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/deletes"
	"github.com/tsproxy/tsproxy/rewrite/fanout"
	"github.com/tsproxy/tsproxy/rules"
)

// This file serves delete on a bucketed namespace:
// per statement, the matching events are listed upstream, the buckets
// holding them are locked as the insert path locks them, read, and
// rewritten: replaced by the bucket of their remaining events, or removed
// when emptied and last of their (series, window), so the seq family of a
// key stays gapless. Fills of touched keys are forgotten afterwards.

// rewriteDelete serves delete (rewrite/deletes), on every partition of a
// partitioned rule (rewrite/fanout): the plan locks the buckets it
// rewrites as inserts lock them, through fills.Held, which releases
// whatever the plan still holds when it ends, however it ends, and forgets
// their fills (their buckets changed, or may have). An unacknowledged
// delete (moreToCome) runs acknowledged upstream all the same, without
// answering the client.
func (c *Conn) rewriteDelete(req *request, rule *rules.Rule) error {
	caps, err := c.startDelete(req, rule)
	if err != nil {
		return err
	}
	held := c.heldLocks()
	defer held.ReleaseAll()
	cmd := commandOf(req)
	part := func(r *rules.Rule) rewrite.Plan {
		return deletes.Plan(cmd, r, deletes.Env{Caps: caps, Lock: held.Locker(r.BucketNamespace()), IDIndex: c.s.IdIndexes})
	}
	return c.servePlan(req, rule, routeRewrite, fanout.Delete(cmd, rule, part))
}

// heldLocks are the bucket keys a running command locked, released
// when it ends (fills.Held), its locks marking their namespace written
// in the staging tier's directories.
func (c *Conn) heldLocks() *fills.Held {
	return fills.NewHeld(c.s.Fills, c.s.Tier().Directories().Wrote)
}

// startDelete is startWrite for a delete, which waits for a writer lease
// another proxy holds rather than being refused at once: on FerretDB
// every proxy takes a staged rule's inserts, so a delete may reach any of
// them, and the holder is often one that merged once (a flush, a read)
// and lets the lease lapse. It waits up to the command's maxTimeMS, or
// two lease lifetimes; then the refusal names the holder.
func (c *Conn) startDelete(req *request, rule *rules.Rule) (caps.Upstream, error) {
	deadline := waitDeadline(req, 2*c.s.Leases.TTL())
	for {
		caps, err := c.startWrite(rule)
		var held *lease.HeldError
		if !errors.As(err, &held) || !time.Now().Before(deadline) {
			return caps, err
		}
		time.Sleep(min(time.Until(deadline), leaseWaitStep))
	}
}

// leaseWaitStep is how often a delete waiting for a writer lease asks
// again (the lease package answers from what it found for a second).
const leaseWaitStep = 250 * time.Millisecond
