package handler

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"

	"github.com/tsproxy/tsproxy/proxy/cursors"
	"github.com/tsproxy/tsproxy/proxy/exec"
	"github.com/tsproxy/tsproxy/proxy/tier/lease"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/admin"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/fanout"
	"github.com/tsproxy/tsproxy/rewrite/read"
	"github.com/tsproxy/tsproxy/rewrite/summary"

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
	c.s.tel.ErrorSeen("unsupported")
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

// killUpstreamCursor kills a cursor the app will never read on; a failure
// only leaves it to the upstream's timeout.
func (c *Conn) killUpstreamCursor(rule *rules.Rule, id int64) {
	if _, err := c.upCommand(query.KillCursorsCommand(rule, id)); err != nil {
		c.log.Debug("killCursors of a cursor nobody reads failed", "rule", rule.Namespace, "err", err.Error())
	}
}

// rewriteGetMore continues a cursor a rewritten read left open: the
// cursor's own plan gives the next batch, and the cursor is forgotten once
// it is exhausted.
func (c *Conn) rewriteGetMore(req *request, rule *rules.Rule) error {
	v := bson.Raw(req.msg.Body).Lookup("getMore")
	id, ok := v.Int64OK()
	if !ok {
		return c.replyError(req, mongoerr.TypeMismatch, fmt.Sprintf("Field 'getMore' must be of type long, not %s", v.Type))
	}
	e := c.s.cursors.Get(id)
	if e == nil {
		return c.replyError(req, mongoerr.CursorNotFound, fmt.Sprintf("tsproxy rule %s: cursor id %d not found", rule.Namespace, id))
	}
	c.ownCursor(id)
	e.Mu.Lock()
	defer e.Mu.Unlock()
	span := c.s.tel.Start(req.name, req.db, routeCursor.String(), req.start)
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
		e := c.s.cursors.Get(id)
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
	return c.releaseCursor(e.Rule, e.Cursor)
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
	return c.s.idLookupCost(c.up, c.log, rule, caps)
}

// idLookupCost is conn.idLookupCost on any upstream connection (a
// merge's). What a lookup costs is the storage's, not the collection's:
// where the rule's bucket collection does not exist yet (a rule's first
// merge), FerretDB explains no plan, and the probe asks about the
// rule's lease collection, which a merging proxy has made. Without
// that, a new rule's first merge on the stock command looked each of
// its buckets up one by one, 172 lookups for 10,000 events of
// 1-minute slots (tsbench layouts).
func (s *Engine) idLookupCost(up lease.Commander, log *slog.Logger, rule *rules.Rule, caps caps.Upstream) read.IDLookupCost {
	if !caps.IDOnlyFilters || s.opts.IndexIDs != nil {
		return read.IDLookupIndexed
	}
	st := s.state
	st.mu.Lock()
	known := st.idLookups
	st.mu.Unlock()
	if known != nil {
		return *known
	}
	var cost read.IDLookupCost
	probed := false
	for _, coll := range []string{rule.BucketCollection, rules.LeaseCollection} {
		if cost, probed = probeIDLookup(up, rule.DB, coll); probed {
			break
		}
	}
	if !probed {
		return read.IDLookupIndexed // asked again on the next read or merge
	}
	st.mu.Lock()
	st.idLookups = &cost
	st.mu.Unlock()
	log.Info("upstream lookups by _id probed", "rule", rule.Namespace, "cost", int(cost))
	return cost
}

// probeIDLookup explains a find by _id on db.coll; false when the
// upstream gives no plan (no such collection) or refuses.
func probeIDLookup(up lease.Commander, db, coll string) (read.IDLookupCost, bool) {
	reply, err := exec.CommandDoc(up, bson.D{
		{Key: "explain", Value: bson.D{{Key: "find", Value: coll}, {Key: "filter", Value: bson.D{{Key: "_id", Value: bson.NilObjectID}}}}},
		{Key: "$db", Value: db},
	})
	if err != nil || upstream.RefusalOf(reply) != nil {
		return read.IDLookupIndexed, false
	}
	plan, _ := reply.Lookup("queryPlanner").DocumentOK()
	if elems, _ := plan.Elements(); len(elems) == 0 {
		return read.IDLookupIndexed, false
	}
	return lookupCostOf(plan), true
}

// lookupCostOf reads FerretDB's explain of a find by _id: SQLite's steps
// name a full scan "SCAN <table>" (and it parses each row's JSON),
// PostgreSQL's plan is a "Seq Scan" node (whose jsonb filter runs in
// storage).
func lookupCostOf(queryPlanner bson.Raw) read.IDLookupCost {
	switch plan := queryPlanner.Lookup("Plan"); plan.Type {
	case bson.TypeArray:
		vals, _ := plan.Array().Values()
		for _, v := range vals {
			if s, ok := v.StringValueOK(); ok && strings.Contains(s, "detail=SCAN ") {
				return read.IDLookupScansParsed
			}
		}
	case bson.TypeEmbeddedDocument:
		if node, _ := plan.Document().Lookup("Node Type").StringValueOK(); node == "Seq Scan" {
			return read.IDLookupScansFiltered
		}
	}
	return read.IDLookupIndexed
}
