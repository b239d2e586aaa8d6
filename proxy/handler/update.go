package handler

import (
	"math/rand/v2"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/proxy/fills"
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/deletes"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/updates"
	"github.com/tsproxy/tsproxy/rules"
)

// rewriteUpdate serves update on a bucketed namespace of the events
// layout (rewrite/updates): as a delete, it waits for the writer lease,
// and its plan locks the buckets it rewrites (and those its moved events
// go to) as inserts lock them, through fills.Held. Staging was settled
// before (handleBucketed), so every matched event is in a bucket. An
// unacknowledged update (moreToCome) runs acknowledged upstream all the
// same, without answering the client.
func (c *Conn) rewriteUpdate(req *request, rule *rules.Rule) error {
	return c.serveUpdatePlan(req, rule, updates.Plan)
}

// rewriteFindAndModify serves findAndModify on a bucketed namespace of
// the events layout as an update of one event (updates.FindAndModify).
func (c *Conn) rewriteFindAndModify(req *request, rule *rules.Rule) error {
	return c.serveUpdatePlan(req, rule, updates.FindAndModify)
}

// serveUpdatePlan runs the plan build makes of an update or a
// findAndModify, under the writer lease and with the plan's locks held
// until it ends.
func (c *Conn) serveUpdatePlan(req *request, rule *rules.Rule, build func(rewrite.Command, *rules.Rule, updates.Env) rewrite.Plan) error {
	caps, err := c.startDelete(req, rule)
	if err != nil {
		return err
	}
	held := c.heldLocks()
	defer held.ReleaseAll()
	env := c.updateEnv(rule, caps, held)
	env.Sweep = rand.IntN(journalSweepEvery) == 0
	if req.retry != nil && req.retry.Retryable {
		identity, err := c.identity()
		if err != nil {
			return err
		}
		env.RetryKey = updates.JournalKey(req.retry.Key.OwnedBy(identity))
	}
	res, err := c.runPlan(req, rule, routeRewrite, build(commandOf(req), rule, env))
	if err != nil || !mongoerr.IsOK(res.Reply) || mongoerr.HasWriteErrors(res.Reply) {
		// It may have left a round pending: the next read looks.
		c.s.JournalSettled.Delete(rule.BucketNamespace())
	}
	if err != nil {
		return err
	}
	return c.answer(req, rule, res)
}

// journalSweepEvery: about one update in this many also sweeps the
// update journal's old records.
const journalSweepEvery = 64

// updateEnv is what an update plan on rule needs of the proxy, its locks
// taken through held.
func (c *Conn) updateEnv(rule *rules.Rule, caps caps.Upstream, held *fills.Held) updates.Env {
	return updates.Env{
		Env:         deletes.Env{Caps: caps, Lock: held.Locker(rule.BucketNamespace()), IDIndex: c.s.IdIndexes},
		NewObjectID: bson.NewObjectID,
		Now:         time.Now,
	}
}
