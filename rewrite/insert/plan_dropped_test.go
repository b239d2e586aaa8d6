package insert

import (
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
)

// mapFills is Fills over a map, by Key.String().
type mapFills map[string]bucket.Fill

func (m mapFills) Fill(k bucket.Key) bucket.Fill   { return m[k.String()] }
func (m mapFills) Set(k bucket.Key, f bucket.Fill) { m[k.String()] = f }

// droppedReply is FerretDB on PostgreSQL's answer to a find whose
// collection a concurrent drop removed.
func droppedReply(t testing.TB) []byte {
	return rwtest.Doc(t, bson.D{{Key: "ok", Value: 0.0}, {Key: "code", Value: int32(1)}, {Key: "codeName", Value: "InternalError"},
		{Key: "errmsg", Value: `[msg_find.go:344 handler.handleMaxTimeMSError] ERROR: relation "db.readings_buckets_x" does not exist (SQLSTATE 42P01)`}})
}

// nextStep is the plan's next step; it fails the test when the plan is done.
func nextStep(t *testing.T, p rewrite.Plan) rewrite.Step {
	t.Helper()
	step, done := p.Next()
	if done {
		t.Fatalf("plan done early: %s", bsonDoc(p.Result().Reply))
	}
	return step
}

func bsonDoc(b []byte) string { return bson.Raw(b).String() }

// sameStep says whether two steps send the same command bodies.
func sameStep(a, b rewrite.Step) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if string(a[i].Body) != string(b[i].Body) {
			return false
		}
	}
	return true
}

// TestPlanDroppedUnder: a read of the insert plan (a fill probe, the check
// of a retry's buckets) whose collection is dropped under it (a retention
// sweeper dropping a partition) is sent again as it was, and then finds no
// bucket; a few times at most, and any other error fails the insert.
func TestPlanDroppedUnder(t *testing.T) {
	rule := rwtest.InsertRule()
	events := []bson.D{
		rwtest.Event(rwtest.OID(1), rwtest.DT(1), "a", nil),
		rwtest.Event(rwtest.OID(2), rwtest.DT(2), "b", nil),
	}
	a, b := bucket.KeyOf(mustValue("a"), 0), bucket.KeyOf(mustValue("b"), 0)
	bucketA := bson.D{{Key: "_id", Value: bid("a", 0, 0)}, {Key: "count", Value: int32(1)}, {Key: "bytes", Value: int32(40)}}
	newPlan := func(t *testing.T, env Env, extra ...bson.E) (rewrite.Plan, mapFills) {
		cmd := rwtest.BodyCmd(t, events, extra...)
		pi, err := Prepare(cmd, rule, idGen())
		if err != nil {
			t.Fatal(err)
		}
		fills := mapFills{}
		env.NewObjectID, env.Fills = idGen(), fills
		return Plan(cmd, pi, env), fills
	}
	isWrite := func(s rewrite.Step) bool {
		k := commandName(s[0].Body)
		return k == "insert" || k == "update"
	}

	t.Run("fill probe read again, then no bucket", func(t *testing.T) {
		p, fills := newPlan(t, Env{})
		first := nextStep(t, p)
		if len(first) != 2 {
			t.Fatalf("first step: %d reads, want 2", len(first))
		}
		// a's probe found its bucket, b's met the drop: nothing is taken
		// from the step, and the same two reads go again.
		if err := p.Feed([][]byte{rwtest.CursorReply(t, 0, bucketA), droppedReply(t)}); err != nil {
			t.Fatalf("feed with a dropped collection: %v", err)
		}
		if again := nextStep(t, p); !sameStep(again, first) {
			t.Fatalf("the step is not sent again as it was: %d reads", len(again))
		}
		if len(fills) != 0 {
			t.Fatalf("fills set from a step sent again: %v", fills)
		}
		if err := p.Feed([][]byte{rwtest.CursorReply(t, 0, bucketA), rwtest.CursorReply(t, 0)}); err != nil {
			t.Fatal(err)
		}
		// a probes its next seq, which is missing: bucket 0 is open.
		if s := nextStep(t, p); len(s) != 1 || isWrite(s) {
			t.Fatalf("want a's next probe, got %d commands", len(s))
		}
		if err := p.Feed([][]byte{rwtest.CursorReply(t, 0)}); err != nil {
			t.Fatal(err)
		}
		if s := nextStep(t, p); !isWrite(s) {
			t.Fatalf("want the bucket writes, got %s", bsonDoc(s[0].Body))
		}
		if f := fills[b.String()]; f != (bucket.Fill{Seq: -1, Known: true}) {
			t.Errorf("b's fill = %+v, want no bucket", f)
		}
		if f := fills[a.String()]; f != (bucket.Fill{Seq: 0, Count: 1, Bytes: 40, Known: true}) {
			t.Errorf("a's fill = %+v", f)
		}
	})

	t.Run("check of a retry's bucket read again", func(t *testing.T) {
		// A retryable insert the upstream cannot recognise as a retry:
		// a's bucket is read for events stored by an earlier attempt.
		p, _ := newPlan(t, Env{Check: []bucket.Key{a}}, bson.E{Key: "txnNumber", Value: int64(1)})
		for _, r := range [][]byte{rwtest.CursorReply(t, 0, bucketA), rwtest.CursorReply(t, 0)} {
			nextStep(t, p)
			if err := p.Feed([][]byte{r}); err != nil {
				t.Fatal(err)
			}
		}
		check := nextStep(t, p)
		if k := commandName(check[0].Body); len(check) != 1 || k != "find" {
			t.Fatalf("want the check's read of a's bucket, got %d commands (%s)", len(check), k)
		}
		if err := p.Feed([][]byte{droppedReply(t)}); err != nil {
			t.Fatalf("feed with a dropped collection: %v", err)
		}
		if again := nextStep(t, p); !sameStep(again, check) {
			t.Fatal("the check's read is not sent again as it was")
		}
		if err := p.Feed([][]byte{rwtest.CursorReply(t, 0)}); err != nil {
			t.Fatal(err)
		}
		if s := nextStep(t, p); len(s) != 1 || isWrite(s) {
			t.Fatalf("want b's fill probe next, got %d commands", len(s))
		}
	})

	t.Run("bounded", func(t *testing.T) {
		p, _ := newPlan(t, Env{})
		for i := 0; i < maxRereads; i++ {
			nextStep(t, p)
			if err := p.Feed([][]byte{droppedReply(t), rwtest.CursorReply(t, 0)}); err != nil {
				t.Fatalf("reread %d: %v", i+1, err)
			}
		}
		nextStep(t, p)
		err := p.Feed([][]byte{droppedReply(t), rwtest.CursorReply(t, 0)})
		if err == nil || !strings.Contains(err.Error(), "load bucket fill") || !strings.Contains(err.Error(), "42P01") {
			t.Fatalf("after %d rereads: %v, want the upstream's error", maxRereads, err)
		}
	})

	t.Run("other errors fail at once", func(t *testing.T) {
		p, _ := newPlan(t, Env{})
		nextStep(t, p)
		denied := rwtest.Doc(t, bson.D{{Key: "ok", Value: 0.0}, {Key: "code", Value: int32(13)}, {Key: "errmsg", Value: "not authorized"}})
		if err := p.Feed([][]byte{denied, rwtest.CursorReply(t, 0)}); err == nil || !strings.Contains(err.Error(), "not authorized") {
			t.Fatalf("feed: %v", err)
		}
	})
}

// commandName is the name of the command body sends.
func commandName(body []byte) string {
	e, err := bson.Raw(body).IndexErr(0)
	if err != nil {
		return ""
	}
	return e.Key()
}
