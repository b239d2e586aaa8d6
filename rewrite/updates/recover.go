package updates

import (
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rules"
)

// Recover finishes the records of rule's update journal that a proxy
// stopped part way left pending (a kill -9, a cut link), as every update
// does before its statements: until then a read may find a moved event
// both in its new bucket and in the one it left. The proxy runs it on a
// rule's first read in each term of the writer lease it holds, so that
// such an event is read once without waiting for the next update.
func Recover(rule *rules.Rule, env Env) rewrite.Plan {
	env.RetryKey, env.Sweep = "", false
	body := bsoncore.NewDocumentBuilder().AppendString("update", rule.Collection).
		AppendArray("updates", bsoncore.NewArrayBuilder().Build()).
		AppendString("$db", rule.DB).Build()
	req, err := NewRequest(rewrite.Command{Body: body}, rule, env.Caps)
	if err != nil {
		return rewrite.Fail(err)
	}
	return rewrite.Script(func(x *rewrite.Exec) (rewrite.Result, error) {
		u := &updater{x: x, req: req, env: env, now: env.Now()}
		if err := u.openJournal(); err != nil {
			return rewrite.Result{}, err
		}
		return rewrite.Result{Reply: rewrite.OKReply()}, nil
	})
}

// PendingFind finds one record of rule's update journal left pending:
// whether Recover has anything to do, read without the writer lease.
func PendingFind(rule *rules.Rule) []byte {
	nb := bsoncore.NewDocumentBuilder
	return nb().AppendString("find", rule.UpdateJournalCollection()).
		AppendDocument("filter", nb().AppendString(jState, statePend).Build()).
		AppendDocument("projection", nb().AppendInt32("_id", 1).Build()).
		AppendInt32("limit", 1).AppendBoolean("singleBatch", true).
		AppendString("$db", rule.DB).Build()
}
