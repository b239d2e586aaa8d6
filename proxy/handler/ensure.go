package handler

import (
	"github.com/tsproxy/tsproxy/proxy/engine"
	"github.com/tsproxy/tsproxy/proxy/exec"
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/rollup"
	"github.com/tsproxy/tsproxy/rules"
)

// The one-time steps of a namespace before its first write: the bucket
// collection's {meta: 1, start: 1} index (and, on the embedded upstream,
// the _id index SQLite can use), a rollup collection's, sharding on a
// mongos. They run on the writing client's connection, so with its
// privileges; a failure is logged (the write is still correct, reads are
// slower) and retried after indexRetry, as the next client may hold the
// privilege the last one lacked.

// ensureBucketIndex creates the rule's bucket index the first time the
// proxy writes its namespace.
func (c *Conn) ensureBucketIndex(rule *rules.Rule) {
	c.ensureIndex(rule, rule.BucketCollection, engine.BucketIndexFailure)
}

// ensureIndex runs the index step of db.coll (a collection of rule's
// buckets or rollups).
func (c *Conn) ensureIndex(rule *rules.Rule, coll, failure string) {
	caps, err := c.upstreamCaps()
	if err != nil {
		c.log.Error(failure, "rule", rule.Namespace, "collection", rule.DB+"."+coll, "err", err.Error())
		return
	}
	_ = c.s.EnsureIndexOn(c, rule, coll, failure, caps)
}

// ensureLifecycle runs the one-time steps of a rule's lifecycle before
// its first write: with shardKey, sharding its bucket collection on a
// mongos; with rollups, their collections and indexes.
func (c *Conn) ensureLifecycle(rule *rules.Rule) {
	if rule.ShardKey {
		c.ensureSharded(rule)
	}
	for _, res := range rule.Rollups {
		c.ensureIndex(rule, rule.RollupCollection(res), "could not index a rollup collection; rollups stay correct but slow")
	}
}

// ensureSharded shards the bucket collection on {meta: 1, start: 1} when
// the upstream is a mongos; on any other upstream it logs once and goes on
// (there is nothing to shard).
func (c *Conn) ensureSharded(rule *rules.Rule) {
	ns := rule.BucketNamespace()
	if !c.s.Once.Begin("shard", ns) {
		return
	}
	hello, err := exec.Drive(c, rewrite.Passthrough(rollup.HelloCommand(), nil))
	if err != nil {
		c.log.Error("shardKey: hello failed; will retry", "rule", rule.Namespace, "err", err.Error())
		return
	}
	if !rollup.IsMongos(hello.Reply) {
		c.log.Info("shardKey: the upstream is not a mongos; the bucket collection stays unsharded", "rule", rule.Namespace, "collection", ns)
		c.s.Once.Done("shard", ns)
		return
	}
	for _, cmd := range rollup.ShardCommands(rule) {
		res, err := exec.Drive(c, rewrite.Passthrough(cmd.Body, nil))
		if err == nil && cmd.Required {
			err = mongoerr.ReplyError(res.Reply)
		}
		if err != nil {
			// enableSharding fails harmlessly when already enabled (or not
			// needed, MongoDB 6.0+); shardCollection says what is wrong.
			c.log.Error("shardKey: shardCollection failed; will retry", "rule", rule.Namespace, "collection", ns, "err", err.Error())
			return
		}
	}
	c.log.Info("shardKey: bucket collection sharded on {meta: 1, start: 1}", "rule", rule.Namespace, "collection", ns)
	c.s.Once.Done("shard", ns)
}
