package read

import (
	"testing"

	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// A find the point lookups serve, with a readConcern / inside a
// transaction, on MongoDB: every upstream command it becomes must carry
// the client's readConcern (first command) and session/transaction fields,
// or the read be refused. Served as plain finds it is a local read outside
// the transaction.
func TestPointReadKeepsReadConcernAndTxn(t *testing.T) {
	rule := rwtest.Rule()
	filter := bson.D{{Key: "sensorId", Value: "a"}, {Key: "ts", Value: bson.D{{Key: "$gte", Value: rwtest.DT(0)}, {Key: "$lt", Value: rwtest.DT(rwtest.Hour)}}}}
	lsid := bson.D{{Key: "id", Value: bson.Binary{Subtype: 4, Data: make([]byte, 16)}}}
	cases := map[string]bson.D{
		"snapshot": {{Key: "find", Value: rule.Collection}, {Key: "filter", Value: filter},
			{Key: "readConcern", Value: bson.D{{Key: "level", Value: "snapshot"}}}, {Key: "$db", Value: rule.DB}},
		"linearizable": {{Key: "find", Value: rule.Collection}, {Key: "filter", Value: filter},
			{Key: "readConcern", Value: bson.D{{Key: "level", Value: "linearizable"}}}, {Key: "$db", Value: rule.DB}},
		"transaction": {{Key: "find", Value: rule.Collection}, {Key: "filter", Value: filter},
			{Key: "lsid", Value: lsid}, {Key: "txnNumber", Value: int64(3)}, {Key: "autocommit", Value: false},
			{Key: "startTransaction", Value: true}, {Key: "readConcern", Value: bson.D{{Key: "level", Value: "snapshot"}}}, {Key: "$db", Value: rule.DB}},
	}
	for name, body := range cases {
		t.Run(name, func(t *testing.T) {
			p := Plan(rwtest.Doc(t, body), rule, Options{Caps: rwtest.MongoCaps}, func() int64 { return 7 })
			step, done := p.Next()
			if done {
				res := p.Result()
				t.Logf("answered without upstream: %s", rwtest.JSON(res.Reply))
				return // refused: acceptable
			}
			for i, u := range step {
				cmd := bsoncore.Document(u.Body)
				t.Logf("upstream %d: %s", i, rwtest.JSON(u.Body))
				if _, err := cmd.LookupErr("readConcern"); err != nil && i == 0 {
					t.Errorf("upstream command %d drops the client's readConcern: %s", i, rwtest.JSON(u.Body))
				}
				if name == "transaction" {
					for _, k := range []string{"lsid", "txnNumber", "autocommit"} {
						if _, err := cmd.LookupErr(k); err != nil {
							t.Errorf("upstream command %d of a transaction statement drops %q: runs outside the transaction", i, k)
						}
					}
				}
			}
		})
	}
}
