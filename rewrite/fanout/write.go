package fanout

import (
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/source"
	"github.com/tsproxy/tsproxy/rules"
)

// Insert is the plan of an insert on a partitioned rule: the insert split
// per partition (SplitInsert), each part run as the ordinary insert of its
// partition (part's plan), and their replies merged into the client's.
// With ordered:true a failed part stops the parts after it.
// part gets the client's index of each of the part's events (its
// stmtIds).
func Insert(parts []InsertPart, ordered bool, rule *rules.Rule, part func(r *rules.Rule, cmd rewrite.Command, indexes []int) rewrite.Plan) rewrite.Plan {
	return rewrite.Script(func(x *rewrite.Exec) (rewrite.Result, error) {
		replies := make([][]byte, 0, len(parts))
		for _, p := range parts {
			res, err := runAll(x, part(Rule(rule, p.Collection), p.Command, p.Indexes))
			if err != nil {
				return rewrite.Result{}, err
			}
			replies = append(replies, res.Reply)
			if ordered && InsertPartFailed(res.Reply) {
				break
			}
		}
		return rewrite.Result{Reply: MergeInsertReplies(parts, replies)}, nil
	})
}

// Delete is the plan of a delete: the ordinary delete (part's plan) of
// every collection of the rule's buckets (rewrite/source), the counts
// summed. A deleteOne could remove an event from each partition of a
// partitioned rule, so one spanning several is refused.
func Delete(cmd rewrite.Command, rule *rules.Rule, part func(r *rules.Rule) rewrite.Plan) rewrite.Plan {
	return rewrite.Script(func(x *rewrite.Exec) (rewrite.Result, error) {
		l := source.List(rule)
		if _, err := runAll(x, l); err != nil {
			return rewrite.Result{}, err
		}
		parts := l.Collections()
		if len(parts) > 1 && DeleteLimitOne(cmd) {
			return rewrite.Result{}, PartitionCommandRefusal(rule, "delete with limit 1 spanning partitions")
		}
		if len(parts) == 0 {
			parts = []source.Collection{{Name: rule.BucketCollection}} // an empty delete, validated as usual
		}
		var replies [][]byte
		for _, p := range parts {
			res, err := runAll(x, part(Rule(rule, p.Name)))
			if err != nil {
				return rewrite.Result{}, err
			}
			replies = append(replies, res.Reply)
			if !mongoerr.IsOK(res.Reply) {
				break
			}
		}
		if len(replies) == 1 {
			return rewrite.Result{Reply: replies[0]}, nil // an unpartitioned rule's
		}
		return rewrite.Result{Reply: MergeInsertReplies(make([]InsertPart, len(replies)), replies)}, nil
	})
}
