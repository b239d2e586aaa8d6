package handler

import (
	"time"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/insert"
	"github.com/tsproxy/tsproxy/rewrite/layout"
	"github.com/tsproxy/tsproxy/rules"
)

// layoutInsert counts (counter) or stores (slots) the events of an insert
// (rewrite/layout), through the staging tier where the rule stages
// (FerretDB: stagedInsert, no lease), else under the proxy's locks of
// their keys: on an upstream
// whose updates are not isolated (FerretDB), two $inc upserts of one
// bucket at once lose an increment, or both try to create it and one
// fails on its _id; and slots writes read the buckets they touch first.
func (c *Conn) layoutInsert(req *request, rule *rules.Rule) error {
	if staged, _, err := c.stagedRule(rule); err != nil {
		return err
	} else if staged {
		return c.stagedInsert(req, rule)
	}
	caps, err := c.startWrite(rule)
	if err != nil {
		return err
	}
	c.ensureBucketIndex(rule)
	cmd := commandOf(req)
	keys, err := insert.Keys(cmd, rule)
	if err != nil {
		return c.refuseBeforeWrite(req, rule, err, c.replyRewriteError)
	}
	locked := c.s.Fills.Lock(rule.BucketNamespace(), keys)
	c.s.Tier().Directories().Wrote(rule.BucketNamespace())
	defer locked.Unlock()
	// A write id this proxy has not seen may also be a retry of a write
	// that went through an earlier term of the rule's writer lease.
	attempt := func(id string, now time.Time) (bool, time.Duration) {
		check, late := c.s.Writes.Attempt(id, now)
		return check || c.s.EarlierTermRetryPossible(rule, caps, time.Time{}), late
	}
	env := layout.WriteEnv{Caps: caps, Now: time.Now(), Attempt: attempt,
		Shells: func(ks []bucket.Key) []bucket.Key { return c.s.Shells.Claim(rule.BucketNamespace(), ks) }}
	return c.servePlan(req, rule, routeRewrite, layout.InsertPlan(cmd, rule, keys, env))
}
