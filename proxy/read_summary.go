package proxy

import (
	"time"

	"github.com/tsproxy/tsproxy/rewrite/read"
	"github.com/tsproxy/tsproxy/rewrite/summary"

	"github.com/tsproxy/tsproxy/rewrite/caps"

	"github.com/tsproxy/tsproxy/rules"
)

// answerFromSummaries serves an aggregate that the bucket summaries answer
// exactly (summary.PlanSummary): it reads only the buckets' count, min,
// max and sum and computes the groups here, on every upstream alike.
// done is false when the aggregate is not of that shape, or the buckets
// found leave the answer ambiguous: the caller then plans the read as
// usual (which unwinds, or refuses clearly on FerretDB).
func (c *conn) answerFromSummaries(req *request, rule *rules.Rule, caps caps.Upstream) (done bool, err error) {
	plan, ok := summary.PlanSummary(req.msg.Body, rule, read.ReadOptions{Caps: caps})
	if !ok {
		return false, nil
	}
	span := c.s.tel.startCommand(req, routeRewrite)
	t0 := time.Now()
	for next := plan.Command; next != nil; {
		reply, err := c.upCommand(next)
		if err != nil {
			span.end(req, time.Since(t0), err)
			return true, err
		}
		if next, err = plan.Feed(reply); err != nil {
			span.end(req, time.Since(t0), nil)
			return true, c.replyRewriteError(req, err)
		}
	}
	out, ok, err := plan.Result()
	span.end(req, time.Since(t0), nil)
	switch {
	case err != nil:
		return true, c.replyRewriteError(req, err)
	case !ok:
		return false, nil
	}
	return true, c.replyBody(req, out)
}
