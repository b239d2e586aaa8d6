package proxy

import (
	"fmt"

	"github.com/tsproxy/tsproxy/rewrite/insert"

	"github.com/tsproxy/tsproxy/rewrite/bucket"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rules"
)

// The proxy recognises a driver's retry of an insert the upstream cannot
// recognise (see rewrite/replay.go). Checking costs a read of the key's
// buckets, so it checks only when a retry of a write it did not see
// through is possible: when it does not know the key's fill. That is the
// case after any failure whose outcome it did not learn (it forgets the
// fills then) and after a restart; while it knows a fill, every write of
// that key went through it and got its reply, and a retry of such a
// write is answered from the reply cache (reply_cache.go).

// keysToCheck are the indexes of the locked keys whose buckets a retry
// may have been stored in already: those whose fill is unknown, or all
// when the reply cache lost records a retry may still need.
func (c *conn) keysToCheck(req *request, l *lockedKeys) []int {
	if req.txn == nil || !req.txn.check {
		return l.unknownKeys()
	}
	all := make([]int, len(l.entries))
	for i := range all {
		all[i] = i
	}
	return all
}

// unknownKeys are the indexes of the locked keys whose fill is unknown.
func (l *lockedKeys) unknownKeys() []int {
	var out []int
	for i, e := range l.entries {
		if !e.fill.Known {
			out = append(out, i)
		}
	}
	return out
}

// filterReplayed reads the buckets of the keys at idx (their fills
// loaded) and returns the insert without the events already stored there,
// or nil when none is.
func (c *conn) filterReplayed(rule *rules.Rule, cmd rewrite.Command, l *lockedKeys, idx []int) (*insert.ReplayFilter, error) {
	stored := map[string]bool{}
	ns := rule.BucketNamespace()
	for _, i := range idx {
		for seq := 0; seq <= l.entries[i].fill.Seq; seq++ {
			if err := c.storedEvents(rule, l.keys[i].ID(ns, seq), stored); err != nil {
				return nil, fmt.Errorf("tsproxy rule %s: check for a retried insert: %w", rule.Namespace, err)
			}
		}
	}
	return insert.WithoutStored(cmd, rule, stored), nil
}

// storedEvents adds the identities of the events of bucket id to set.
func (c *conn) storedEvents(rule *rules.Rule, id bson.ObjectID, set map[string]bool) error {
	reply, err := c.up.Command(bson.D{
		{Key: "find", Value: rule.BucketCollection},
		{Key: "filter", Value: bson.D{{Key: bucket.FieldID, Value: id}}},
		{Key: "projection", Value: bson.D{{Key: bucket.FieldMeta, Value: 1}, {Key: bucket.FieldEvents, Value: 1}}},
		{Key: "limit", Value: 1},
		{Key: "singleBatch", Value: true},
		{Key: "$db", Value: rule.DB},
	})
	if err != nil {
		return err
	}
	if ok, _ := reply.Lookup("ok").AsFloat64OK(); ok != 1 {
		msg, _ := reply.Lookup("errmsg").StringValueOK()
		return fmt.Errorf("find bucket %s: %s", id.Hex(), msg)
	}
	first, ok := reply.Lookup("cursor", "firstBatch").ArrayOK()
	if !ok {
		return fmt.Errorf("find bucket %s: reply without cursor.firstBatch", id.Hex())
	}
	vals, err := first.Values()
	if err != nil {
		return fmt.Errorf("find bucket %s: %w", id.Hex(), err)
	}
	if len(vals) == 0 {
		return nil
	}
	if bucket, ok := vals[0].DocumentOK(); ok {
		insert.StoredEventIdentities(bucket, rule, set)
	}
	return nil
}
