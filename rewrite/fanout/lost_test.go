package fanout

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
	"github.com/tsproxy/tsproxy/rewrite/read"
	"github.com/tsproxy/tsproxy/rules"
)

// TestReadLostPartition: a partition whose table FerretDB on PostgreSQL
// lost (a drop cut between its two statements, or racing the read)
// answers undefined_table; a read across it gives what the other
// partitions hold, and any other error of a partition is the read's.
func TestReadLostPartition(t *testing.T) {
	r := partRule()
	july, august := r.BucketCollection+"_2026_07", r.BucketCollection+"_2026_08"
	lost := rwtest.Doc(t, bson.D{{Key: "ok", Value: 0.0}, {Key: "code", Value: 1}, {Key: "errmsg", Value: `ERROR: relation "iot.t_1" does not exist (SQLSTATE 42P01)`}})
	refused := rwtest.Doc(t, bson.D{{Key: "ok", Value: 0.0}, {Key: "code", Value: 13}, {Key: "errmsg", Value: "not authorized"}})
	event := bson.D{{Key: "_id", Value: rwtest.OID(1)}, {Key: "v", Value: 1.0}}
	cursorOf := func(docs ...bson.D) []byte {
		batch := bson.A{}
		for _, d := range docs {
			batch = append(batch, d)
		}
		return rwtest.Doc(t, bson.D{{Key: "cursor", Value: bson.D{{Key: "firstBatch", Value: batch}, {Key: "id", Value: int64(0)}, {Key: "ns", Value: "iot.readings"}}}, {Key: "ok", Value: 1.0}})
	}
	cases := []struct {
		name     string
		body     bson.D
		replies  map[string][]byte // by partition
		want     bson.D
		wantCode int32
	}{
		{"find", bson.D{{Key: "find", Value: "readings"}},
			map[string][]byte{july: lost, august: cursorOf(event)},
			bson.D{{Key: "cursor", Value: bson.D{{Key: "firstBatch", Value: bson.A{event}}, {Key: "id", Value: int64(0)}, {Key: "ns", Value: "iot.readings"}}}, {Key: "ok", Value: 1.0}}, 0},
		{"count", bson.D{{Key: "count", Value: "readings"}},
			map[string][]byte{july: lost, august: rwtest.Doc(t, bson.D{{Key: "n", Value: int32(4)}, {Key: "ok", Value: 1.0}})},
			bson.D{{Key: "n", Value: int32(4)}, {Key: "ok", Value: 1.0}}, 0},
		{"distinct", bson.D{{Key: "distinct", Value: "readings"}, {Key: "key", Value: "m"}},
			map[string][]byte{july: rwtest.Doc(t, bson.D{{Key: "values", Value: bson.A{"a"}}, {Key: "ok", Value: 1.0}}), august: lost},
			bson.D{{Key: "values", Value: bson.A{"a"}}, {Key: "ok", Value: 1.0}}, 0},
		{"another error is the read's", bson.D{{Key: "count", Value: "readings"}},
			map[string][]byte{july: refused, august: rwtest.Doc(t, bson.D{{Key: "n", Value: int32(4)}, {Key: "ok", Value: 1.0}})},
			nil, 13},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			single := func(pr *rules.Rule, body []byte) rewrite.Plan {
				return rewrite.Done(rewrite.Result{Reply: c.replies[pr.BucketCollection]})
			}
			body := rwtest.Doc(t, append(c.body, bson.E{Key: "$db", Value: "iot"}))
			p := Read(body, r, read.Options{}, func() int64 { return 7 }, single)
			listing := rwtest.CursorReply(t, 0, bson.D{{Key: "name", Value: july}}, bson.D{{Key: "name", Value: august}})
			for range 10 {
				step, done := p.Next()
				if done {
					break
				}
				replies := make([][]byte, len(step))
				for i := range step {
					replies[i] = listing
				}
				if err := p.Feed(replies); err != nil {
					t.Fatal(err)
				}
			}
			got := bsoncore.Document(p.Result().Reply)
			if c.wantCode != 0 {
				if code, _ := got.Lookup("code").AsInt32OK(); code != c.wantCode {
					t.Fatalf("reply %s, want error %d", got, c.wantCode)
				}
				return
			}
			rwtest.AssertDoc(t, c.name, got, c.want)
		})
	}
	// The reply of no buckets, alone (one partition in the read's range).
	for _, cmd := range []string{"find", "aggregate", "count", "distinct"} {
		if emptyReply(rwtest.Doc(t, bson.D{{Key: cmd, Value: "readings"}, {Key: "$db", Value: "iot"}}), r) == nil {
			t.Errorf("no empty reply of %s", cmd)
		}
	}
}
