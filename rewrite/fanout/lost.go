package fanout

import (
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/cursor"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
)

// FerretDB v1.24 on PostgreSQL drops a collection with DROP TABLE, then
// the delete of its catalog entry. Killed between them, it keeps an entry
// without a table, and every read of it fails with undefined_table
// (SQLSTATE 42P01, mongoerr.DroppedUnderQuery) for good; a read racing a
// drop gets the same answer once. Retention drops partitions, so a crash
// there left a partition that failed every read across it. Both mean the
// drop has committed: a partition read so answered reads no buckets,
// which is what a finished drop leaves.

// partRead runs single's read of body on partition p, a lost table read
// as no buckets.
func (m *merger) partRead(p string, body []byte) (rewrite.Result, error) {
	res, err := runAll(m.x, m.single(Rule(m.rule, p), body))
	return emptyIfLost(body, m.rule, res), err
}

// emptyIfLost is res, or the reply of no buckets to body when res is an
// error reply of a lost table.
func emptyIfLost(body []byte, rule *rules.Rule, res rewrite.Result) rewrite.Result {
	if !lostTable(res) {
		return res
	}
	if empty := emptyReply(body, rule); empty != nil {
		return rewrite.Result{Reply: empty}
	}
	return res
}

// lostTable says whether res is the error reply of a read that met a
// collection without its table.
func lostTable(res rewrite.Result) bool {
	return res.Cursor == nil && res.Reply != nil && mongoerr.DroppedUnderQueryReply(res.Reply)
}

// emptyReply is the reply of a read of no events: body's command on
// rule's namespace (find, aggregate, count, distinct), or nil for another
// command.
func emptyReply(body []byte, rule *rules.Rule) []byte {
	switch commandName(body) {
	case "find", "aggregate":
		return cursor.Reply{Key: "firstBatch", NS: rule.DB + "." + rule.Collection}.WithID(0)
	case "count":
		return bsoncore.NewDocumentBuilder().AppendInt32("n", 0).AppendDouble("ok", 1).Build()
	case "distinct":
		return bsoncore.NewDocumentBuilder().AppendArray("values", bsoncore.NewArrayBuilder().Build()).AppendDouble("ok", 1).Build()
	}
	return nil
}
