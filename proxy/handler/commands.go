package handler

import (
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/proxy/engine"
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/admin"
	"github.com/tsproxy/tsproxy/rewrite/crossref"
	"github.com/tsproxy/tsproxy/rewrite/fanout"
	"github.com/tsproxy/tsproxy/rewrite/layout"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/wire"
)

// The registry of the commands a bucketed namespace answers, in one
// table: per command, how each layout serves it. A command missing from
// the table, or from its layout's column, is refused with NotImplemented
// naming the rule.

// handler serves one command on a rule's namespace.
type handler func(c *Conn, req *request, rule *rules.Rule) error

// layouts are the columns of the table: each layout's handlers. anyLayout
// serves every layout.
const anyLayout = "*"

// commandSpec is one row of the table.
type commandSpec struct {
	by map[string]handler // by layout, or anyLayout
	// retryable: a retryable write (lsid, txnNumber) the reply cache
	// answers when retried.
	retryable bool
	// unpartitioned: refused on a partitioned rule (it names one bucket
	// collection).
	unpartitioned bool
}

// plan makes a handler of a plan that needs nothing of the proxy.
func plan(build func(body []byte, rule *rules.Rule) rewrite.Plan) handler {
	return func(c *Conn, req *request, rule *rules.Rule) error {
		return c.servePlan(req, rule, routeRewrite, build(req.msg.Body, rule))
	}
}

// withOwnIndex serves an index command whose plan needs to know whether
// the proxy's own index is virtual on this upstream (caps.UnusedIndexes).
func withOwnIndex(build func(body []byte, rule *rules.Rule, ownVirtual bool) rewrite.Plan) handler {
	return func(c *Conn, req *request, rule *rules.Rule) error {
		caps, err := c.upstreamCaps()
		if err != nil {
			return err
		}
		return c.servePlan(req, rule, routeRewrite, build(req.msg.Body, rule, caps.UnusedIndexes))
	}
}

func layoutRead(c *Conn, req *request, rule *rules.Rule) error {
	return c.servePlan(req, rule, routeRewrite, layout.ReadPlan(req.msg.Body, rule, newCursorID))
}

// reads are the layouts' reads of find, aggregate and count.
var reads = map[string]handler{
	rules.LayoutEvents:  eventsRead,
	rules.LayoutCounter: layoutRead,
	rules.LayoutSlots:   layoutRead,
}

// eventsRead is the events layout's read, where an aggregate that
// begins with $collStats (mongosh's stats(), dataSize()) is the collStats
// command.
func eventsRead(c *Conn, req *request, rule *rules.Rule) error {
	if req.name == "aggregate" && admin.BeginsWithCollStats(req.msg.Body) {
		if rule.Partitioned() {
			return c.servePlan(req, rule, routeRewrite, rewrite.Fail(fanout.PartitionCommandRefusal(rule, "$collStats")))
		}
		return plan(admin.CollStats)(c, req, rule)
	}
	return c.answerRefusal(req, c.rewriteRead(req, rule))
}

var commands = map[string]commandSpec{
	"insert": {retryable: true, by: map[string]handler{
		rules.LayoutEvents: func(c *Conn, req *request, rule *rules.Rule) error {
			return c.answerRefusal(req, c.rewriteInsert(req, rule))
		},
		rules.LayoutCounter: func(c *Conn, req *request, rule *rules.Rule) error {
			return c.answerRefusal(req, c.layoutInsert(req, rule))
		},
		rules.LayoutSlots: func(c *Conn, req *request, rule *rules.Rule) error {
			return c.answerRefusal(req, c.layoutInsert(req, rule))
		},
	}},
	"delete": {retryable: true, by: map[string]handler{
		rules.LayoutEvents: func(c *Conn, req *request, rule *rules.Rule) error {
			return c.answerRefusal(req, c.rewriteDelete(req, rule))
		},
	}},
	"find":          {by: reads},
	"aggregate":     {by: reads},
	"count":         {by: reads},
	"distinct":      {by: map[string]handler{rules.LayoutEvents: eventsRead}},
	"explain":       {by: map[string]handler{rules.LayoutEvents: eventsRead}},
	"getMore":       {by: map[string]handler{anyLayout: (*Conn).rewriteGetMore}},
	"killCursors":   {by: map[string]handler{anyLayout: (*Conn).rewriteKillCursors}},
	"drop":          {by: map[string]handler{anyLayout: serveDrop}},
	"collMod":       {unpartitioned: true, by: map[string]handler{rules.LayoutEvents: serveCollMod}},
	"collStats":     {unpartitioned: true, by: map[string]handler{rules.LayoutEvents: plan(admin.CollStats)}},
	"create":        {unpartitioned: true, by: map[string]handler{rules.LayoutEvents: serveCreate}},
	"createIndexes": {unpartitioned: true, by: map[string]handler{rules.LayoutEvents: serveCreateIndexes}},
	"listIndexes":   {unpartitioned: true, by: map[string]handler{rules.LayoutEvents: withOwnIndex(admin.ListIndexes)}},
	"dropIndexes":   {unpartitioned: true, by: map[string]handler{rules.LayoutEvents: (*Conn).rewriteDropIndexes}},
	"update": {retryable: true, unpartitioned: true, by: map[string]handler{
		rules.LayoutEvents: func(c *Conn, req *request, rule *rules.Rule) error {
			return c.answerRefusal(req, c.rewriteUpdate(req, rule))
		},
	}},
	"findAndModify": findAndModify,
	"findandmodify": findAndModify,
}

// findAndModify is the row of findAndModify, which old drivers spell
// findandmodify.
var findAndModify = commandSpec{retryable: true, unpartitioned: true, by: map[string]handler{
	rules.LayoutEvents: func(c *Conn, req *request, rule *rules.Rule) error {
		return c.answerRefusal(req, c.rewriteFindAndModify(req, rule))
	},
}}

// serveDrop drops a rule's collections; a created time-series
// collection's through the catalog.
func serveDrop(c *Conn, req *request, rule *rules.Rule) error {
	if rule.Declared != nil {
		return c.s.Cat.ServeDrop(c.catalogClient(req), rule)
	}
	return plan(admin.Drop)(c, req, rule)
}

// serveCreate answers a create of a rule's namespace.
func serveCreate(c *Conn, req *request, rule *rules.Rule) error {
	if rule.Declared != nil {
		return c.s.Cat.ServeCreateOfRule(c.catalogClient(req), rule)
	}
	return c.rewriteCreate(req, rule)
}

// handlerFor is how rule's layout serves the command name, or nil.
func handlerFor(name string, rule *rules.Rule) handler {
	spec, ok := commands[name]
	if !ok {
		return nil
	}
	if h := spec.by[anyLayout]; h != nil {
		return h
	}
	return spec.by[rule.Layout]
}

// commandNames lists the registry's commands (the telemetry's labels).
func commandNames() []string {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	return names
}

// serveCreateIndexes creates indexes on a rule's buckets; on a created
// time-series collection, an index on a measurement it keeps no
// summaries of first makes its catalog entry keep them
// (catalog.AddAggregates).
func serveCreateIndexes(c *Conn, req *request, rule *rules.Rule) error {
	if fields := admin.NewMeasurements(req.msg.Body, rule); len(fields) > 0 {
		r, err := c.s.Cat.AddAggregates(rule, fields)
		if err != nil {
			return c.replyRewriteError(req, err)
		}
		rule = r
	}
	return withOwnIndex(admin.CreateIndexes)(c, req, rule)
}

// serveCollMod changes a created time-series collection (the catalog's).
func serveCollMod(c *Conn, req *request, rule *rules.Rule) error {
	return c.s.Cat.ServeCollMod(c.catalogClient(req), rule)
}

// NewEngine is the engine of a proxy whose connections this package
// serves (NewConn): its telemetry counts the commands of this registry.
func NewEngine(opts Options) (*engine.Engine, error) { return engine.New(opts, commandNames()) }

// Options configures a proxy (engine.Options).
type Options = engine.Options

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
	if req.name == "aggregate" && crossref.IsJoinStage(what) {
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
