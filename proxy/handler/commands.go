package handler

import (
	"github.com/tsproxy/tsproxy/proxy/engine"
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/admin"
	"github.com/tsproxy/tsproxy/rewrite/fanout"
	"github.com/tsproxy/tsproxy/rewrite/layout"
	"github.com/tsproxy/tsproxy/rules"
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
	"createIndexes": {unpartitioned: true, by: map[string]handler{rules.LayoutEvents: withOwnIndex(admin.CreateIndexes)}},
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

// serveCollMod changes a created time-series collection (the catalog's).
func serveCollMod(c *Conn, req *request, rule *rules.Rule) error {
	return c.s.Cat.ServeCollMod(c.catalogClient(req), rule)
}

// NewEngine is the engine of a proxy whose connections this package
// serves (NewConn): its telemetry counts the commands of this registry.
func NewEngine(opts Options) (*engine.Engine, error) { return engine.New(opts, commandNames()) }

// Options configures a proxy (engine.Options).
type Options = engine.Options
