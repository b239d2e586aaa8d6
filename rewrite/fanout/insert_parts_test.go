package fanout_test

import (
	"fmt"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/fanout"
	"github.com/tsproxy/tsproxy/rewrite/insert"
	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
	"github.com/tsproxy/tsproxy/rewrite/rollup"
	"github.com/tsproxy/tsproxy/rules"
)

type memFills map[string]bucket.Fill

func (m memFills) Fill(k bucket.Key) bucket.Fill   { return m[k.String()] }
func (m memFills) Set(k bucket.Key, f bucket.Fill) { m[k.String()] = f }

// mongoRetryable is an in-memory MongoDB bucket store that applies
// retryable writes as MongoDB does: per session and txnNumber, a
// statement whose stmtId was already executed is not executed again
// (whatever its namespace) and is reported as succeeded.
type mongoRetryable struct {
	t        *testing.T
	events   map[string]int // collection/_id -> events stored
	executed map[string]bool
	sent     []string
	failColl string // bucket writes to this collection get a writeError (code 121)
}

func (m *mongoRetryable) run(up rewrite.Upstream) []byte {
	t := m.t
	body := bsoncore.Document(up.Body)
	elems, _ := body.Elements()
	cmd, coll := elems[0].Key(), elems[0].Value().StringValue()
	m.sent = append(m.sent, bson.Raw(body).String())
	switch cmd {
	case "find":
		filter := body.Lookup("filter").Document()
		id := filter.Lookup("_id").ObjectID()
		if n, ok := m.events[coll+"/"+fmt.Sprintf("%x", id)]; ok {
			return rwtest.CursorReply(t, 0, bson.D{{Key: "_id", Value: id}, {Key: "count", Value: int32(n)}, {Key: "bytes", Value: int32(0)}})
		}
		return rwtest.CursorReply(t, 0)
	case "insert", "update":
		if coll == m.failColl {
			return rwtest.Doc(t, bson.D{{Key: "n", Value: int32(0)}, {Key: "writeErrors", Value: bson.A{bson.D{{Key: "index", Value: int32(0)}, {Key: "code", Value: int32(121)}, {Key: "errmsg", Value: "Document failed validation"}}}}, {Key: "ok", Value: 1.0}})
		}
		var stmts []bsoncore.Document
		if up.Seq != nil {
			stmts = up.Seq.Documents
		}
		txn, hasTxn := body.Lookup("txnNumber").AsInt64OK()
		var ids []bsoncore.Value
		if arr, ok := body.Lookup("stmtIds").ArrayOK(); ok {
			ids, _ = arr.Values()
		}
		n := 0
		for i, st := range stmts {
			if hasTxn && i < len(ids) {
				key := fmt.Sprintf("%d/%d", txn, ids[i].Int32())
				if m.executed[key] {
					n++ // a retry: MongoDB answers success, writes nothing
					continue
				}
				m.executed[key] = true
			}
			if cmd == "insert" {
				m.events[coll+"/"+fmt.Sprintf("%x", st.Lookup("_id").ObjectID())] += int(st.Lookup("count").Int32())
			} else {
				id := st.Lookup("q", "_id").ObjectID()
				each, _ := st.Lookup("u", "$push", "events", "$each").Array().Values()
				m.events[coll+"/"+fmt.Sprintf("%x", id)] += len(each)
			}
			n++
		}
		return rwtest.Doc(t, bson.D{{Key: "n", Value: int32(n)}, {Key: "ok", Value: 1.0}})
	}
	t.Fatalf("unexpected command %s", bson.Raw(body))
	return nil
}

func (m *mongoRetryable) stored() int {
	total := 0
	for _, n := range m.events {
		total += n
	}
	return total
}

// A retryable insert (lsid, txnNumber) on a partitioned rule over
// MongoDB: each partition's part numbers its stmtIds from its own first
// event (0), so the second partition's bucket writes carry the stmtIds
// the first partition's already used under the same txnNumber, and
// MongoDB skips them as retries: events acknowledged, never stored.
func TestPartitionedRetryableInsertStmtIDsCollide(t *testing.T) {
	for _, ordered := range []bool{true, false} {
		t.Run(fmt.Sprintf("ordered=%v", ordered), func(t *testing.T) {
			r := rwtest.InsertRule()
			r.PartitionBy = rules.PartitionMonth
			jul := time.Date(2026, 7, 31, 23, 30, 0, 0, time.UTC).UnixMilli()
			aug := time.Date(2026, 8, 1, 0, 10, 0, 0, time.UTC).UnixMilli()
			events := []bson.D{
				rwtest.Event(rwtest.OID(1), rwtest.DT(jul), "a", int32(1)),
				rwtest.Event(rwtest.OID(2), rwtest.DT(aug), "a", int32(2)),
			}
			cmd := rwtest.SeqCmd(t, events,
				bson.E{Key: "ordered", Value: ordered},
				bson.E{Key: "lsid", Value: bson.D{{Key: "id", Value: bson.Binary{Subtype: 4, Data: make([]byte, 16)}}}},
				bson.E{Key: "txnNumber", Value: int64(7)})
			parts, ord := fanout.SplitInsert(cmd, r, jul)
			if len(parts) != 2 {
				t.Fatalf("parts: %d", len(parts))
			}
			fills := memFills{}
			part := func(pr *rules.Rule, c rewrite.Command, indexes []int) rewrite.Plan {
				pi, err := insert.Prepare(c, pr, bson.NewObjectID)
				if err != nil {
					t.Fatal(err)
				}
				return insert.Plan(c, pi, insert.Env{Caps: rwtest.MongoCaps, NewObjectID: bson.NewObjectID, Fills: fills, StmtIDs: indexes})
			}
			up := &mongoRetryable{t: t, events: map[string]int{}, executed: map[string]bool{}}
			p := fanout.Insert(parts, ord, r, part)
			for {
				step, done := p.Next()
				if done {
					break
				}
				var replies [][]byte
				for _, u := range step {
					replies = append(replies, up.run(u))
				}
				if err := p.Feed(replies); err != nil {
					t.Fatal(err)
				}
			}
			reply := bson.Raw(p.Result().Reply)
			n := reply.Lookup("n").Int32()
			if n != 2 || up.stored() != 2 {
				for _, s := range up.sent {
					t.Log(s)
				}
				t.Fatalf("reply %s; events stored upstream: %d, want 2", reply, up.stored())
			}
		})
	}
}

func (m *mongoRetryable) drive(t *testing.T, p rewrite.Plan) []byte {
	for {
		step, done := p.Next()
		if done {
			return p.Result().Reply
		}
		var replies [][]byte
		for _, u := range step {
			replies = append(replies, m.run(u))
		}
		if err := p.Feed(replies); err != nil {
			t.Fatal(err)
		}
	}
}

// An ordered insert on a partitioned rule with rollups: runs [Jul e0],
// [Aug e1], [Jul e2]. The Aug part's bucket write fails, so the ordered
// insert stops and e2 is never written; but the merged reply names only
// e1 in writeErrors, and the rollups (which count every planned event not
// in writeErrors, trusting insert's reply to name every unwritten one)
// count e2 as well.
func TestPartitionedOrderedStopRollupsCountUnwritten(t *testing.T) {
	r := rwtest.InsertRule()
	r.PartitionBy = rules.PartitionMonth
	r.Rollups = []time.Duration{24 * time.Hour}
	jul := time.Date(2026, 7, 31, 23, 30, 0, 0, time.UTC).UnixMilli()
	aug := time.Date(2026, 8, 1, 0, 10, 0, 0, time.UTC).UnixMilli()
	events := []bson.D{
		rwtest.Event(rwtest.OID(1), rwtest.DT(jul), "a", int32(1)),
		rwtest.Event(rwtest.OID(2), rwtest.DT(aug), "a", int32(2)),
		rwtest.Event(rwtest.OID(3), rwtest.DT(jul+1), "a", int32(3)),
	}
	cmd := rwtest.SeqCmd(t, events)
	parts, ord := fanout.SplitInsert(cmd, r, jul)
	if len(parts) != 3 || !ord {
		t.Fatalf("parts: %d ordered %v", len(parts), ord)
	}
	fills := memFills{}
	part := func(pr *rules.Rule, c rewrite.Command, indexes []int) rewrite.Plan {
		pi, err := insert.Prepare(c, pr, bson.NewObjectID)
		if err != nil {
			t.Fatal(err)
		}
		return insert.Plan(c, pi, insert.Env{Caps: rwtest.MongoCaps, NewObjectID: bson.NewObjectID, Fills: fills, StmtIDs: indexes})
	}
	up := &mongoRetryable{t: t, events: map[string]int{}, executed: map[string]bool{}, failColl: "readings.buckets_2026_08"}
	reply := up.drive(t, fanout.Insert(parts, ord, r, part))
	w, err := rollup.Of(cmd, r, reply, rollup.Options{})
	if err != nil {
		t.Fatal(err)
	}
	counted := 0
	if w != nil {
		counted = w.Events
	}
	if counted != up.stored() {
		t.Fatalf("reply %s: %d events stored, rollups count %d", bson.Raw(reply), up.stored(), counted)
	}
}

// An unordered insert over three partitions whose middle part fails as a
// command (ok: 0): the first and last parts were written (2 events
// stored), but the client's reply is the middle part's command error, so
// the client is told nothing was written. MongoDB (and this proxy's own
// unpartitioned insert, see TestInsertReply "command error after events
// were written: per-event errors") answers ok: 1, n: 2 with writeErrors for
// the failed part's events.
func TestMergeInsertRepliesCommandErrorHidesWrittenParts(t *testing.T) {
	parts := []fanout.InsertPart{{Indexes: []int{0}}, {Indexes: []int{1}}, {Indexes: []int{2}}}
	cmdErr := rwtest.Doc(t, bson.D{{Key: "ok", Value: 0.0}, {Key: "errmsg", Value: "not primary"}, {Key: "code", Value: int32(10107)}, {Key: "codeName", Value: "NotWritablePrimary"}})
	replies := [][]byte{
		rwtest.Doc(t, bson.D{{Key: "n", Value: int32(1)}, {Key: "ok", Value: 1.0}}),
		cmdErr,
		rwtest.Doc(t, bson.D{{Key: "n", Value: int32(1)}, {Key: "ok", Value: 1.0}}),
	}
	got := bson.Raw(fanout.MergeInsertReplies(parts, replies))
	ok, _ := got.Lookup("ok").AsFloat64OK()
	n, _ := got.Lookup("n").AsInt64OK()
	if ok != 1 || n != 2 {
		t.Fatalf("merged reply %s: want ok: 1, n: 2 and a writeError for index 1", got)
	}
}
