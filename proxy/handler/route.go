package handler

import (
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/proxy/admin"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/wire"
)

// route says how a request is served.
type route uint8

const (
	routePassthrough route = iota // bytes through unchanged
	routeRewrite                  // a command on a bucketed namespace
	routeCursor                   // getMore/killCursors of a rewritten read's cursor
)

func (r route) String() string {
	switch r {
	case routeRewrite:
		return "rewritten"
	case routeCursor:
		return "cursor"
	}
	return "passthrough"
}

// bucketedTarget finds the rule a request is subject to. Commands name
// their collection as the value of their first field; getMore names a
// cursor, which is the proxy's if a rewritten read opened it; explain
// wraps another command.
func (c *Conn) bucketedTarget(req *request) (*rules.Rule, route) {
	if c.rules.Len() == 0 {
		return nil, routePassthrough
	}
	body := bson.Raw(req.msg.Body)
	first, err := body.IndexErr(0)
	if err != nil {
		return nil, routePassthrough
	}
	switch req.name {
	case "getMore":
		// Any number: a registered cursor's id sent as a double or an int32
		// must meet the proxy's owner check (rewriteGetMore then refuses
		// the type, as MongoDB does), not reach the upstream unchecked.
		id, ok := first.Value().AsInt64OK()
		if !ok {
			return nil, routePassthrough
		}
		if rule := c.s.Cursors.Rule(id); rule != nil {
			return rule, routeCursor
		}
		// A cursor on a rule's namespace that this proxy does not hold
		// (another proxy's, behind a load balancer, or one that expired):
		// CursorNotFound from the proxy. Passed through, it could meet the
		// upstream's cursor of the same id on the bucket collection.
		if coll, ok := body.Lookup("collection").StringValueOK(); ok {
			if rule := c.rules.Lookup(req.db, coll); rule != nil {
				return rule, routeCursor
			}
		}
		return nil, routePassthrough
	case "explain":
		inner, ok := first.Value().DocumentOK()
		if !ok {
			return nil, routePassthrough
		}
		if ie, err := inner.IndexErr(0); err == nil {
			if coll, ok := ie.Value().StringValueOK(); ok {
				if rule := c.rules.Lookup(req.db, coll); rule != nil {
					return rule, routeRewrite
				}
			}
		}
		return nil, routePassthrough
	}
	coll, ok := first.Value().StringValueOK()
	if !ok {
		return nil, routePassthrough
	}
	if rule := c.rules.Lookup(req.db, coll); rule != nil {
		return rule, routeRewrite
	}
	return nil, routePassthrough
}

// route sends a request where it belongs: to what the front door serves
// itself (frontCommands), else by the rule it names.
func (c *Conn) route(req *request) error {
	c.noteAuthChange(req)
	if err := c.catalogGate(req); err != nil {
		return err
	}
	if serve, ok := frontCommands[req.name]; ok {
		return serve(c, req)
	}
	return c.routeByRule(req)
}

// frontCommands are served before a request's rule is looked at; each
// goes on to routeByRule where it does not apply.
var frontCommands = map[string]func(*Conn, *request) error{
	"hello":                (*Conn).handleHello,
	"isMaster":             (*Conn).handleHello,
	"ismaster":             (*Conn).handleHello,
	"create":               (*Conn).routeCreate,
	"listCollections":      (*Conn).routeListCollections,
	"dropDatabase":         (*Conn).routeDropDatabase,
	"endSessions":          (*Conn).routeEndSessions,
	"renameCollection":     (*Conn).routeRename,
	"tsproxyFlush":         (*Conn).serveFlush,
	"tsproxyStagingFormat": (*Conn).serveStagingFormat,
}

func (c *Conn) routeCreate(req *request) error {
	if c.createsTimeseries(req) {
		return c.s.Cat.ServeCreate(c.catalogClient(req))
	}
	return c.routeByRule(req)
}

// routeListCollections shows each rule's namespace in place of its bucket
// collection, and hides the proxy's own collections (a database whose
// time-series collections were all dropped keeps its writer leases).
func (c *Conn) routeListCollections(req *request) error {
	if c.rules.InDB(req.db) || !c.s.Cat.Load().Static {
		return c.rewriteListCollections(req)
	}
	return c.routeByRule(req)
}

func (c *Conn) routeDropDatabase(req *request) error {
	if created := createdInDB(c.rules, req.db); len(created) > 0 {
		return c.s.Cat.ServeDropDatabase(c.catalogClient(req), created)
	}
	return c.routeByRule(req)
}

// routeEndSessions ends the sessions' cursors here, then passes through.
func (c *Conn) routeEndSessions(req *request) error {
	c.endCursorSessions(req)
	return c.routeByRule(req)
}

func (c *Conn) routeRename(req *request) error {
	rule := c.renameTouchesRule(req)
	if rule == nil {
		return c.routeByRule(req)
	}
	if err := c.ensureUpstream(); err != nil {
		return c.replyUpstreamDown(req, err)
	}
	if err := c.gate(req, rule); err != nil {
		return err
	}
	return c.refuseRename(req, rule)
}

// routeByRule serves a command on a bucketed namespace, refuses one that
// names a bucketed namespace from another collection, settles a rollup's
// source before it is read, and passes the rest through.
func (c *Conn) routeByRule(req *request) error {
	if rule, route := c.bucketedTarget(req); route != routePassthrough {
		return c.handleBucketed(req, rule, route)
	}
	if rule, what := c.crossRefRule(req); rule != nil {
		return c.serveCrossRef(req, rule, what)
	}
	if rule := c.rollupTarget(req); rule != nil {
		// A staged rule's rollups count its events when they are
		// merged: the merge runs first, as before a read of the events.
		if err := c.ensureUpstream(); err != nil {
			return c.replyUpstreamDown(req, err)
		}
		if err := c.settleStaged(req, rule); err != nil {
			return err
		}
	}
	return c.passthrough(req)
}

// serveCrossRef serves a command on another collection that names rule's
// namespace: a join is answered from its buckets, anything else refused.
func (c *Conn) serveCrossRef(req *request, rule *rules.Rule, what string) error {
	if req.name == "aggregate" && isJoinStage(what) {
		if joined := c.joinedRules(req); len(joined) > 0 {
			return c.serveJoin(req, joined)
		}
	}
	if err := c.ensureUpstream(); err != nil {
		return c.replyUpstreamDown(req, err)
	}
	if err := c.gate(req, rule); err != nil {
		return err
	}
	if req.msg.Flags&wire.MoreToCome != 0 {
		return nil
	}
	return c.replyError(req, mongoerr.NotImplemented, fmt.Sprintf(
		"tsproxy rule %s: %s naming a bucketed namespace from a command on another collection is not supported (its events are in %s, which the upstream would read or write as it is)", rule.Namespace, what, rule.BucketNamespace()))
}

func (c *Conn) serveFlush(req *request) error {
	return admin.ServeFlush(c.s.Tier(), c.catalogClient(req))
}

func (c *Conn) serveStagingFormat(req *request) error {
	return admin.ServeStagingFormat(c.s.Tier(), c.catalogClient(req))
}
