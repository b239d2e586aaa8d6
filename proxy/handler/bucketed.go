package handler

import (
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/wire"
)

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
