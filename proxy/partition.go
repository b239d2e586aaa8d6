package proxy

import (
	"fmt"
	"slices"
	"time"

	"github.com/tsproxy/tsproxy/rewrite/partition"

	"github.com/tsproxy/tsproxy/rewrite/rollup"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/upstream"
)

// Partitioned rules (rules/partition.go): the buckets of a period live in
// a collection of their own. Writes split per partition and run the
// ordinary bucket insert against a copy of the rule whose BucketCollection
// is the partition (so the fills, the index, the replay check and the
// bucket ids all work per partition unchanged); reads span the partitions
// (partition_read.go); drop and retention drop whole partitions.

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
		pr := partition.Rule(rule, p.coll)
		if err := s.retainCollection(up, pr, rollup.Expiry{Collection: p.coll, Window: rule.Span}, modes, now); err != nil {
			return err
		}
	}
	return nil
}
