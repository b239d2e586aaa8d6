package handler

import (
	"fmt"
	"time"

	"github.com/tsproxy/tsproxy/proxy/cursors"
	"github.com/tsproxy/tsproxy/proxy/exec"
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/wire"
)

// timedRunner runs steps on the connection and adds up the time spent
// waiting on the upstream, for the command's metrics; it keeps the
// replies' latest operationTime and $clusterTime for the client's reply.
// Its getMores and killCursors carry the session their cursor was
// opened in (sessions).
type timedRunner struct {
	c        *Conn
	sessions *rewrite.CursorSessions
	wait     time.Duration
	gossip   rewrite.Gossip
}

func (t *timedRunner) RunStep(step rewrite.Step) ([][]byte, error) {
	t0 := time.Now()
	defer func() { t.wait += time.Since(t0) }()
	replies, err := sessionRunner{c: t.c, sessions: t.sessions}.RunStep(step)
	for _, r := range replies {
		t.gossip.Note(r)
	}
	return replies, err
}

// servePlan runs the plan of req on rule's namespace and answers the
// client (runPlan, then answer).
func (c *Conn) servePlan(req *request, rule *rules.Rule, r route, p rewrite.Plan) error {
	res, err := c.runPlan(req, rule, r, p)
	if err != nil {
		return err
	}
	return c.answer(req, rule, res)
}

// runPlan runs the plan of req on rule's namespace: the proxy state its
// result invalidates is forgotten and its cursor remembered for getMore
// and killCursors (a cursor over the limit is released and refused).
func (c *Conn) runPlan(req *request, rule *rules.Rule, r route, p rewrite.Plan) (rewrite.Result, error) {
	span := c.s.Tel.Start(req.name, req.db, r.String(), req.start)
	tr := &timedRunner{c: c, sessions: rewrite.NewCursorSessions(req.msg.Body)}
	res, err := exec.Drive(tr, p)
	c.endAfterReply(span, tr.wait, err)
	if err != nil {
		return res, err
	}
	res.Reply = tr.gossip.AddTo(res.Reply)
	for _, ns := range res.Forget {
		c.s.ForgetNamespace(ns)
	}
	if res.StoredBefore > 0 {
		c.log.Info("retried insert: events an earlier attempt stored are not written again", "rule", rule.Namespace, "events", res.StoredBefore)
	}
	if res.Cursor != nil && !c.registerCursor(req, res.Cursor.ID(), &cursors.Entry{Rule: rule, Cursor: res.Cursor}) {
		_ = c.releaseCursor(rule, res.Cursor, rewrite.ReadCursorSession(req.msg.Body))
		res = rewrite.Result{Reply: c.tooManyCursors(rule)}
	}
	return res, nil
}

// answer sends a plan's reply (none to an unacknowledged command) and runs
// its After work; a failure of that work is logged, as the client has its
// answer.
func (c *Conn) answer(req *request, rule *rules.Rule, res rewrite.Result) error {
	if req.msg.Flags&wire.MoreToCome != 0 && res.Reply != nil && !mongoerr.IsOK(res.Reply) {
		c.log.Warn("unacknowledged "+req.name+" failed", "rule", rule.Namespace, "err", mongoerr.FromReply(res.Reply, "refused").Error())
	}
	if req.msg.Flags&wire.MoreToCome == 0 && res.Reply != nil {
		if err := c.replyBody(req, res.Reply); err != nil {
			return err
		}
	}
	if res.After == nil {
		return nil
	}
	after, err := exec.Drive(c, res.After)
	if err != nil {
		c.log.Warn("work after the reply failed", "rule", rule.Namespace, "command", req.name, "err", err.Error())
		return err
	}
	if after.Reply != nil && !mongoerr.IsOK(after.Reply) {
		c.log.Warn("work after the reply was refused by the upstream", "rule", rule.Namespace, "command", req.name,
			"err", mongoerr.FromReply(after.Reply, "refused").Error())
	}
	return nil
}

// releaseCursor runs a cursor's Close plan, its killCursors in session
// (the session's of the read that opened the cursor). A failure (the
// upstream connection's) is logged and leaves the upstream cursor to the
// upstream's timeout.
func (c *Conn) releaseCursor(rule *rules.Rule, cur rewrite.Cursor, session rewrite.CursorSession) error {
	p := cur.Close()
	if p == nil {
		return nil
	}
	_, err := exec.Drive(sessionRunner{c: c, sessions: rewrite.SessionsOf(session)}, p)
	if err != nil {
		c.log.Debug("releasing a cursor upstream failed; the upstream times it out", "rule", rule.Namespace, "cursor", cur.ID(), "err", err.Error())
	}
	return err
}

// sessionRunner runs steps on c, their getMores and killCursors in
// sessions'.
type sessionRunner struct {
	c        *Conn
	sessions *rewrite.CursorSessions
}

func (r sessionRunner) RunStep(step rewrite.Step) ([][]byte, error) {
	step = r.sessions.Prepare(step)
	replies, err := r.c.RunStep(step)
	r.sessions.Note(step, replies)
	return replies, err
}

// RunStep sends a step on the client's upstream connection (pipeline). An
// update on an upstream that bounds them holds a write slot meanwhile.
func (c *Conn) RunStep(step rewrite.Step) ([][]byte, error) {
	if len(step) == 1 && step[0].Keep && c.s.Tier().Keeps() {
		return c.s.Tier().RunKept(asIs{c}, step[0])
	}
	return c.runStepAsIs(step)
}

// asIs runs steps on c without keeping what a staged insert stored.
type asIs struct{ c *Conn }

func (a asIs) RunStep(step rewrite.Step) ([][]byte, error) { return a.c.runStepAsIs(step) }

// runStepAsIs is runStep without keeping what a staged insert stored.
func (c *Conn) runStepAsIs(step rewrite.Step) ([][]byte, error) {
	if len(step) == 1 && step[0].Combine {
		return c.s.Tier().RunCombined(c, c.identity, step[0])
	}
	if len(step) == 1 {
		frame, err := c.upstreamFrame(step[0])
		if err != nil {
			return nil, err
		}
		body, err := c.roundTripInSlot(frame, step[0].Update && c.s.Abilities.SlotsUpdates())
		if err != nil {
			return nil, err
		}
		return [][]byte{body}, nil
	}
	for _, u := range step {
		if u.Update && c.s.Abilities.SlotsUpdates() {
			// Slotted updates are sent one by one, each in its slot.
			return c.runEach(step)
		}
	}
	return exec.Pipeline(c.up, &c.outBuf, step)
}

func (c *Conn) runEach(step rewrite.Step) ([][]byte, error) {
	out := make([][]byte, 0, len(step))
	for _, u := range step {
		replies, err := c.RunStep(rewrite.Step{u})
		if err != nil {
			return nil, err
		}
		out = append(out, replies[0])
	}
	return out, nil
}

// upstreamFrame frames u in the connection's out buffer; the frame is
// valid until the next frame is built.
func (c *Conn) upstreamFrame(u rewrite.Upstream) ([]byte, error) {
	frame, err := exec.AppendFrame(c.outBuf[:0], u)
	if err != nil {
		return nil, err
	}
	c.outBuf = frame[:0]
	return frame, nil
}

// roundTripBody sends a frame the proxy built and returns a copy of the
// reply's body (the frame's buffer is reused by the next read).
func (c *Conn) roundTripBody(frame []byte) ([]byte, error) {
	_, rf, err := exec.Forward(c.up, frame)
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
