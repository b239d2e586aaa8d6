package proxy

import (
	"fmt"
	"slices"
	"time"

	"github.com/tsproxy/tsproxy/rewrite/partition"

	"github.com/tsproxy/tsproxy/rewrite/rollup"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite/cursor"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/query"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/upstream"
	"github.com/tsproxy/tsproxy/wire"
)

// Partitioned rules (rules/partition.go): the buckets of a period live in
// a collection of their own. Writes split per partition and run the
// ordinary bucket insert against a copy of the rule whose BucketCollection
// is the partition (so the fills, the index, the replay check and the
// bucket ids all work per partition unchanged); reads span the partitions
// (partition_read.go); drop and retention drop whole partitions.

// partitionRule is rule with its buckets in the partition coll. The copy
// is not partitioned itself, so the ordinary paths serve it.
func partitionRule(rule *rules.Rule, coll string) *rules.Rule {
	r := *rule
	r.BucketCollection = coll
	r.PartitionBy = ""
	return &r
}

// partition is one existing partition collection of a rule.
type partColl struct {
	start int64 // period start, ms
	coll  string
}

// commander runs one command upstream (a client's connection or the
// sweeper's).
type commander interface {
	Command(cmd any) (bson.Raw, error)
}

// listPartitions lists the rule's existing partitions in time order, by
// listCollections on the rule's database (nameOnly; names are filtered
// here, as a regex filter is not supported everywhere).
func listPartitions(up commander, rule *rules.Rule) ([]partColl, error) {
	reply, err := up.Command(bson.D{
		{Key: "listCollections", Value: 1},
		{Key: "nameOnly", Value: true},
		{Key: "$db", Value: rule.DB},
	})
	var out []partColl
	for {
		if err != nil {
			return nil, fmt.Errorf("tsproxy rule %s: list partitions: %w", rule.Namespace, err)
		}
		if r := refusalOf(reply); r != nil {
			return nil, fmt.Errorf("tsproxy rule %s: list partitions: %w", rule.Namespace, r)
		}
		batch, ok := reply.Lookup("cursor", "firstBatch").ArrayOK()
		if !ok {
			batch, _ = reply.Lookup("cursor", "nextBatch").ArrayOK()
		}
		vals, _ := batch.Values()
		for _, v := range vals {
			doc, ok := v.DocumentOK()
			if !ok {
				continue
			}
			name, _ := doc.Lookup("name").StringValueOK()
			if start, ok := rule.ParsePartition(name); ok {
				out = append(out, partColl{start: start, coll: name})
			}
		}
		id, _ := reply.Lookup("cursor", "id").AsInt64OK()
		if id == 0 {
			break
		}
		reply, err = up.Command(bson.D{
			{Key: "getMore", Value: id},
			{Key: "collection", Value: "$cmd.listCollections"},
			{Key: "$db", Value: rule.DB},
		})
	}
	slices.SortFunc(out, func(a, b partColl) int { return int(min(max(a.start-b.start, -1), 1)) })
	return out, nil
}

// connCommander runs commands on a client's upstream connection.
type connCommander struct{ c *conn }

func (cc connCommander) Command(cmd any) (bson.Raw, error) { return cc.c.up.Command(cmd) }

// rewriteInsertPartitioned splits an insert per partition (see
// partition.SplitInsert), runs each part as an ordinary bucket insert on
// its partition and answers with the merged reply.
func (c *conn) rewriteInsertPartitioned(req *request, rule *rules.Rule) error {
	unacked := req.msg.Flags&wire.MoreToCome != 0
	parts, ordered := partition.SplitInsert(commandOf(req), rule, time.Now().UnixMilli())
	replies := make([][]byte, 0, len(parts))
	for _, p := range parts {
		var out []byte
		sub := *req
		sub.msg = wire.Msg{Flags: req.msg.Flags &^ wire.MoreToCome, Body: p.Command.Body}
		for _, s := range p.Command.Sequences {
			ws := wire.Sequence{Identifier: s.Identifier}
			for _, d := range s.Documents {
				ws.Documents = append(ws.Documents, d)
			}
			sub.msg.Sequences = append(sub.msg.Sequences, ws)
		}
		sub.sink = &out
		if err := c.rewriteInsert(&sub, partitionRule(rule, p.Collection)); err != nil {
			return err
		}
		replies = append(replies, out)
		if ordered && partition.InsertPartFailed(out) {
			break
		}
	}
	if unacked {
		return nil
	}
	return c.replyBody(req, partition.MergeInsertReplies(parts, replies))
}

// dropPartition drops one partition collection and forgets its index and
// fills, so that a later write into the period starts afresh.
func dropPartition(up commander, s *Server, rule *rules.Rule, coll string) error {
	reply, err := up.Command(bson.D{{Key: "drop", Value: coll}, {Key: "$db", Value: rule.DB}})
	if err == nil {
		if r := refusalOf(reply); r != nil {
			if r.code != mongoerr.NamespaceNotFound {
				err = r
			}
		}
	}
	s.forgetNamespace(rule.DB + "." + coll)
	if err != nil {
		return fmt.Errorf("tsproxy rule %s: drop partColl %s: %w", rule.Namespace, coll, err)
	}
	return nil
}

// retainPartitions drops the rule's partitions whose every bucket has
// expired, and sweeps (or TTL-indexes) the others like a bucket
// collection, so that the expired buckets of the partly expired period
// go too, as without partitions.
func (s *Server) retainPartitions(up *upstream.Conn, rule *rules.Rule, modes map[string]retentionMode, now time.Time) error {
	parts, err := listPartitions(up, rule)
	if err != nil {
		return err
	}
	for _, p := range parts {
		if rule.PartitionExpired(p.start, now) {
			if err := dropPartition(up, s, rule, p.coll); err != nil {
				return err
			}
			delete(modes, p.coll)
			s.log.Info("retention: expired partColl dropped", "rule", rule.Namespace, "collection", p.coll)
			continue
		}
		if modes[p.coll] == modeSweep && p.start+rule.SpanMillis() > now.Add(-rule.ExpireAfter).UnixMilli() {
			continue // no bucket of it has expired yet: no delete to send
		}
		pr := partitionRule(rule, p.coll)
		if err := s.retainCollection(up, pr, rollup.Expiry{Collection: p.coll, Window: rule.Span}, modes, now); err != nil {
			return err
		}
	}
	return nil
}

// handlePartitioned serves the commands whose meaning on a partitioned
// rule differs from the bucket collection's; done is false for the
// others (insert, reads and drop have their own hooks).
func (c *conn) handlePartitioned(req *request, rule *rules.Rule) (done bool, err error) {
	switch req.name {
	case "delete":
		return true, c.deletePartitioned(req, rule)
	case "killCursors":
		return true, c.killCursorsPartitioned(req, rule)
	case "collStats", "createIndexes", "listIndexes", "dropIndexes", "create":
		if req.msg.Flags&wire.MoreToCome != 0 {
			return true, nil
		}
		return true, c.replyRewriteError(req, partition.PartitionCommandRefusal(rule, req.name))
	}
	return false, nil
}

// deletePartitioned runs a delete on every partition and sums it.
func (c *conn) deletePartitioned(req *request, rule *rules.Rule) error {
	unacked := req.msg.Flags&wire.MoreToCome != 0
	parts, err := listPartitions(connCommander{c}, rule)
	if err != nil {
		return err
	}
	if len(parts) > 1 && partition.DeleteLimitOne(commandOf(req)) {
		if unacked {
			return nil
		}
		return c.replyRewriteError(req, partition.PartitionCommandRefusal(rule, "delete with limit 1 spanning partitions"))
	}
	if len(parts) == 0 {
		parts = []partColl{{coll: rule.BucketCollection}} // an empty delete, validated as usual
	}
	var replies [][]byte
	ip := make([]partition.InsertPart, len(parts))
	for _, p := range parts {
		var out []byte
		sub := *req
		sub.msg.Flags &^= wire.MoreToCome
		sub.sink = &out
		if err := c.rewriteDelete(&sub, partitionRule(rule, p.coll)); err != nil {
			return err
		}
		replies = append(replies, out)
		if ok, _ := bson.Raw(out).Lookup("ok").AsFloat64OK(); ok != 1 {
			break
		}
	}
	if unacked {
		return nil
	}
	return c.replyBody(req, partition.MergeInsertReplies(ip[:len(replies)], replies))
}

// killCursorsPartitioned kills cursors of a partitioned rule: each
// upstream cursor on its own partition, proxy-held ones here.
func (c *conn) killCursorsPartitioned(req *request, rule *rules.Rule) error {
	_, ids, err := query.KillCursors(req.msg.Body, rule)
	if err != nil {
		return c.replyRewriteError(req, err)
	}
	for _, id := range ids {
		e := c.s.cursors.get(id)
		if e == nil {
			continue
		}
		c.s.cursors.forget(id)
		_ = c.releaseEntry(e)
	}
	return c.replyBody(req, cursor.KillCursorsReply(nil, ids))
}

// firstPartitions maps each partitioned rule's app collection to its
// first existing partition, for a listCollections filter on the app's
// name (nil when no rule is partitioned: no upstream round trip).
func (c *conn) firstPartitions(rs []*rules.Rule) (map[string]string, error) {
	var out map[string]string
	for _, r := range rs {
		if !r.Partitioned() {
			continue
		}
		parts, err := listPartitions(connCommander{c}, r)
		if err != nil {
			return nil, err
		}
		if len(parts) > 0 {
			if out == nil {
				out = map[string]string{}
			}
			out[r.Collection] = parts[0].coll
		}
	}
	return out, nil
}
