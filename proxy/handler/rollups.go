package handler

import (
	"github.com/tsproxy/tsproxy/proxy/exec"
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/rollup"
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
// is reply. Errors are logged, never returned (see above), but for the
// upstream connection's, which closes the client's.
func (c *Conn) maintainRollups(rule *rules.Rule, cmd rewrite.Command, reply []byte) error {
	if len(rule.Rollups) == 0 {
		return nil
	}
	caps, err := c.upstreamCaps()
	if err != nil {
		c.log.Error("rollups not updated: upstream capabilities unknown", "rule", rule.Namespace, "err", err.Error())
		return nil
	}
	if caps.SingleWriter {
		// Inserts into different windows of one series hold different
		// series locks but $inc the same coarser rollup documents; on an
		// upstream whose updates are not isolated, one would be lost.
		mu := c.s.Life.RollupWriter(rule.Namespace)
		mu.Lock()
		defer mu.Unlock()
	}
	res, err := exec.Drive(c, rollup.Plan(cmd, rule, reply, rollup.Options{MaxStatements: caps.MaxUpdateStatements, StmtIDs: caps.StmtIDs}))
	if err != nil {
		c.log.Error("rollup write failed on a broken upstream connection; the events are stored but rollups lag", "rule", rule.Namespace, "err", err.Error())
		return err
	}
	if res.Reply != nil && !mongoerr.IsOK(res.Reply) {
		c.log.Error(mongoerr.FromReply(res.Reply, "rollups not updated").Msg, "rule", rule.Namespace)
	}
	return nil
}
