package updates

import (
	"slices"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/deletes"
	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// journalBucket is a bucket of (meta, window start 0, seq) holding events
// {_id: i, ts, value: v} for each i: v of evs.
func journalBucket(t *testing.T, meta string, seq int, evs ...[2]int) bsoncore.Document {
	t.Helper()
	arr := A{}
	for _, e := range evs {
		arr = append(arr, D{{Key: "_id", Value: int32(e[0])}, {Key: "ts", Value: rwtest.DT(int64(e[0]) * 1000)}, {Key: "value", Value: int32(e[1])}})
	}
	return rwtest.Doc(t, D{{Key: "_id", Value: rwtest.BucketID(t, meta, 0, seq)}, {Key: "meta", Value: meta}, {Key: "start", Value: rwtest.DT(0)},
		{Key: "count", Value: int32(len(evs))}, {Key: "events", Value: arr}})
}

// eventsOf are a bucket's events as (_id, value) pairs.
func eventsOf(t *testing.T, bdoc bsoncore.Document) [][2]int {
	t.Helper()
	evs, err := bucket.EventDocs(bdoc)
	if err != nil {
		t.Fatal(err)
	}
	var out [][2]int
	for _, e := range evs {
		out = append(out, [2]int{int(e.Lookup("_id").Int32()), int(e.Lookup("value").Int32())})
	}
	return out
}

// TestFinishRecord: a record a proxy killed part way left pending is
// finished by event identity. The round updated event 1 (value 1 to 10)
// and moved event 4 to series t; since the kill, a merge topped the
// bucket up with event 3. The bucket keeps event 3, takes event 1's new
// version and loses event 4; the new bucket of series t is inserted,
// being absent; the record is marked done.
func TestFinishRecord(t *testing.T) {
	rule := rwtest.Rule()
	src := journalBucket(t, "s", 0, [2]int{1, 1}, [2]int{2, 2}, [2]int{4, 4}, [2]int{3, 3})
	srcID := rwtest.BucketID(t, "s", 0, 0)
	replacement := deletes.WithoutID(journalBucket(t, "s", 0, [2]int{1, 10}, [2]int{2, 2}))
	moved := journalBucket(t, "t", 0, [2]int{4, 4})
	rec := rwtest.Doc(t, D{{Key: "_id", Value: "k.a.0.0"}, {Key: jCmd, Value: ""}, {Key: jStmt, Value: int32(0)}, {Key: jState, Value: statePend},
		{Key: jBuckets, Value: A{D{{Key: jBucketID, Value: srcID}, {Key: jBucketDoc, Value: bson.Raw(replacement)}}}},
		{Key: jNew, Value: A{bson.Raw(moved)}},
		{Key: jIDs, Value: A{int32(1), int32(4)}}})
	cmd := rwtest.Doc(t, D{{Key: "update", Value: "readings"}, {Key: "updates", Value: A{D{{Key: "q", Value: D{}}, {Key: "u", Value: set}}}}, {Key: "$db", Value: "iot"}})
	req, err := NewRequest(rewrite.Command{Body: cmd}, rule, rwtest.MongoCaps)
	if err != nil {
		t.Fatal(err)
	}
	var locked []bucket.Key
	env := Env{Env: deletes.Env{Caps: rwtest.MongoCaps, Lock: func(keys []bucket.Key) func() { locked = keys; return func() {} }},
		NewObjectID: bson.NewObjectID, Now: func() time.Time { return time.Unix(0, 0) }}
	plans := []struct {
		name string
		plan func() rewrite.Plan
	}{
		{"at an update's start", func() rewrite.Plan {
			return rewrite.Script(func(x *rewrite.Exec) (rewrite.Result, error) {
				u := &updater{x: x, req: req, env: env, now: env.Now()}
				return rewrite.Result{Reply: rwtest.Doc(t, D{{Key: "ok", Value: 1.0}})}, u.openJournal()
			})
		}},
		// A read's, once a term (proxy/handler settleJournal).
		{"by Recover", func() rewrite.Plan { return Recover(rule, env) }},
	}
	for _, pc := range plans {
		t.Run(pc.name, func(t *testing.T) {
			p := pc.plan()
			ok := rwtest.Doc(t, D{{Key: "n", Value: 1}, {Key: "ok", Value: 1.0}})
			var replaced bsoncore.Document
			var inserted, markedDone bool
			for {
				step, done := p.Next()
				if done {
					break
				}
				var replies [][]byte
				for _, s := range step {
					body := bsoncore.Document(s.Body)
					name := body.Index(0).Key()
					coll, _ := body.Index(0).Value().StringValueOK()
					switch {
					case name == "find" && coll == rule.UpdateJournalCollection():
						replies = append(replies, rwtest.CursorReply(t, 0, mustD(t, rec)))
					case name == "find":
						id := body.Lookup("filter", "_id").ObjectID()
						var docs []D
						if id == srcID {
							docs = append(docs, mustD(t, src))
						}
						replies = append(replies, rwtest.CursorReply(t, 0, docs...))
					case name == "insert":
						inserted = true
						replies = append(replies, ok)
					case name == "update" && coll == rule.BucketCollection:
						u, _ := body.Lookup("updates").Array().Index(0).Document().Lookup("u").DocumentOK()
						replaced = u
						replies = append(replies, ok)
					case name == "update":
						markedDone = body.Lookup("updates").Array().Index(0).Document().Lookup("u", "$set", jState).StringValue() == stateDone
						replies = append(replies, ok)
					default:
						replies = append(replies, ok)
					}
				}
				if err := p.Feed(replies); err != nil {
					t.Fatal(err)
				}
			}
			if !mongoerr.IsOK(p.Result().Reply) {
				t.Fatalf("finishing failed: %s", rwtest.JSON(p.Result().Reply))
			}
			if got := eventsOf(t, replaced); !slices.Equal(got, [][2]int{{1, 10}, {2, 2}, {3, 3}}) {
				t.Fatalf("the bucket after finishing: %v", got)
			}
			if !inserted || !markedDone || len(locked) != 2 {
				t.Fatalf("inserted %v, marked done %v, locked %d keys", inserted, markedDone, len(locked))
			}
		})
	}
}

func mustD(t *testing.T, b bsoncore.Document) D {
	t.Helper()
	var d D
	if err := bson.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	return d
}
