package proxy

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/tsproxy/tsproxy/rewrite/rollup"

	"github.com/tsproxy/tsproxy/rewrite/bucket"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
)

// Rollups are maintained after the bucket writes of an insert were
// acknowledged by the upstream, on the client's connection, before the
// client gets its reply: only events the reply reports written are
// counted. A rollup write is never retried, so a rollup never counts an
// event twice; if it fails, or the proxy dies between the bucket write and
// the rollup write, those events are missing from the rollup (at most once)
// while the events themselves are stored. Such failures are logged with the
// rule and the number of events not counted, and do not fail the insert:
// reporting an error for stored events would make the client write them
// again.

// maintainRollups runs the rollup upserts of an insert whose client reply
// is reply. Errors are logged, never returned (see above).
func (c *conn) maintainRollups(rule *rules.Rule, cmd rewrite.Command, reply []byte) {
	if len(rule.Rollups) == 0 || c.up == nil {
		return
	}
	caps, err := c.upstreamCaps()
	if err != nil {
		c.log.Error("rollups not updated: upstream capabilities unknown", "rule", rule.Namespace, "err", err.Error())
		return
	}
	plan, err := rollup.Rollups(cmd, rule, reply, rollup.RollupOptions{MaxStatements: caps.MaxUpdateStatements, StmtIDs: caps.StmtIDs})
	if err != nil || plan == nil {
		if err != nil {
			c.log.Error("rollups not updated", "rule", rule.Namespace, "err", err.Error())
		}
		return
	}
	if caps.SingleWriter {
		// Inserts into different windows of one series hold different
		// series locks but $inc the same coarser rollup documents; on an
		// upstream whose updates are not isolated, one would be lost.
		mu := c.s.life.rollupWriter(rule.Namespace)
		mu.Lock()
		defer mu.Unlock()
	}
	for i, cmd := range plan.Commands {
		if err := c.runRollupCommand(cmd, caps.MaxUpdateStatements > 0); err != nil {
			c.log.Error("rollup write failed; the events are stored but these rollup documents lag (rebuild them from the buckets if needed)",
				"rule", rule.Namespace, "events", plan.Events, "command", i+1, "of", len(plan.Commands), "err", err.Error())
			if c.up == nil {
				return // the connection is gone; the other commands would fail too
			}
		}
	}
}

// runRollupCommand sends one rollup update and checks its reply. On a
// transport error the upstream connection is dropped, so the next request
// dials a fresh one instead of reading this command's late reply.
func (c *conn) runRollupCommand(cmd []byte, slotted bool) error {
	body, err := c.roundTripInSlot(c.commandFrame(cmd), slotted)
	if err != nil {
		c.up.Close()
		c.up = nil
		c.upRef.Store(nil)
		return fmt.Errorf("rollup update: %w", err)
	}
	return rollup.RollupReplyError(cmd, body)
}

// lifecycleState remembers which rules' one-time lifecycle steps ran.
type lifecycleState struct {
	mu      sync.Mutex
	sharded map[string]time.Time   // bucket namespace -> last attempt; zero when done
	rollups map[string]time.Time   // rollup namespace -> last attempt; zero when done
	writers map[string]*sync.Mutex // rule namespace -> serializes its rollup writes
}

// rollupWriter is the mutex that serializes a rule's rollup writes.
func (l *lifecycleState) rollupWriter(ns string) *sync.Mutex {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := l.writers[ns]
	if m == nil {
		m = &sync.Mutex{}
		l.writers[ns] = m
	}
	return m
}

func newLifecycleState() *lifecycleState {
	return &lifecycleState{sharded: make(map[string]time.Time), rollups: make(map[string]time.Time), writers: make(map[string]*sync.Mutex)}
}

// ensureLifecycle runs the one-time steps of a rule before its first
// write: with shardKey, sharding its bucket collection on a mongos; with
// rollups, creating their collections and indexes.
func (c *conn) ensureLifecycle(rule *rules.Rule) {
	if rule.ShardKey {
		c.ensureSharded(rule)
	}
	for _, res := range rule.Rollups {
		c.ensureRollupCollection(rule, res)
	}
}

// begin reports whether a one-time step for ns should run now: not when
// it is done, nor within indexRetry of a failed attempt.
func (l *lifecycleState) begin(m map[string]time.Time, ns string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	last, seen := m[ns]
	if seen && (last.IsZero() || time.Since(last) < indexRetry) {
		return false
	}
	m[ns] = time.Now()
	return true
}

func (l *lifecycleState) done(m map[string]time.Time, ns string) {
	l.mu.Lock()
	m[ns] = time.Time{}
	l.mu.Unlock()
}

// ensureRollupCollection creates the {meta: 1, start: 1} index of a
// rollup collection (and so the collection), for reads by series and time
// range, and on the embedded upstream the _id index its upserts need (see
// Options.IndexIDs: without it each upsert scans the collection).
func (c *conn) ensureRollupCollection(rule *rules.Rule, res time.Duration) {
	l := c.s.life
	ns := rule.RollupNamespace(res)
	if !l.begin(l.rollups, ns) {
		return
	}
	reply, err := c.up.Command(bson.D{
		{Key: "createIndexes", Value: rule.RollupCollection(res)},
		{Key: "indexes", Value: bson.A{bson.D{
			{Key: "key", Value: bson.D{{Key: bucket.FieldMeta, Value: 1}, {Key: bucket.FieldStart, Value: 1}}},
			{Key: "name", Value: "meta_1_start_1"},
		}}},
		{Key: "$db", Value: rule.DB},
	})
	if err == nil {
		err = commandError(reply)
	}
	if err == nil && c.s.opts.IndexIDs != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err = c.s.opts.IndexIDs(ctx, rule.DB, rule.RollupCollection(res))
		cancel()
	}
	if err != nil {
		c.log.Error("could not index a rollup collection; rollups stay correct but slow", "rule", rule.Namespace, "collection", ns, "err", err.Error())
		return
	}
	l.done(l.rollups, ns)
}

// ensureSharded shards the bucket collection on {meta: 1, start: 1} when
// the upstream is a mongos; on any other upstream it logs once and goes on
// (there is nothing to shard). Failures are logged and retried after
// indexRetry, on the next insert (another client may hold the privilege).
func (c *conn) ensureSharded(rule *rules.Rule) {
	l := c.s.life
	ns := rule.BucketNamespace()
	if !l.begin(l.sharded, ns) {
		return
	}
	done := func() { l.done(l.sharded, ns) }
	hello, err := c.up.Command(bson.D{{Key: "hello", Value: 1}, {Key: "$db", Value: "admin"}})
	if err != nil {
		c.log.Error("shardKey: hello failed; will retry", "rule", rule.Namespace, "err", err.Error())
		return
	}
	if !rollup.IsMongos(hello) {
		c.log.Info("shardKey: the upstream is not a mongos; the bucket collection stays unsharded", "rule", rule.Namespace, "collection", ns)
		done()
		return
	}
	for _, cmd := range rollup.ShardCommands(rule) {
		reply, err := c.up.Command(cmd)
		if err == nil {
			err = commandError(reply)
		}
		if err != nil && cmd[0].Key == "shardCollection" {
			c.log.Error("shardKey: shardCollection failed; will retry", "rule", rule.Namespace, "collection", ns, "err", err.Error())
			return
		}
		// enableSharding fails harmlessly when already enabled (or not
		// needed, MongoDB 6.0+); shardCollection then says what is wrong.
	}
	c.log.Info("shardKey: bucket collection sharded on {meta: 1, start: 1}", "rule", rule.Namespace, "collection", ns)
	done()
}

// dropRollups drops the rollup collections of a rule whose namespace the
// app dropped: rollups of events that no longer exist would otherwise be
// added to by the events written next. A failure is logged; the drop of
// the events already succeeded.
func (c *conn) dropRollups(rule *rules.Rule) {
	if c.up == nil {
		return
	}
	l := c.s.life
	for _, res := range rule.Rollups {
		l.mu.Lock()
		delete(l.rollups, rule.RollupNamespace(res))
		l.mu.Unlock()
		reply, err := c.up.Command(bson.D{{Key: "drop", Value: rule.RollupCollection(res)}, {Key: "$db", Value: rule.DB}})
		if err == nil {
			err = commandError(reply)
		}
		if err != nil && !isCode(err, mongoerr.NamespaceNotFound) {
			c.log.Error("could not drop a rollup collection with its namespace; drop it yourself", "rule", rule.Namespace,
				"collection", rule.RollupNamespace(res), "err", err.Error())
		}
	}
}
