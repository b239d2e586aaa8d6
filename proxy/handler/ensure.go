package handler

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/tsproxy/tsproxy/proxy/exec"
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/caps"
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

// indexRetry is how long after a failed step the proxy tries again.
const indexRetry = time.Minute

// onceSteps remembers, per step and namespace, that a step was done, or
// when it last failed.
type onceSteps struct {
	mu   sync.Mutex
	last map[string]time.Time // key: kind NUL namespace; zero time: done
}

func newOnceSteps() *onceSteps { return &onceSteps{last: map[string]time.Time{}} }

// begin says whether the step should run now (and marks it attempted).
func (o *onceSteps) begin(kind, ns string) bool {
	key := kind + "\x00" + ns
	o.mu.Lock()
	defer o.mu.Unlock()
	last, seen := o.last[key]
	if seen && (last.IsZero() || time.Since(last) < indexRetry) {
		return false
	}
	o.last[key] = time.Now()
	return true
}

func (o *onceSteps) done(kind, ns string) {
	o.mu.Lock()
	o.last[kind+"\x00"+ns] = time.Time{}
	o.mu.Unlock()
}

// forget makes every step of ns run again (its collection was dropped).
func (o *onceSteps) forget(ns string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for key := range o.last {
		if strings.HasSuffix(key, "\x00"+ns) {
			delete(o.last, key)
		}
	}
}

// forgetNamespace forgets everything the proxy keeps of a namespace that
// was dropped or emptied: its one-time steps, its open-bucket fills and
// the shells it preallocated.
func (s *Engine) forgetNamespace(ns string) {
	s.once.forget(ns)
	s.fills.Forget(ns)
	s.tier.Directories().Wrote(ns)
	s.shells.forget(ns)
	s.idIndexOff.Delete(ns)
}

// ensureBucketIndex creates the rule's bucket index the first time the
// proxy writes its namespace.
func (c *Conn) ensureBucketIndex(rule *rules.Rule) {
	c.ensureIndex(rule, rule.BucketCollection, bucketIndexFailure)
}

// ensureIndex runs the index step of db.coll (a collection of rule's
// buckets or rollups).
func (c *Conn) ensureIndex(rule *rules.Rule, coll, failure string) {
	caps, err := c.upstreamCaps()
	if err != nil {
		c.log.Error(failure, "rule", rule.Namespace, "collection", rule.DB+"."+coll, "err", err.Error())
		return
	}
	_ = c.s.ensureIndexOn(c, rule, coll, failure, caps)
}

// ensureIndexOn is ensureIndex on any step runner (a background merge's
// connection); the error is logged, and returned for a caller that needs
// the index. On an upstream that reads by no such index
// (caps.UnusedIndexes) the step only creates the collection, which the
// index's create would have, and its later steps (IndexIDs) need.
func (s *Engine) ensureIndexOn(r exec.Runner, rule *rules.Rule, coll, failure string, caps caps.Upstream) error {
	ns := rule.DB + "." + coll
	if !s.once.begin("index", ns) {
		return nil
	}
	cmd := bucket.IndexCommand(rule.DB, coll)
	if caps.UnusedIndexes {
		cmd = bucket.CreateCommand(rule.DB, coll)
	}
	res, err := exec.Drive(r, rewrite.Passthrough(cmd, nil))
	if err == nil {
		err = mongoerr.ReplyError(res.Reply)
		if caps.UnusedIndexes && mongoerr.CodeOf(err) == mongoerr.NamespaceExists {
			err = nil
		}
	}
	if err == nil && s.opts.IndexIDs != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err = s.opts.IndexIDs(ctx, rule.DB, coll)
		cancel()
	}
	if err != nil {
		s.log.Error(failure, "rule", rule.Namespace, "collection", ns, "err", err.Error())
		return err
	}
	s.once.done("index", ns)
	s.log.Info("index ensured", "rule", rule.Namespace, "collection", ns, "proxy index", !caps.UnusedIndexes)
	return nil
}

// bucketIndexFailure is what a missing bucket index is logged as.
const bucketIndexFailure = "could not create the bucket index {meta: 1, start: 1}; writes are stored, reads will be slow. Grant createIndex on the bucket collection, or create the index yourself"

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
	if !c.s.once.begin("shard", ns) {
		return
	}
	hello, err := exec.Drive(c, rewrite.Passthrough(rollup.HelloCommand(), nil))
	if err != nil {
		c.log.Error("shardKey: hello failed; will retry", "rule", rule.Namespace, "err", err.Error())
		return
	}
	if !rollup.IsMongos(hello.Reply) {
		c.log.Info("shardKey: the upstream is not a mongos; the bucket collection stays unsharded", "rule", rule.Namespace, "collection", ns)
		c.s.once.done("shard", ns)
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
	c.s.once.done("shard", ns)
}
