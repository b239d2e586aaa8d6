package proxy

import (
	"fmt"
	"time"

	"github.com/tsproxy/tsproxy/rewrite/admin"
	"github.com/tsproxy/tsproxy/rewrite/read"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite/cursor"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/query"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/upstream"
	"github.com/tsproxy/tsproxy/wire"
)

// This file serves the read path of a bucketed namespace: find, aggregate,
// count, distinct and explain become aggregates on the bucket collection
// (read.PlanRead), their cursors are remembered in the registry so
// getMore and killCursors on any connection are mapped back, and
// collStats, drop and listCollections show the buckets as the app's
// collection.

// upCommand sends one command body the proxy built to the upstream and
// returns a copy of the reply body.
func (c *conn) upCommand(cmd []byte) ([]byte, error) {
	return c.roundTripBody(c.commandFrame(cmd))
}

// commandFrame frames cmd as an OP_MSG in the connection's out buffer;
// the frame is valid until the next frame is built.
func (c *conn) commandFrame(cmd []byte) []byte {
	frame := wire.AppendMsg(c.outBuf[:0], upstream.NextRequestID(), 0, 0, cmd)
	c.outBuf = frame[:0]
	return frame
}

// replyRewriteError answers with a rewrite error (its own code).
func (c *conn) replyRewriteError(req *request, err error) error {
	c.s.tel.errorSeen("unsupported")
	return c.replyBody(req, mongoerr.Reply(err))
}

// rewriteRead serves find, aggregate, count, distinct and explain.
func (c *conn) rewriteRead(req *request, rule *rules.Rule) error {
	if rule.Partitioned() {
		return c.rewriteReadPartitioned(req, rule) // proxy/partition_read.go
	}
	caps, err := c.upstreamCaps()
	if err != nil {
		return err
	}
	if done, err := c.answerFromSummaries(req, rule, caps); done {
		return err
	}
	plan, err := read.PlanRead(req.msg.Body, rule, read.ReadOptions{Caps: caps})
	if err != nil {
		return c.replyRewriteError(req, err)
	}
	switch {
	case plan.Local != nil:
		out := plan.Local
		if plan.LocalExplain != nil {
			reply, err := c.upCommand(plan.LocalExplain)
			if err != nil {
				return err
			}
			out = cursor.WithUpstreamPlan(out, reply)
		}
		return c.replyBody(req, out)
	case plan.Point != nil:
		return c.servePoint(req, rule, plan.Point)
	}
	span := c.s.tel.startCommand(req, routeRewrite)
	t0 := time.Now()
	for next := plan.MetaPrefetch(); next != nil; {
		r, err := c.upCommand(next)
		if err != nil {
			span.end(req, time.Since(t0), err)
			return err
		}
		next = plan.AddPrefetched(r)
	}
	reply, err := c.upCommand(plan.Command)
	if err != nil {
		span.end(req, time.Since(t0), err)
		return err
	}
	switch {
	case plan.Passthrough:
		span.end(req, time.Since(t0), nil)
		return c.replyBody(req, reply)
	case plan.Drain:
		for {
			if err := c.resolveMetas(plan.MetaQuery(reply), plan.AddMetas); err != nil {
				span.end(req, time.Since(t0), err)
				return err
			}
			next := plan.Feed(reply)
			if next == nil {
				break
			}
			if reply, err = c.upCommand(next); err != nil {
				span.end(req, time.Since(t0), err)
				return err
			}
		}
		span.end(req, time.Since(t0), nil)
		return c.replyBody(req, plan.Result())
	}
	if err := c.resolveMetas(plan.Cursor.MetaQuery(reply), plan.Cursor.AddMetas); err != nil {
		span.end(req, time.Since(t0), err)
		return err
	}
	out, id, err := plan.Cursor.MapReply(reply)
	if err != nil {
		span.end(req, time.Since(t0), err)
		return c.replyRewriteError(req, err)
	}
	if id != 0 {
		if plan.Cursor.SingleBatch {
			c.killUpstreamCursor(rule, id)
		} else if !c.registerCursor(req, id, &cursorEntry{rule: rule, reshape: plan.Cursor}) {
			c.killUpstreamCursor(rule, id)
			span.end(req, time.Since(t0), nil)
			return c.replyTooManyCursors(req, rule)
		}
	}
	span.end(req, time.Since(t0), nil)
	return c.replyBody(req, out)
}

// resolveMetas runs the lookups of bucket metas a batch needs (FerretDB's
// $unwind drops them); an upstream refusal shows up when the batch is
// mapped, as an unknown meta.
func (c *conn) resolveMetas(queries [][]byte, add func([]byte) error) error {
	for _, q := range queries {
		reply, err := c.upCommand(q)
		if err != nil {
			return err
		}
		if err := add(reply); err != nil {
			c.log.Warn("bucket meta lookup failed", "err", err.Error())
		}
	}
	return nil
}

// killUpstreamCursor kills a cursor the app will never read on; a failure
// only leaves it to the upstream's timeout.
func (c *conn) killUpstreamCursor(rule *rules.Rule, id int64) {
	if _, err := c.upCommand(query.KillCursorsCommand(rule, id)); err != nil {
		c.log.Debug("killCursors of a single-batch cursor failed", "rule", rule.Namespace, "err", err.Error())
	}
}

// rewriteGetMore continues a rewritten read's cursor.
func (c *conn) rewriteGetMore(req *request, rule *rules.Rule) error {
	id, _ := bson.Raw(req.msg.Body).Lookup("getMore").AsInt64OK()
	entry := c.s.cursors.get(id)
	if entry != nil {
		switch pc := entry.reshape.(type) {
		case *pointCursor:
			return c.servePointMore(req, entry.rule, id, pc)
		case *partitionCursor:
			return c.servePartitionMore(req, id, pc)
		}
		rule = entry.rule // a partColl's, for a partitioned rule
	}
	shape, _ := entryShape(entry)
	if shape == nil {
		return c.replyError(req, mongoerr.CursorNotFound, fmt.Sprintf("tsproxy rule %s: cursor id %d not found", rule.Namespace, id))
	}
	cmd, err := query.GetMore(req.msg.Body, rule)
	if err != nil {
		return c.replyRewriteError(req, err)
	}
	c.ownCursor(id)
	span := c.s.tel.startCommand(req, routeCursor)
	t0 := time.Now()
	reply, err := c.upCommand(cmd)
	span.end(req, time.Since(t0), err)
	if err != nil {
		return err
	}
	if err := c.resolveMetas(shape.MetaQuery(reply), shape.AddMetas); err != nil {
		return err
	}
	out, next, err := shape.MapReply(reply)
	if err != nil {
		c.s.cursors.forget(id)
		return c.replyRewriteError(req, err)
	}
	if next == 0 {
		c.s.cursors.forget(id)
	}
	return c.replyBody(req, out)
}

func entryShape(e *cursorEntry) (*read.CursorShape, bool) {
	if e == nil {
		return nil, false
	}
	s, ok := e.reshape.(*read.CursorShape)
	return s, ok
}

// rewriteKillCursors kills cursors of the app's namespace: they are the
// bucket collection's upstream.
func (c *conn) rewriteKillCursors(req *request, rule *rules.Rule) error {
	cmd, ids, err := query.KillCursors(req.msg.Body, rule)
	if err != nil {
		return c.replyRewriteError(req, err)
	}
	var local []int64
	for _, id := range ids {
		if e := c.s.cursors.get(id); e != nil {
			if _, ok := e.reshape.(*pointCursor); ok {
				local = append(local, id)
				c.closeScanEntry(e)
			}
		}
		c.s.cursors.forget(id)
	}
	if len(local) > 0 && len(local) == len(ids) {
		// Only proxy-held cursors: nothing to kill upstream.
		return c.replyBody(req, cursor.KillCursorsReply(nil, local))
	}
	reply, err := c.upCommand(cmd)
	if err != nil {
		return err
	}
	if len(local) > 0 {
		reply = cursor.KillCursorsReply(reply, local)
	}
	return c.replyBody(req, reply)
}

// rewriteCollStats reports the bucket collection's statistics under the
// app's namespace, with the number of events as count.
func (c *conn) rewriteCollStats(req *request, rule *rules.Rule) error {
	plan, err := admin.PlanCollStats(req.msg.Body, rule)
	if err != nil {
		return c.replyRewriteError(req, err)
	}
	stats, err := c.upCommand(plan.Stats)
	if err != nil {
		return err
	}
	count := int64(-1)
	reply, err := c.upCommand(plan.Count)
	if err != nil {
		return err
	}
	if n, ok := plan.CountFrom(reply); ok {
		count = n
	} else {
		if reply, err = c.upCommand(plan.CountFallback); err != nil {
			return err
		}
		if n, ok := plan.CountFrom(reply); ok {
			count = n
		}
	}
	return c.replyBody(req, plan.Reply(stats, count))
}

// rewriteDrop drops the bucket collection and forgets that its index was
// ensured, so the next write creates it again.
func (c *conn) rewriteDrop(req *request, rule *rules.Rule) error {
	cmd, err := admin.PlanDrop(req.msg.Body, rule)
	if err != nil {
		return c.replyRewriteError(req, err)
	}
	dropped := 0
	if rule.Partitioned() {
		if dropped, err = c.dropPartitions(rule); err != nil {
			return err
		}
	}
	reply, err := c.upCommand(cmd)
	st := c.s.state
	st.mu.Lock()
	delete(st.indexes, rule.BucketNamespace())
	st.mu.Unlock()
	// The next insert must find the buckets again, from seq 0.
	st.forgetBuckets(rule.BucketNamespace())
	if err != nil {
		return err
	}
	c.dropRollups(rule)
	return c.replyBody(req, partitionDropReply(admin.DropReply(reply, rule), rule, dropped))
}

// rewriteListCollections lists a database holding bucketed namespaces as
// the app sees it. It is reached for listCollections on a database where
// Rules.InDB is true.
func (c *conn) rewriteListCollections(req *request) error {
	if err := c.ensureUpstream(); err != nil {
		return c.replyUpstreamDown(req, err)
	}
	var rs []*rules.Rule
	all := c.s.opts.Rules.All()
	for i := range all {
		if all[i].DB == req.db {
			rs = append(rs, &all[i])
		}
	}
	first, err := c.firstPartitions(rs) // proxy/partition.go
	if err != nil {
		return err
	}
	plan, err := admin.PlanListCollectionsPartitioned(req.msg.Body, req.db, rs, first)
	if err != nil {
		return c.replyRewriteError(req, err)
	}
	reply, err := c.upCommand(plan.Command)
	if err != nil {
		return err
	}
	for next := plan.Feed(reply); next != nil; next = plan.Feed(reply) {
		if reply, err = c.upCommand(next); err != nil {
			return err
		}
	}
	return c.replyBody(req, plan.Result())
}
