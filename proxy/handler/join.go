package handler

import (
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/crossref"
	"github.com/tsproxy/tsproxy/rewrite/fanout"
	"github.com/tsproxy/tsproxy/rewrite/read"
	"github.com/tsproxy/tsproxy/rewrite/summary"
	"github.com/tsproxy/tsproxy/rules"
)

// joinedRules are the rules whose namespaces an aggregate's join stages
// name, at any depth ($lookup and $unionWith pipelines, $facet).
func (c *Conn) joinedRules(req *request) []*rules.Rule {
	arr, ok := bson.Raw(req.msg.Body).Lookup("pipeline").ArrayOK()
	if !ok {
		return nil
	}
	return crossref.JoinedRules(c.rules, req.db, arr)
}

// serveJoin runs an aggregate on a plain collection that joins bucketed
// namespaces (read.JoinAggregate): each joined namespace is authorized
// as a find on it, as the server authorizes a $lookup's "from", and its
// staged events are merged first, as before any read of its events.
func (c *Conn) serveJoin(req *request, joined []*rules.Rule) error {
	if err := c.ensureUpstream(); err != nil {
		return c.replyUpstreamDown(req, err)
	}
	for _, rule := range joined {
		c.s.NoteServed(rule)
		if err := c.gate(req, rule); err != nil {
			return err
		}
		if err := c.settleStaged(req, rule); err != nil {
			return err
		}
	}
	caps, err := c.upstreamCaps()
	if err != nil {
		return err
	}
	optsOf := map[*rules.Rule]read.Options{}
	for _, rule := range joined {
		optsOf[rule] = c.readOptions(rule, caps)
	}
	bucketed := func(db, coll string, find []byte) rewrite.Plan {
		rule := c.rules.Lookup(db, coll)
		if rule == nil {
			return nil
		}
		opts, ok := optsOf[rule]
		if !ok {
			// Not found by joinedRules (a nesting it does not follow):
			// still read from buckets, never as the empty collection.
			opts = read.Options{Caps: caps, AggregateMemory: c.s.Opts.AggregateMemory, IDIndex: c.s.IdIndexes, Bucketed: c.isBucketedNS}
		}
		single := func(r *rules.Rule, body []byte) rewrite.Plan {
			return summary.Plan(body, r, opts, func() rewrite.Plan { return read.Plan(body, r, opts, newCursorID) })
		}
		return fanout.Read(find, rule, opts, newCursorID, single)
	}
	p := read.JoinAggregate(req.msg.Body, req.db, read.JoinOptions{
		Bucketed: bucketed, IsBucketed: c.isBucketedNS, MaxMemory: c.s.Opts.AggregateMemory, MaxUpdates: caps.MaxUpdateStatements,
	}, newCursorID)
	return c.servePlan(req, joined[0], routeRewrite, p)
}

// readOptions are the options of a read of rule's events.
func (c *Conn) readOptions(rule *rules.Rule, caps caps.Upstream) read.Options {
	return read.Options{Caps: caps, IDLookups: c.idLookupCost(rule, caps), IDIndex: c.s.IdIndexes, AggregateMemory: c.s.Opts.AggregateMemory,
		Bucketed: c.isBucketedNS}
}

// isBucketedNS says whether db.coll is a rule's namespace, buckets or
// rollups.
func (c *Conn) isBucketedNS(db, coll string) bool {
	return c.rules.Lookup(db, coll) != nil || c.rules.ByBucketCollection(db, coll) != nil || c.rules.ByRollupCollection(db, coll) != nil
}
