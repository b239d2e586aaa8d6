package tier

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/tsproxy/tsproxy/proxy/exec"
	"github.com/tsproxy/tsproxy/proxy/tier/lease"
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/source"
	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rewrite/stage/merge"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/upstream"
)

// MergeLoop merges rule's quiet staging collections until ctx ends.
func (t *Tier) MergeLoop(ctx context.Context, rule *rules.Rule) {
	interval := min(max(rule.MergeAfter/4, 50*time.Millisecond), time.Second)
	conn := exec.NewBackground(ctx, t.background)
	defer conn.Close()
	// Rules started together would otherwise tick together, and their
	// rounds take as many connections at once.
	select {
	case <-ctx.Done():
		return
	case <-time.After(rand.N(interval)):
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	var watched time.Time
	var backoff Backoff
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-t.state.Kick(rule.Namespace): // a merge batch is staged
		}
		if backoff.Waiting(time.Now()) {
			continue
		}
		if !t.host.ServedHere(rule) {
			if time.Since(watched) < untouchedMergeCheck {
				continue
			}
			watched = time.Now()
		}
		up, err := conn.Get()
		if err != nil {
			if ctx.Err() == nil {
				t.state.Failed(rule)
				// No upstream: redialled less and less often, and logged
				// at the 1st, 2nd, 4th, 8th... failure in a row.
				wait := backoff.Failed(time.Now(), interval)
				if f := backoff.Failures(); f&(f-1) == 0 {
					t.log.Warn("staging: background merge cannot reach the upstream; will retry", "rule", rule.Namespace, "failuresInARow", f, "retryIn", wait.String(), "err", err.Error())
				}
			}
			continue
		}
		_, err = t.mergeOnce(up, rule)
		conn.EndRound(err)
		var held *lease.HeldError
		switch {
		case err == nil || errors.As(err, &held): // another proxy merges this rule
			backoff.Succeeded()
		case ctx.Err() == nil:
			t.state.Failed(rule)
			wait := backoff.Failed(time.Now(), interval)
			t.log.Warn("staging: background merge failed; will retry", "rule", rule.Namespace, "failuresInARow", backoff.Failures(), "retryIn", wait.String(), "err", err.Error())
			if o, ok := stage.OrphanedIn(err.Error()); ok && o.Index {
				// No retry gets past it (the orphan mending mends tables only).
				t.log.Error("staging: the upstream cannot create a collection the merge writes: FerretDB (on PostgreSQL, killed while it created another collection) did not record that one's index, and gives its name to this one's; renaming the index in PostgreSQL (ALTER INDEX \"<database>\".\"<index>\" RENAME TO ...) frees the name, its collection keeping it",
					"rule", rule.Namespace, "index", o.Relation)
			}
		}
	}
}

// mergeOnce is one background round: merge the due staging collections.
func (t *Tier) mergeOnce(up *upstream.Conn, rule *rules.Rule) (merge.Stats, error) {
	upCaps, err := t.host.CapsOn(up)
	if err != nil {
		return merge.Stats{}, UpstreamFailure{Err: err}
	}
	if !rule.Staged(upCaps.StagesEvents()) {
		return merge.Stats{}, nil
	}
	list, work, err := t.listings.stagedWork(exec.OnConn{Up: up}, rule, time.Now())
	if err == nil && upCaps.SingleWriter {
		err = t.tidySpares(exec.OnConn{Up: up}, rule, list, time.Now())
	}
	if err != nil || !work {
		return merge.Stats{}, err
	}
	if !t.host.RoutesRule(rule) {
		// A created collection being dropped: merging now would write
		// buckets the drop has removed, or is about to (the read of the
		// catalog this needed also stops this loop).
		return merge.Stats{}, nil
	}
	now := time.Now()
	requests := stage.FlushRequests(rule, list)
	opts := merge.MergeOptions{Now: now, CheckLate: t.lateDocsPossible(rule, upCaps),
		AllMine: len(requests) > 0} // a flush asked for: this proxy's own staging, whatever is due
	due := t.state.Due(rule, now)
	t.hostOf(&opts, rule).due = due
	if upCaps.SingleWriter {
		err := t.leases.Ensure(up, rule.DB, rule.Collection, t.log)
		var held *lease.HeldError
		switch {
		case errors.As(err, &held):
			opts.Guest = true // freezes its own; the holder merges
		case err != nil:
			return merge.Stats{}, err
		}
	}
	runner := exec.OnConn{Up: up}
	var st merge.Stats
	if pending, idle := t.idleRound(rule, upCaps, list, due); idle {
		st.Pending = pending
		t.state.Record(rule, st, true)
	} else if st, err = t.RunMerge(runner, up, rule, upCaps, opts, true); err != nil {
		return st, err
	}
	if st.Pending > 0 && upCaps.SingleWriter {
		// Own staging collections not due yet: this proxy still runs, so
		// that the holder does not take them over while it is idle.
		if err := t.presence.Announce(up, rule.DB, rule.BucketCollection, t.StagerTag(), t.leases.Identity()); err != nil {
			return st, err
		}
	}
	if len(requests) > 0 {
		// A flush asked for leaves no staging collection of this proxy't.
		if err := t.dropSpare(runner, rule); err != nil {
			return st, err
		}
	}
	if opts.Guest || len(requests) == 0 {
		return st, nil
	}
	// Flush requests, as the holder: everything retired is merged (the
	// other proxies freeze their own on seeing the requests; a requester
	// drops its request when what it waits for is merged). Requests whose
	// requester went away are dropped here.
	if _, err := t.RunMerge(runner, up, rule, upCaps, merge.MergeOptions{All: true, CheckLate: t.lateDocsPossible(rule, upCaps)}, false); err != nil {
		return st, err
	}
	for _, name := range requests {
		if at, ok := stage.FlushRequestTime(rule, name); ok && now.Sub(at) > staleFlushRequest {
			res, err := exec.Drive(runner, rewrite.Passthrough(source.DropCommand(rule.DB, name), nil))
			if err != nil {
				return st, UpstreamFailure{Err: err}
			}
			if mongoerr.DroppedUnderQueryReply(res.Reply) {
				// Its table lost: it would be a
				// request forever, and the rule never idle.
				if _, err := exec.Drive(runner, rewrite.Passthrough(stage.SetAsideCommand(rule, name), nil)); err != nil {
					return st, UpstreamFailure{Err: err}
				}
				t.log.Warn("staging: a flush request had lost its table (FerretDB on PostgreSQL killed while dropping it) and was set aside", "rule", rule.Namespace, "collection", name)
			}
		}
	}
	return st, nil
}

// idleRound says whether rule's background round has nothing to merge,
// and how many staging collections wait: its listing (a hint, as in
// stagedWork) holds only this proxy's open staging collections of rule,
// and due takes none of them. Its merge would list the database again
// and run a freeze pass, which holds the rule's inserts off, to find the
// same. A counter or slots rule, merged only at the backlog bound, when
// quiet and before a read (State.dueNow), had such a round every
// second while it took inserts.
func (t *Tier) idleRound(rule *rules.Rule, caps caps.Upstream, list []byte, due func(stage.Collection) bool) (pending int, idle bool) {
	if !caps.SingleWriter { // staging names carry no owner tag
		return 0, false
	}
	own, ok, err := stage.OwnOpenOnly(rule, list, t.StagerTag(), t.since)
	if err != nil || !ok || len(own) == 0 {
		return 0, false
	}
	for _, c := range own {
		if due(c) {
			return 0, false
		}
	}
	return len(own), true
}

// staleFlushRequest is how old a flush request is when the holder drops
// it: a requester gives up before that (after flushWaitLeases lease
// lifetimes without progress, or this less that), and drops its own
// request (unless it died meanwhile).
const staleFlushRequest = 2 * time.Minute

// untouchedMergeCheck is how often a proxy looks for staged events of a
// created time-series collection it has served no command of (another
// proxy writes it): often enough to take over the merges of a proxy
// that died, rarely enough that many proxies and many collections do not
// add up to a stream of listings. Reads merge whatever is staged before
// they run, so this bounds only how long events may stay staged.
const untouchedMergeCheck = 30 * time.Second
