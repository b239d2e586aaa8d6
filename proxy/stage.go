package proxy

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/proxy/lease"
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/insert"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/source"
	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rules"
)

// The staging tier (rewrite/stage): inserts of a staged rule go to its
// staging collections with no lock and no update (under the rule's writer
// lease where the upstream needs one, see stagedInsert); merges write its
// buckets. One merge of a rule runs at a time in this proxy (mergeState's
// lock) and in the fleet (the rule's writer lease). A merge runs before
// every command on the rule's namespace but inserts, getMore and
// killCursors (so reads, counts, deletes and drops see complete buckets
// only), on tsproxyFlush, and in the background once a staging
// collection has taken nothing new for the rule's mergeAfter.

// stagedRule says whether rule stages its events on this upstream.
func (c *conn) stagedRule(rule *rules.Rule) (bool, caps.Upstream, error) {
	caps, err := c.upstreamCaps()
	if err != nil {
		return false, caps, err
	}
	return rule.Staged(caps.CostlyUpdates), caps, nil
}

// stagedInsert stores an insert's events in the rule's staging tier: no
// key lock, no fills, no update. On an upstream whose writes are not
// isolated (FerretDB) it still needs the rule's writer lease: FerretDB's
// rename changes only its catalog, so another proxy's insert that looked
// a staging collection up before a merge renamed it can commit into the
// renamed collection after the merge dropped it, and be lost
// (TestStageThreeProxies found 51 of 22,926 events so on the stock
// ferretdb command). One proxy per rule holds its own inserts off during
// a freeze, which closes that race.
func (c *conn) stagedInsert(req *request, rule *rules.Rule) error {
	caps, err := c.startWrite(rule)
	if err != nil {
		return err
	}
	cmd := commandOf(req)
	identity, err := c.identity()
	if err != nil {
		return err
	}
	prepared, err := insert.Prepare(cmd, rule, bson.NewObjectID)
	var p rewrite.Plan
	if err != nil {
		p = rewrite.Fail(mongoerr.Errorf(mongoerr.FailedToParse, "%s", err.Error()))
	} else {
		// An upstream that keeps no session state (no stmtIds: FerretDB)
		// takes concurrent clients' staged inserts as one (combine.go).
		p = stage.Insert(cmd, prepared, stage.InsertEnv{Identity: identity, NewObjectID: bson.NewObjectID, Combinable: !caps.StmtIDs})
	}
	c.ensureLifecycle(rule)
	inflight := c.s.merges.inserts(rule.Namespace)
	inflight.RLock()
	res, err := c.runPlan(req, rule, routeRewrite, p)
	inflight.RUnlock()
	if err == nil && mongoerr.IsOK(res.Reply) {
		n, _ := bson.Raw(res.Reply).Lookup("n").AsInt64OK()
		c.s.merges.staged(rule, n)
		err = c.maintainRollups(rule, cmd, res.Reply)
	}
	if err == nil {
		err = c.answer(req, rule, res)
	}
	return err
}

// settleStaged merges everything staged of rule before a command that
// reads or changes its stored events, so that the command sees every
// acknowledged event exactly once, in complete buckets. An error is the
// client's answer (the command does not run).
func (c *conn) settleStaged(req *request, rule *rules.Rule) (done bool, err error) {
	staged, caps, err := c.stagedRule(rule)
	if err != nil || !staged {
		return false, nil // no caps: the command itself meets the upstream's error
	}
	_, err = c.mergeStaged(rule, caps, stage.MergeOptions{All: true})
	var held *lease.HeldError
	if errors.As(err, &held) {
		err = c.requestFlush(rule, caps)
	}
	if err != nil {
		var up upstreamFailure
		if errors.As(err, &up) {
			return true, up.err
		}
		return true, c.replyError(req, mongoerr.CodeOf(err), err.Error())
	}
	return false, nil
}

// flushWaitLeases bounds how long a proxy waits for the holder of a
// rule's writer lease to answer its flush request, in lease lifetimes: a
// holder that died is replaced (by this proxy) once its lease lapses.
const flushWaitLeases = 3

// requestFlush asks the proxy that holds rule's writer lease to merge
// everything staged, and waits until it did: it creates a flush request
// collection of its own, which the holder's background merger (one round
// a second at most) drops after a merge of everything that began once it
// saw the request.
func (c *conn) requestFlush(rule *rules.Rule, caps caps.Upstream) error {
	marker := stage.FlushMarker(rule, bson.NewObjectID().Hex())
	res, err := drive(c, rewrite.Passthrough(stage.FlushRequestCommand(rule, marker), nil))
	if err != nil {
		return upstreamFailure{err: err}
	}
	if err := mongoerr.ReplyError(res.Reply); err != nil {
		return fmt.Errorf("tsproxy rule %s: request a merge from the proxy holding the writer lease: %w", rule.Namespace, err)
	}
	list := stage.FlushPendingCommand(rule, marker)
	wait := flushWaitLeases * c.s.leases.TTL()
	deadline := time.Now().Add(wait)
	tries := 0
	for {
		res, err := drive(c, rewrite.Passthrough(list, nil))
		if err != nil {
			return upstreamFailure{err: err}
		}
		pending, err := stage.FlushPending(res.Reply)
		if err != nil {
			return fmt.Errorf("tsproxy rule %s: wait for the merge: %w", rule.Namespace, err)
		}
		if !pending {
			return nil
		}
		// A request for a namespace dropped meanwhile (its collections
		// and pending requests dropped already, or about to be) is
		// answered by nobody: withdrawn.
		if !c.s.routesRule(rule) {
			_, err := drive(c, rewrite.Passthrough(source.DropCommand(rule.DB, marker), nil))
			return err
		}
		// The holder may be gone: once its lease lapsed, merge here.
		if tries++; tries%20 == 0 {
			if _, err := c.mergeStaged(rule, caps, stage.MergeOptions{All: true}); err == nil {
				_, err := drive(c, rewrite.Passthrough(source.DropCommand(rule.DB, marker), nil))
				return err
			} else if held := (*lease.HeldError)(nil); !errors.As(err, &held) {
				return err
			}
		}
		if time.Now().After(deadline) {
			// Withdrawn, so that a holder that comes back later does not
			// merge for a client that gave up (a failed drop is logged: the
			// holder answers it on its next round all the same).
			if _, err := drive(c, rewrite.Passthrough(source.DropCommand(rule.DB, marker), nil)); err != nil {
				c.log.Warn("staging: a flush request was left", "rule", rule.Namespace, "request", marker, "err", err.Error())
			}
			return mongoerr.Errorf(mongoerr.ConflictingOperationInProgress, "tsproxy rule %s: the proxy holding the rule's writer lease did not merge its staged events within %s (request %s left for it)", rule.Namespace, wait, marker)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// upstreamFailure is a merge that lost its upstream connection.
type upstreamFailure struct{ err error }

func (u upstreamFailure) Error() string { return u.err.Error() }

// mergeStaged runs one merge of rule on the client's connection, holding
// the rule's writer lease and this proxy's merge lock.
func (c *conn) mergeStaged(rule *rules.Rule, caps caps.Upstream, opts stage.MergeOptions) (stage.Stats, error) {
	if err := c.ensureWriter(rule, caps); err != nil {
		return stage.Stats{}, err
	}
	opts.CheckLate = c.s.lateDocsPossible(rule, caps)
	return c.s.runMerge(c, rule, opts, false)
}

// lateGuard is how long after the previous term of a rule's writer lease
// ran out a merge looks for late documents: an insert its holder began
// must have been stuck in the upstream that long to land after a freeze.
const lateGuard = time.Minute

// lateDocsPossible says whether a retired collection of rule may take
// documents after its freeze (stage.MergeOptions.CheckLate). Only where
// a rename changes nothing but the upstream's catalog (FerretDB, whose
// staged inserts need the writer lease): this proxy holds its own
// inserts off during a freeze, so only an insert begun under an earlier
// term (another proxy's, or this one's before a restart) can be late.
func (s *Server) lateDocsPossible(rule *rules.Rule, caps caps.Upstream) bool {
	if !caps.SingleWriter {
		return false
	}
	term, held := s.leases.Current(rule.DB, rule.Collection)
	return !held || time.Since(term.EarlierWritesBefore) < lateGuard
}

// runMerge runs a merge plan on r under the rule's merge lock.
func (s *Server) runMerge(r stepRunner, rule *rules.Rule, opts stage.MergeOptions, background bool) (stage.Stats, error) {
	l := s.merges.lock(rule.Namespace)
	l.Lock()
	defer l.Unlock()
	if opts.Now.IsZero() {
		opts.Now = time.Now()
	}
	opts.RetryHorizon = RetryHorizon
	// The freeze, with this proxy's inserts into the rule held off.
	freezeOpts := opts
	freezeOpts.FreezeOnly = true
	freeze := stage.NewMerge(rule, freezeOpts)
	inflight := s.merges.inserts(rule.Namespace)
	inflight.Lock()
	res, err := drive(r, freeze)
	if err == nil && mongoerr.IsOK(res.Reply) && freeze.Stats.Pending == 0 {
		s.merges.frozeAll(rule)
	}
	inflight.Unlock()
	if err != nil {
		return freeze.Stats, upstreamFailure{err: err}
	}
	if !mongoerr.IsOK(res.Reply) {
		return freeze.Stats, mongoerr.FromReply(res.Reply, "merge failed")
	}
	if freeze.Stats.Frozen == 0 {
		s.merges.record(rule, freeze.Stats, background)
		return freeze.Stats, nil
	}
	// The merge of what is retired now, into a bucket collection with
	// its index (created only now: a create or drop of the namespace
	// settles first, and must not find the collection made by that).
	_ = s.ensureIndexOn(r, rule, rule.BucketCollection, bucketIndexFailure) // logged; the merge works without it
	mergeOpts := opts
	mergeOpts.All, mergeOpts.Due = false, nil
	m := stage.NewMerge(rule, mergeOpts)
	res, err = drive(r, m)
	m.Stats.Pending, m.Stats.Markers = freeze.Stats.Pending, freeze.Stats.Markers
	if err != nil {
		return m.Stats, upstreamFailure{err: err}
	}
	s.merges.record(rule, m.Stats, background)
	if !mongoerr.IsOK(res.Reply) {
		return m.Stats, mongoerr.FromReply(res.Reply, "merge failed")
	}
	if m.Stats.Collections > 0 {
		s.log.Debug("staging merged", "rule", rule.Namespace, "collections", m.Stats.Collections, "events", m.Stats.Events, "buckets", m.Stats.Buckets)
	}
	return m.Stats, nil
}

// handleFlush answers tsproxyFlush: {tsproxyFlush: 1} merges every staged
// rule, {tsproxyFlush: "db.coll"} one; the reply counts what was merged.
func (c *conn) handleFlush(req *request) error {
	if err := c.ensureUpstream(); err != nil {
		return c.replyUpstreamDown(req, err)
	}
	targets, err := c.flushTargets(req)
	if err != nil {
		return c.replyError(req, mongoerr.CodeOf(err), err.Error())
	}
	var total stage.Stats
	rulesMerged := 0
	for _, rule := range targets {
		staged, caps, err := c.stagedRule(rule)
		if err != nil {
			return c.replyError(req, mongoerr.HostUnreachable, fmt.Sprintf("tsproxyFlush: %v", err))
		}
		if !staged {
			continue
		}
		st, err := c.mergeStaged(rule, caps, stage.MergeOptions{All: true})
		if held := (*lease.HeldError)(nil); errors.As(err, &held) {
			err = c.requestFlush(rule, caps) // merged by the holder: no counts here
		}
		var up upstreamFailure
		if errors.As(err, &up) {
			return up.err
		}
		if err != nil {
			return c.replyError(req, mongoerr.CodeOf(err), fmt.Sprintf("tsproxyFlush %s: %v", rule.Namespace, err))
		}
		rulesMerged++
		total.Collections += st.Collections
		total.Events += st.Events
		total.Buckets += st.Buckets
		total.Retries += st.Retries
		total.Late += st.Late
	}
	reply, err := bson.Marshal(bson.D{
		{Key: "rules", Value: rulesMerged},
		{Key: "collections", Value: total.Collections},
		{Key: "events", Value: total.Events},
		{Key: "buckets", Value: total.Buckets},
		{Key: "retries", Value: total.Retries},
		{Key: "late", Value: total.Late},
		{Key: "ok", Value: 1.0},
	})
	if err != nil {
		return err
	}
	return c.replyBody(req, reply)
}

// flushTargets are the rules a tsproxyFlush names.
func (c *conn) flushTargets(req *request) ([]*rules.Rule, error) {
	v := bson.Raw(req.msg.Body).Lookup("tsproxyFlush")
	if ns, ok := v.StringValueOK(); ok {
		db, coll, _ := strings.Cut(ns, ".")
		rule := c.rules.Lookup(db, coll)
		if rule == nil {
			return nil, mongoerr.Errorf(mongoerr.NamespaceNotFound, "tsproxyFlush: no rule for namespace %q", ns)
		}
		return []*rules.Rule{rule}, nil
	}
	if n, ok := v.AsInt64OK(); !ok || n != 1 {
		return nil, mongoerr.Errorf(mongoerr.BadValue, "tsproxyFlush takes 1 (every rule) or a namespace \"db.collection\", not %s", v)
	}
	var out []*rules.Rule
	for _, r := range c.rules.All() {
		out = append(out, &r)
	}
	return out, nil
}
