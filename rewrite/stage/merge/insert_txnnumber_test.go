package merge_test

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite/insert"
	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
	"github.com/tsproxy/tsproxy/rewrite/stage"
)

// A retryable insert (lsid + txnNumber, as every driver sends with
// retryWrites) on a staged rule on MongoDB (ingest: staged; Combinable is
// false where the upstream has stmtIds), whose events fall in two staging
// periods, becomes two upstream inserts. MongoDB numbers the statements
// of a command without stmtIds 0, 1, ... and takes a statement whose
// (lsid, txnNumber, stmtId) already ran for a retry: it skips it and
// answers it as written. So two commands under one txnNumber without
// distinct stmtIds make the second one's documents be skipped while the
// client is told they are stored.
func TestStagedInsertTwoCommandsOneTxnNumber(t *testing.T) {
	rule := rwtest.InsertRule()
	evs := append(dayEvents("a", 0, 1), dayEvents("a", 2, 1)...)
	cmd := rwtest.SeqCmd(t, evs, retryArgs(5)...)
	pi, err := insert.Prepare(cmd, rule, bson.NewObjectID)
	if err != nil {
		t.Fatal(err)
	}
	p := stage.Insert(cmd, pi, stage.InsertEnv{Identity: "u", NewObjectID: bson.NewObjectID, Combinable: false})
	type sent struct {
		txn     bool
		stmtIDs bool
		coll    string
	}
	var cmds []sent
	for i := 0; i < 10; i++ {
		step, done := p.Next()
		if done {
			break
		}
		b := bson.Raw(step[0].Body)
		t.Logf("upstream: %s (+%d documents)", b.String(), len(step[0].Seq.Documents))
		cmds = append(cmds, sent{txn: b.Lookup("txnNumber").Type != 0, stmtIDs: b.Lookup("stmtIds").Type != 0, coll: b.Lookup("insert").StringValue()})
		if err := p.Feed([][]byte{rwtest.Doc(t, bson.D{{Key: "n", Value: int32(len(step[0].Seq.Documents))}, {Key: "ok", Value: 1.0}})}); err != nil {
			t.Fatal(err)
		}
	}
	if len(cmds) < 2 {
		t.Fatalf("want the insert to span two staging collections, got %d commands", len(cmds))
	}
	withTxn := 0
	for _, c := range cmds {
		if c.txn && !c.stmtIDs {
			withTxn++
		}
	}
	if withTxn > 1 {
		t.Errorf("%d upstream inserts carry the client's txnNumber without stmtIds: MongoDB takes the statements of all but the first for retries and skips them", withTxn)
	}
}
