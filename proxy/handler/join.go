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

// isJoinStage says whether crossRefRule's stage is one the proxy runs
// itself when it names a bucketed namespace from a plain collection.
func isJoinStage(what string) bool {
	return what == "$lookup" || what == "$graphLookup" || what == "$unionWith"
}

// joinedRules are the rules whose namespaces an aggregate's join stages
// name, at any depth ($lookup and $unionWith pipelines, $facet).
func (c *Conn) joinedRules(req *request) []*rules.Rule {
	arr, ok := bson.Raw(req.msg.Body).Lookup("pipeline").ArrayOK()
	if !ok {
		return nil
	}
	var out []*rules.Rule
	seen := map[*rules.Rule]bool{}
	var walk func(p bson.RawArray, depth int)
	walk = func(p bson.RawArray, depth int) {
		if depth > crossref.MaxPipelineDepth {
			return
		}
		stages, _ := p.Values()
		for _, sv := range stages {
			stage, ok := sv.DocumentOK()
			if !ok {
				continue
			}
			elems, _ := stage.Elements()
			if len(elems) != 1 {
				continue
			}
			arg := elems[0].Value()
			var names []string
			var subs []bson.RawArray
			if s, ok := arg.StringValueOK(); ok && elems[0].Key() == "$unionWith" {
				names = append(names, s)
			}
			if d, ok := arg.DocumentOK(); ok {
				for _, k := range []string{"from", "coll"} {
					if s, ok := d.Lookup(k).StringValueOK(); ok {
						names = append(names, s)
					}
				}
				if sp, ok := d.Lookup("pipeline").ArrayOK(); ok {
					subs = append(subs, sp)
				}
				if elems[0].Key() == "$facet" {
					fe, _ := d.Elements()
					for _, f := range fe {
						if fp, ok := f.Value().ArrayOK(); ok {
							subs = append(subs, fp)
						}
					}
				}
			}
			for _, n := range names {
				if r := c.rules.Lookup(req.db, n); r != nil && !seen[r] {
					seen[r] = true
					out = append(out, r)
				}
			}
			for _, sp := range subs {
				walk(sp, depth+1)
			}
		}
	}
	walk(arr, 0)
	return out
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
