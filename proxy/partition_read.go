package proxy

import (
	"fmt"
	"slices"

	"github.com/tsproxy/tsproxy/rewrite/partition"
	"github.com/tsproxy/tsproxy/rewrite/read"
	"github.com/tsproxy/tsproxy/rewrite/summary"

	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/cursor"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rules"
)

// Reads on a partitioned rule. The partitions a read needs are the
// existing ones (listCollections) that overlap its time bounds. With at
// most one, the read is the ordinary bucketed read of that partition, with
// every plan (point, scan, summaries, explain) and upstream cursor. Across
// several, each partition runs the ordinary read as a sub-command and the
// proxy combines them (rewrite/partition_read.go): finds merged into a
// proxy-held cursor, counts summed, distinct values united, aggregates
// answered from the summaries of all partitions' buckets; other shapes are
// refused with an error naming the rule.

// rewriteReadPartitioned serves find, aggregate, count, distinct and
// explain on a partitioned rule.
func (c *conn) rewriteReadPartitioned(req *request, rule *rules.Rule) error {
	all, err := listPartitions(connCommander{c}, rule)
	if err != nil {
		return err
	}
	from, to := partition.PartitionTimeRange(req.msg.Body, rule)
	var parts []partColl
	for _, p := range all {
		if partition.PartitionOverlaps(rule, p.start, from, to) {
			parts = append(parts, p)
		}
	}
	if len(parts) <= 1 {
		coll := rule.BucketCollection // never written: an empty read
		if len(parts) == 1 {
			coll = parts[0].coll
		}
		return c.rewriteRead(req, partitionRule(rule, coll))
	}
	switch req.name {
	case "find":
		return c.findPartitioned(req, rule, parts)
	case "count":
		return c.countPartitioned(req, rule, parts)
	case "distinct":
		return c.distinctPartitioned(req, rule, parts)
	case "aggregate":
		caps, err := c.upstreamCaps()
		if err != nil {
			return err
		}
		if done, err := c.summariesPartitioned(req, rule, parts, caps); done {
			return err
		}
		if g, ok := partition.PlanPartitionedGroupCount(req.msg.Body, rule); ok {
			return c.groupCountPartitioned(req, rule, parts, g)
		}
		return c.replyRewriteError(req, partition.PartitionReadRefusal(rule, "an aggregate not answered from the bucket summaries", len(parts)))
	}
	return c.replyRewriteError(req, partition.PartitionReadRefusal(rule, req.name, len(parts)))
}

// subRead runs body as the ordinary read of one partition and returns its
// reply (an error reply included).
func (c *conn) subRead(req *request, rule *rules.Rule, coll string, body []byte, read func(*request, *rules.Rule) error) ([]byte, error) {
	var out []byte
	sub := *req
	sub.msg.Body = body
	sub.msg.Sequences = nil
	sub.sink = &out
	if err := read(&sub, partitionRule(rule, coll)); err != nil {
		return nil, err
	}
	if out == nil {
		return nil, fmt.Errorf("tsproxy rule %s: partColl %s: no reply", rule.Namespace, coll)
	}
	return out, nil
}

// findPartitioned merges a find over several partitions.
func (c *conn) findPartitioned(req *request, rule *rules.Rule, parts []partColl) error {
	f, err := partition.PlanPartitionedFind(req.msg.Body, rule)
	if err != nil {
		return c.replyRewriteError(req, err)
	}
	led, desc := f.TimeLed(rule)
	if led && desc {
		parts = slices.Clone(parts)
		slices.Reverse(parts)
	}
	for i, p := range parts {
		if led && i > 0 && f.Enough(rule, nextBound(rule, parts[i], desc)) {
			break // the partitions left sort after the limit
		}
		reply, err := c.subRead(req, rule, p.coll, f.Sub, c.rewriteRead)
		for err == nil {
			docs, id, derr := cursor.Docs(reply)
			if derr != nil {
				return c.replyBody(req, reply) // the partColl's error reply
			}
			if aerr := f.Add(docs); aerr != nil {
				if id != 0 {
					c.killPartitionCursor(rule, p.coll, id)
				}
				return c.replyRewriteError(req, aerr)
			}
			if id == 0 {
				break
			}
			gm, merr := bson.Marshal(bson.D{{Key: "getMore", Value: id}, {Key: "collection", Value: rule.Collection}, {Key: "$db", Value: rule.DB}})
			if merr != nil {
				return merr
			}
			reply, err = c.subRead(req, rule, p.coll, gm, c.rewriteGetMore)
		}
		if err != nil {
			return err
		}
	}
	if err := f.Finish(); err != nil {
		return c.replyRewriteError(req, err)
	}
	id := newCursorID()
	reply, more := f.Batch(id, -1)
	if more && !c.registerCursor(req, id, &cursorEntry{rule: rule, cursor: partition.NewMergedCursor(id, f)}) {
		return c.replyTooManyCursors(req, rule)
	}
	return c.replyBody(req, reply)
}

// nextBound is what partition.PartitionedFind.Enough compares with for the
// partition p about to be read: its start (ascending), or the end of its
// last window (descending).
func nextBound(rule *rules.Rule, p partColl, desc bool) int64 {
	if !desc {
		return p.start
	}
	end := rules.PartitionEnd(rule.PartitionBy, p.start)
	return rule.WindowStartMillis(end-1) + rule.SpanMillis()
}

// killPartitionCursor ends a sub-read's cursor the proxy stops reading.
func (c *conn) killPartitionCursor(rule *rules.Rule, coll string, id int64) {
	if e := c.s.cursors.get(id); e != nil {
		c.s.cursors.forget(id)
		_ = c.releaseEntry(e)
		return
	}
	c.killUpstreamCursor(partitionRule(rule, coll), id)
}

// countPartitioned sums a count over several partitions.
func (c *conn) countPartitioned(req *request, rule *rules.Rule, parts []partColl) error {
	pc, err := partition.PlanPartitionedCount(req.msg.Body, rule)
	if err != nil {
		return c.replyRewriteError(req, err)
	}
	for _, p := range parts {
		reply, err := c.subRead(req, rule, p.coll, pc.Sub, c.rewriteRead)
		if err != nil {
			return err
		}
		if bad := pc.Add(reply); bad != nil {
			return c.replyBody(req, bad)
		}
	}
	return c.replyBody(req, pc.Result())
}

// groupCountPartitioned serves countDocuments over several partitions.
func (c *conn) groupCountPartitioned(req *request, rule *rules.Rule, parts []partColl, g *partition.PartitionedGroupCount) error {
	for _, p := range parts {
		reply, err := c.subRead(req, rule, p.coll, g.Count.Sub, c.rewriteRead)
		if err != nil {
			return err
		}
		if bad := g.Count.Add(reply); bad != nil {
			return c.replyBody(req, bad)
		}
	}
	return c.replyBody(req, g.Result())
}

// distinctPartitioned unites distinct over several partitions.
func (c *conn) distinctPartitioned(req *request, rule *rules.Rule, parts []partColl) error {
	var d partition.PartitionedDistinct
	for _, p := range parts {
		reply, err := c.subRead(req, rule, p.coll, req.msg.Body, c.rewriteRead)
		if err != nil {
			return err
		}
		if bad := d.Add(reply); bad != nil {
			return c.replyBody(req, bad)
		}
	}
	return c.replyBody(req, d.Result())
}

// summariesPartitioned answers an aggregate from the bucket summaries of
// every partition: one plan (of the first) is fed the buckets of all, each
// partition's own plan giving the commands that read them. done is false
// when the aggregate is not of that shape.
func (c *conn) summariesPartitioned(req *request, rule *rules.Rule, parts []partColl, caps caps.Upstream) (done bool, err error) {
	opts := read.ReadOptions{Caps: caps}
	all, ok := summary.PlanSummary(req.msg.Body, partitionRule(rule, parts[0].coll), opts)
	if !ok {
		return false, nil
	}
	for _, p := range parts {
		own, ok := summary.PlanSummary(req.msg.Body, partitionRule(rule, p.coll), opts)
		if !ok {
			return false, nil
		}
		for next := own.Command; next != nil; {
			reply, err := c.upCommand(next)
			if err != nil {
				return true, err
			}
			if _, err := all.Feed(reply); err != nil {
				return true, c.replyRewriteError(req, err)
			}
			if next, err = own.Feed(reply); err != nil {
				return true, c.replyRewriteError(req, err)
			}
		}
	}
	out, ok, err := all.Result()
	switch {
	case err != nil:
		return true, c.replyRewriteError(req, err)
	case !ok:
		return false, nil
	}
	return true, c.replyBody(req, out)
}
