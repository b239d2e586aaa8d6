package handler

import (
	"fmt"
	"math/rand/v2"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/proxy/cursors"
	"github.com/tsproxy/tsproxy/proxy/exec"
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/admin"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/cursor"
	"github.com/tsproxy/tsproxy/rewrite/fanout"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/query"
	"github.com/tsproxy/tsproxy/rewrite/read"
	"github.com/tsproxy/tsproxy/rewrite/summary"
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
func (c *Conn) upCommand(cmd []byte) ([]byte, error) {
	return c.roundTripBody(c.commandFrame(cmd))
}

// commandFrame frames cmd as an OP_MSG in the connection's out buffer;
// the frame is valid until the next frame is built.
func (c *Conn) commandFrame(cmd []byte) []byte {
	frame := wire.AppendMsg(c.outBuf[:0], upstream.NextRequestID(), 0, 0, cmd)
	c.outBuf = frame[:0]
	return frame
}

// replyRewriteError answers with a rewrite error (its own code).
func (c *Conn) replyRewriteError(req *request, err error) error {
	c.s.Tel.ErrorSeen("unsupported")
	return c.replyBody(req, mongoerr.Reply(err))
}

// rewriteRead serves find, aggregate, count, distinct and explain: from
// the bucket summaries where they answer exactly, else by point lookups,
// a bucket scan or an aggregate on the bucket collection (rewrite/read).
func (c *Conn) rewriteRead(req *request, rule *rules.Rule) error {
	caps, err := c.upstreamCaps()
	if err != nil {
		return err
	}
	opts := c.readOptions(rule, caps)
	single := func(r *rules.Rule, body []byte) rewrite.Plan {
		return summary.Plan(body, r, opts, func() rewrite.Plan { return read.Plan(body, r, opts, newCursorID) })
	}
	return c.servePlan(req, rule, routeRewrite, fanout.Read(req.msg.Body, rule, opts, newCursorID, single))
}

// newCursorID is a fresh id for a cursor the proxy holds. Bit 62 set keeps
// it apart from FerretDB's small sequential ids; against MongoDB's random
// ids a collision has a 2^-62 chance.
func newCursorID() int64 { return rand.Int64()>>2 | 1<<62 }

// rewriteGetMore continues a cursor a rewritten read left open: the
// cursor's own plan gives the next batch, and the cursor is forgotten once
// it is exhausted.
func (c *Conn) rewriteGetMore(req *request, rule *rules.Rule) error {
	v := bson.Raw(req.msg.Body).Lookup("getMore")
	id, ok := v.Int64OK()
	if !ok {
		return c.replyError(req, mongoerr.TypeMismatch, fmt.Sprintf("Field 'getMore' must be of type long, not %s", v.Type))
	}
	e := c.s.Cursors.Get(id)
	if e == nil {
		return c.replyError(req, mongoerr.CursorNotFound, fmt.Sprintf("tsproxy rule %s: cursor id %d not found", rule.Namespace, id))
	}
	c.ownCursor(id)
	e.Mu.Lock()
	defer e.Mu.Unlock()
	span := c.s.Tel.Start(req.name, req.db, routeCursor.String(), req.start)
	tr := &timedRunner{c: c}
	res, err := exec.Drive(tr, e.Cursor.More(req.msg.Body))
	c.endAfterReply(span, tr.wait, err)
	if err != nil {
		c.forgetCursor(id)
		return err
	}
	if res.Cursor == nil {
		c.forgetCursor(id)
	}
	return c.replyBody(req, tr.gossip.AddTo(res.Reply))
}

// rewriteKillCursors kills cursors of the app's namespace: those the proxy
// knows by their own Close plans (which name the right collection, a
// partition's included), the others with the client's killCursors sent to
// the bucket collection.
func (c *Conn) rewriteKillCursors(req *request, rule *rules.Rule) error {
	cmd, ids, err := query.KillCursors(req.msg.Body, rule)
	if err != nil {
		return c.replyRewriteError(req, err)
	}
	var known []int64
	for _, id := range ids {
		e := c.s.Cursors.Get(id)
		if e == nil {
			continue
		}
		c.forgetCursor(id)
		known = append(known, id)
		if err := c.releaseEntry(e); err != nil {
			return err
		}
	}
	if len(known) == len(ids) || rule.Partitioned() {
		// Nothing else to kill upstream (a partitioned rule has no single
		// collection to send it to: its cursors are all known).
		return c.replyBody(req, cursor.KillCursorsReply(nil, known))
	}
	reply, err := c.upCommand(cmd)
	if err != nil {
		return err
	}
	if len(known) > 0 {
		reply = cursor.KillCursorsReply(reply, known)
	}
	return c.replyBody(req, reply)
}

// releaseEntry releases a forgotten cursor's upstream resources, after any
// getMore of it running on another connection.
func (c *Conn) releaseEntry(e *cursors.Entry) error {
	e.Mu.Lock()
	defer e.Mu.Unlock()
	return c.releaseCursor(e.Rule, e.Cursor, e.CursorSession)
}

// rewriteListCollections lists a database holding bucketed namespaces as
// the app sees it. It is reached for listCollections on a database where
// Rules.InDB is true.
func (c *Conn) rewriteListCollections(req *request) error {
	if err := c.ensureUpstream(); err != nil {
		return c.replyUpstreamDown(req, err)
	}
	if err := c.gateList(req, req.db); err != nil {
		return err
	}
	var rs []*rules.Rule
	all := c.rules.All()
	for i := range all {
		if all[i].DB == req.db {
			rs = append(rs, &all[i])
		}
	}
	owner := &rules.Rule{DB: req.db, Collection: "$cmd", Namespace: req.db + ".$cmd"} // for logs: no rule in db
	if len(rs) > 0 {
		owner = rs[0]
	}
	return c.servePlan(req, owner, routeRewrite, admin.ListCollections(req.msg.Body, req.db, rs))
}

// idLookupCost says what a find by _id on rule's bucket collection costs
// on this upstream. On both of FerretDB v1.24's storages it scans the
// collection: its _id index is on an expression its own queries do not
// use (SQLite compares `->'$._id'`, PostgreSQL tests `-> '_id' @> ...`),
// unless the proxy added the index SQLite can use (the embedded
// upstream). The upstream's plan of a probe tells, once per upstream.
func (c *Conn) idLookupCost(rule *rules.Rule, caps caps.Upstream) read.IDLookupCost {
	return c.s.Abilities.IDLookupCost(c.up, rule, caps)
}
