package handler

import (
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/proxy/tier"
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/fanout"
	"github.com/tsproxy/tsproxy/rewrite/insert"
	"github.com/tsproxy/tsproxy/rewrite/layout"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rules"
)

// rewriteInsert stores the events of an insert as buckets (rewrite/insert),
// per partition for a partitioned rule (rewrite/fanout), then counts
// them into the rule's rollups. Each part prepares its events (validation,
// stored forms, grouping) before locking, so that inserts into the same
// series overlap that work with each other's upstream round trips, then
// runs under the locks of its (series, window) keys, which are held until
// the client has its reply: a reply that could not be delivered, or an
// outcome not known, makes the proxy forget those keys' fills.
//
// An unacknowledged insert (moreToCome) is run acknowledged upstream all
// the same, without answering the client: the proxy needs the replies to
// keep its fills exact and to retry duplicate keys.
func (c *Conn) rewriteInsert(req *request, rule *rules.Rule) error {
	if staged, _, err := c.stagedRule(rule); err != nil {
		return err
	} else if staged {
		return c.stagedInsert(req, rule)
	}
	caps, err := c.startWrite(rule)
	if err != nil {
		return err
	}
	if err := c.stopIDIndex(rule); err != nil {
		return c.refuseBeforeWrite(req, rule, err, c.replyRewriteError)
	}
	cmd := commandOf(req)
	held := c.heldLocks()
	defer held.ReleaseAll()
	part := func(r *rules.Rule, cmd rewrite.Command, indexes []int) rewrite.Plan {
		prepared, err := insert.Prepare(cmd, r, bson.NewObjectID)
		if err != nil {
			// As MongoDB answers a document it cannot take.
			return rewrite.Fail(mongoerr.Errorf(mongoerr.FailedToParse, "%s", err.Error()))
		}
		locked := held.Lock(r.BucketNamespace(), prepared.Keys())
		return insert.Plan(cmd, prepared, insert.Env{Caps: caps, NewObjectID: bson.NewObjectID, Fills: locked, Check: c.keysToCheck(req, rule, caps, locked), StmtIDs: indexes})
	}
	var p rewrite.Plan
	if rule.Partitioned() {
		parts, ordered := fanout.SplitInsert(cmd, rule, time.Now().UnixMilli())
		for _, pt := range parts {
			c.ensureBucketIndex(fanout.Rule(rule, pt.Collection))
		}
		p = fanout.Insert(parts, ordered, rule, part)
	} else {
		c.ensureBucketIndex(rule)
		p = part(rule, cmd, nil)
	}
	c.ensureLifecycle(rule)
	res, err := c.runPlan(req, rule, routeRewrite, p)
	if err == nil && mongoerr.IsOK(res.Reply) {
		err = c.maintainRollups(rule, cmd, res.Reply)
	}
	if err == nil {
		err = c.answer(req, rule, res)
	}
	if err != nil {
		held.ForgetAll()
	}
	return err
}

func (c *Conn) stagedRule(rule *rules.Rule) (bool, caps.Upstream, error) {
	caps, err := c.upstreamCaps()
	if err != nil {
		return false, caps, err
	}
	return rule.Staged(caps.StagesEvents()), caps, nil
}

// stagedInsert stores an insert's events in the rule's staging tier: no
// key lock, no fills, no update, and no writer lease. On an upstream
// whose rename changes only its catalog (FerretDB) the proxy inserts
// into staging collections of its own (stage.Stager), which only it
// freezes while it runs, holding its own inserts off: another proxy's
// insert that looked a staging collection up before a merge renamed it
// would commit into the renamed collection after the merge read it, and
// be lost (TestStageThreeProxies found 51 of 22,926 events so on the
// stock ferretdb command, when the proxies shared staging collections).
// Before its first insert into a rule, and then every half lease, it
// announces that it runs (lease.Presence): the holder of the rule's
// writer lease takes its collections over once that lapsed.
func (c *Conn) stagedInsert(req *request, rule *rules.Rule) error {
	caps, err := c.upstreamCaps()
	if err != nil {
		return err
	}
	// Before the announcement: a rule's first Stager makes its format
	// record before it leaves any trace of staging it.
	format := c.s.Tier().StagingFormat(c.up, rule)
	if err := c.s.Tier().AnnounceStaging(c, rule, caps); err != nil {
		return err
	}
	cmd := commandOf(req)
	identity, err := c.identity()
	if err != nil {
		return err
	}
	prepared, err := prepareStaged(cmd, rule)
	c.ensureLifecycle(rule)
	if err == nil {
		// Backpressure: wait for room in staging (before the insert holds
		// off the freeze that makes it).
		if _, full := c.s.Merges.Admit(rule, waitDeadline(req, stagedWait)); full != nil {
			code := mongoerr.MaxTimeMSExpired
			if full == tier.ErrShuttingDown {
				code = mongoerr.InterruptedAtShutdown
			}
			return c.replyError(req, code, full.Error())
		}
	}
	// Held from the generation read to the reply: a freeze of this
	// proxy's collections (which moves it on) waits for it.
	inflight := c.s.Merges.Inserts(rule.Namespace)
	inflight.RLock()
	var p rewrite.Plan
	// An upstream that keeps no session state (no stmtIds: FerretDB)
	// takes concurrent clients' staged inserts as one.
	env := stage.InsertEnv{Identity: identity, NewObjectID: bson.NewObjectID,
		Combinable: !caps.StmtIDs, Stager: c.s.Tier().Stager(rule, caps), Retry: req.retry, Format: format}
	if rule.Layout == rules.LayoutSlots {
		env.Stamp = c.s.Tier().Stamp // the last write of a slot wins
	}
	planned := err == nil
	if planned {
		p = stage.Insert(cmd, prepared, env)
	} else {
		p = rewrite.Fail(mongoerr.Errorf(mongoerr.FailedToParse, "%s", err.Error()))
	}
	res, err := c.runPlan(req, rule, routeRewrite, p)
	if err == nil && planned && c.s.Tier().MendOrphanedStaging(c, rule, caps, res.Reply, inflight) {
		env.Stager = c.s.Tier().Stager(rule, caps)
		res, err = c.runPlan(req, rule, routeRewrite, stage.Insert(cmd, prepared, env))
		if err == nil {
			c.s.Tier().LogOrphanedIndex(c, rule, res.Reply)
		}
	}
	if err == nil && mongoerr.IsOK(res.Reply) {
		n, _ := bson.Raw(res.Reply).Lookup("n").AsInt64OK()
		// Its rollups count these events when they are merged
		// (merge.Merge), not here. Counted before the insert lets a
		// freeze go: a count after it (once the client had its reply)
		// could land after a freeze that took the events and reset the
		// backlog, and leave it counting events nothing staged, which
		// no freeze then reset: every later insert waited for room.
		c.s.Merges.Staged(rule, n)
	}
	inflight.RUnlock()
	if err == nil {
		err = c.answer(req, rule, res)
	}
	return err
}

// prepareStaged validates and prepares the events of an insert into a
// staged rule, with its layout's checks.
func prepareStaged(cmd rewrite.Command, rule *rules.Rule) (*insert.Prepared, error) {
	if rule.Layout != rules.LayoutEvents {
		return layout.PrepareStaged(cmd, rule, bson.NewObjectID)
	}
	return insert.Prepare(cmd, rule, bson.NewObjectID)
}

// stagedWait is how long a staged insert without maxTimeMS waits for
// room in staging (rules.Rule.MaxStaged) before it fails.
const stagedWait = time.Minute

// waitDeadline is when req stops waiting (for room in staging, for a
// writer lease): after its maxTimeMS when it has one above zero, else
// after fallback.
func waitDeadline(req *request, fallback time.Duration) time.Time {
	if ms, ok := bson.Raw(req.msg.Body).Lookup("maxTimeMS").AsInt64OK(); ok && ms > 0 {
		return time.Now().Add(time.Duration(ms) * time.Millisecond)
	}
	return time.Now().Add(fallback)
}
