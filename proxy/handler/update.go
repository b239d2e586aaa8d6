package handler

import (
	"crypto/sha256"
	"encoding/hex"
	"math/rand/v2"
	"strconv"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/deletes"
	"github.com/tsproxy/tsproxy/rewrite/updates"
	"github.com/tsproxy/tsproxy/rules"
)

// rewriteUpdate serves update on a bucketed namespace of the events
// layout (rewrite/updates): as a delete, it waits for the writer lease,
// and its plan locks the buckets it rewrites (and those its moved events
// go to) as inserts lock them, through heldLocks. Staging was settled
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
	held := &heldLocks{c: c}
	defer held.releaseAll()
	env := updates.Env{
		Env:         deletes.Env{Caps: caps, Lock: held.locker(rule), IDIndex: c.s.IdIndexes},
		NewObjectID: bson.NewObjectID,
		Now:         time.Now,
		Sweep:       rand.IntN(journalSweepEvery) == 0,
	}
	if req.retry != nil && req.retry.Retryable {
		identity, err := c.identity()
		if err != nil {
			return err
		}
		env.RetryKey = journalKey(req.retry.Key.OwnedBy(identity))
	}
	return c.servePlan(req, rule, routeRewrite, build(commandOf(req), rule, env))
}

// journalSweepEvery: about one update in this many also sweeps the
// update journal's old records.
const journalSweepEvery = 64

// journalKey names a retryable write in the update journal: a digest of
// its session and owner (which the journal need not hold) and its
// txnNumber.
func journalKey(k rewrite.RetryKey) string {
	sum := sha256.Sum256([]byte(k.Session))
	return hex.EncodeToString(sum[:12]) + "-" + strconv.FormatInt(k.TxnNumber, 10)
}
