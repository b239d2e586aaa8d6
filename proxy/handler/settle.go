package handler

import (
	"errors"

	"github.com/tsproxy/tsproxy/proxy/tier"
	"github.com/tsproxy/tsproxy/rewrite/fanout"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
)

// settleStaged merges everything staged of rule before a command that
// reads or changes its stored events, so that the command sees every
// acknowledged event exactly once, in complete buckets. An error is the
// client's answer (the command does not run).
func (c *Conn) settleStaged(req *request, rule *rules.Rule) error {
	staged, caps, err := c.stagedRule(rule)
	if err != nil || !staged {
		return nil // no caps: the command itself meets the upstream's error
	}
	if err := c.s.Tier().Flush(c, rule, caps, nil, readThrough(req, rule), tier.MakeSpare); err != nil {
		var up tier.UpstreamFailure
		if errors.As(err, &up) {
			return answered(up.Err)
		}
		return answered(c.replyError(req, mongoerr.CodeOf(err), err.Error()))
	}
	return nil
}

// readThrough is the latest event time (ms) req, a command on rule, can
// read, or tier.AllStaged when it may read or change any event: a read
// bounded in time need not wait for a merge of staging periods that
// start after its bound (stage.WorkThrough says why), as a report on
// yesterday while today's events are staged. Only the events layout,
// whose reads filter on the events' own times.
func readThrough(req *request, rule *rules.Rule) int64 {
	if rule.Layout != rules.LayoutEvents {
		return tier.AllStaged
	}
	to, ok := fanout.ReadTimeEnd(req.msg.Body, rule)
	if ok {
		return to
	}
	return tier.AllStaged
}
