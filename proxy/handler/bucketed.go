package handler

import (
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/proxy/exec"
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/fanout"
	"github.com/tsproxy/tsproxy/rewrite/insert"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/wire"
)

// handleBucketed serves a command on a bucketed namespace: rewritten, or
// refused with an error naming the rule. It never reaches the upstream
// collection of the app's namespace, which stays empty.
func (c *Conn) handleBucketed(req *request, rule *rules.Rule, r route) error {
	if err := c.ensureUpstream(); err != nil {
		return c.replyUpstreamDown(req, err)
	}
	c.s.NoteServed(rule)
	// The server authorizes the client before the proxy answers anything
	// of its own, and a cursor it holds is read only by the
	// users, and in the session, that opened it.
	if err := c.gate(req, rule); err != nil {
		return err
	}
	if err := c.checkCursorOwner(req, rule); err != nil {
		return err
	}
	if err := c.retriedReply(req, rule); err != nil {
		return err
	}
	defer c.endRetryable(req)
	switch req.name {
	case "insert", "getMore", "killCursors":
	default:
		if err := c.settleStaged(req, rule); err != nil {
			return err
		}
	}
	h := handlerFor(req.name, rule)
	if h == nil {
		msg := fmt.Sprintf("tsproxy rule %s: command %q is not supported on a bucketed namespace", rule.Namespace, req.name)
		if rule.Layout != rules.LayoutEvents {
			msg = fmt.Sprintf("tsproxy rule %s: command %q is not supported on a namespace with layout %s", rule.Namespace, req.name, rule.Layout)
		}
		return c.servePlan(req, rule, routeRewrite, rewrite.Fail(mongoerr.Errorf(mongoerr.NotImplemented, "%s", msg)))
	}
	if commands[req.name].unpartitioned && rule.Partitioned() {
		return c.servePlan(req, rule, routeRewrite, rewrite.Fail(fanout.PartitionCommandRefusal(rule, req.name)))
	}
	return h(c, req, rule)
}

// rewriteInsert stores the events of an insert as buckets (rewrite/insert),
// per partition for a partitioned rule (rewrite/fanout), then counts
// them into the rule's rollups. Each part prepares its events (validation,
// stored forms, grouping) before locking, so that inserts into the same
// series overlap that work with each other's upstream round trips, then
// runs under the locks of its (series, window) keys, which are held until
// the client has its reply: a reply that could not be delivered, or an
// outcome not known, makes the proxy forget those keys' fills.
//
// An unacknowledged insert (moreToCome) is run acknowledged upstream all
// the same, without answering the client: the proxy needs the replies to
// keep its fills exact and to retry duplicate keys.
func (c *Conn) rewriteInsert(req *request, rule *rules.Rule) error {
	if staged, _, err := c.stagedRule(rule); err != nil {
		return err
	} else if staged {
		return c.stagedInsert(req, rule)
	}
	caps, err := c.startWrite(rule)
	if err != nil {
		return err
	}
	if err := c.stopIDIndex(rule); err != nil {
		return c.refuseBeforeWrite(req, rule, err, c.replyRewriteError)
	}
	cmd := commandOf(req)
	held := c.heldLocks()
	defer held.ReleaseAll()
	part := func(r *rules.Rule, cmd rewrite.Command, indexes []int) rewrite.Plan {
		prepared, err := insert.Prepare(cmd, r, bson.NewObjectID)
		if err != nil {
			// As MongoDB answers a document it cannot take.
			return rewrite.Fail(mongoerr.Errorf(mongoerr.FailedToParse, "%s", err.Error()))
		}
		locked := held.Lock(r.BucketNamespace(), prepared.Keys())
		return insert.Plan(cmd, prepared, insert.Env{Caps: caps, NewObjectID: bson.NewObjectID, Fills: locked, Check: c.keysToCheck(req, rule, caps, locked), StmtIDs: indexes})
	}
	var p rewrite.Plan
	if rule.Partitioned() {
		parts, ordered := fanout.SplitInsert(cmd, rule, time.Now().UnixMilli())
		for _, pt := range parts {
			c.ensureBucketIndex(fanout.Rule(rule, pt.Collection))
		}
		p = fanout.Insert(parts, ordered, rule, part)
	} else {
		c.ensureBucketIndex(rule)
		p = part(rule, cmd, nil)
	}
	c.ensureLifecycle(rule)
	res, err := c.runPlan(req, rule, routeRewrite, p)
	if err == nil && mongoerr.IsOK(res.Reply) {
		err = c.maintainRollups(rule, cmd, res.Reply)
	}
	if err == nil {
		err = c.answer(req, rule, res)
	}
	if err != nil {
		held.ForgetAll()
	}
	return err
}

// roundTripBody sends a frame the proxy built and returns a copy of the
// reply's body (the frame's buffer is reused by the next read).
func (c *Conn) roundTripBody(frame []byte) ([]byte, error) {
	_, rf, err := exec.RoundTrip(c.up, frame)
	if err != nil {
		return nil, err
	}
	var m wire.Msg
	if err := m.Decode(rf); err != nil {
		return nil, fmt.Errorf("upstream reply: %w", err)
	}
	return append([]byte(nil), m.Body...), nil
}

// roundTripInSlot is roundTripBody holding one of the upstream's write
// slots while the command runs, when slotted: FerretDB hangs on about 100
// update statements at once, so bucket updates there are bounded
// (upstreamState.writeSlots).
func (c *Conn) roundTripInSlot(frame []byte, slotted bool) ([]byte, error) {
	if slotted {
		defer c.s.Abilities.Slot()()
	}
	return c.roundTripBody(frame)
}

// startWrite begins every rewritten write of rule: it learns what the
// upstream supports and, where its updates are not isolated, makes sure
// this proxy holds the rule's writer lease.
func (c *Conn) startWrite(rule *rules.Rule) (caps.Upstream, error) {
	caps, err := c.upstreamCaps()
	if err != nil {
		return caps, err
	}
	return caps, c.s.Tier().EnsureWriter(c, rule, caps)
}

// refuseBeforeWrite answers a write refused before anything was written, with
// answer's error reply; an unacknowledged write (moreToCome) gets no
// reply, so its refusal is logged instead.
func (c *Conn) refuseBeforeWrite(req *request, rule *rules.Rule, err error, answer func(*request, error) error) error {
	if req.msg.Flags&wire.MoreToCome != 0 {
		c.log.Warn("unacknowledged "+req.name+" rejected", "rule", rule.Namespace, "err", err.Error())
		return nil
	}
	return answer(req, err)
}

// commandOf is the request as rewrite takes it.
func commandOf(req *request) rewrite.Command {
	cmd := rewrite.Command{Body: req.msg.Body}
	if len(req.msg.Sequences) == 0 {
		return cmd
	}
	cmd.Sequences = make([]rewrite.Sequence, len(req.msg.Sequences))
	for i, s := range req.msg.Sequences {
		cmd.Sequences[i] = rewrite.SequenceOf(s.Identifier, s.Documents)
	}
	return cmd
}

// upstreamCaps detects once what the upstream supports, on this client's
// connection (so with its privileges: buildInfo needs none on MongoDB).
func (c *Conn) upstreamCaps() (caps.Upstream, error) {
	return c.s.Abilities.Caps(c.up)
}
