package replycache

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// retryKey is the key of a retryable insert of session id (with uid when
// not empty) and txnNumber txn.
func retryKey(t *testing.T, id, uid string, txn int64) rewrite.RetryKey {
	t.Helper()
	lsid := bson.D{{Key: "id", Value: bson.Binary{Subtype: 4, Data: []byte(id)}}}
	if uid != "" {
		lsid = append(lsid, bson.E{Key: "uid", Value: bson.Binary{Data: []byte(uid)}})
	}
	body, err := bson.Marshal(bson.D{{Key: "insert", Value: "c"}, {Key: "lsid", Value: lsid}, {Key: "txnNumber", Value: txn}})
	if err != nil {
		t.Fatal(err)
	}
	k, ok, err := rewrite.RetryKeyOf(body)
	if !ok || err != nil {
		t.Fatalf("RetryKeyOf: %v %v", ok, err)
	}
	return k
}

func okReply(t *testing.T, n int) []byte {
	t.Helper()
	b, err := bson.Marshal(bson.D{{Key: "n", Value: int32(n)}, {Key: "ok", Value: 1.0}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// run begins key as the session's attempt, offers reply (nil: none) and
// finishes.
func run(t *testing.T, rc *Cache, key rewrite.RetryKey, op string, reply []byte) {
	t.Helper()
	out := rc.Begin(key, op)
	if out.Attempt == nil {
		t.Fatalf("txnNumber %d: not run (%v, reply %v)", key.TxnNumber, out.Err, out.Reply)
	}
	if reply != nil {
		out.Attempt.Offer(reply)
	}
	out.Attempt.Finish()
}

func TestReplyCacheSessionRules(t *testing.T) {
	rc := New(100, time.Hour)
	const op = "db.readings insert"
	run(t, rc, retryKey(t, "s1", "", 5), op, okReply(t, 3))

	// The same write again: its reply, not a run.
	out := rc.Begin(retryKey(t, "s1", "", 5), op)
	if out.Attempt != nil || out.Err != nil || !bytes.Equal(out.Reply, okReply(t, 3)) {
		t.Fatalf("retry: %+v", out)
	}
	// An older one: TransactionTooOld.
	out = rc.Begin(retryKey(t, "s1", "", 4), op)
	if ce, ok := out.Err.(*mongoerr.Error); !ok || ce.Code != mongoerr.TransactionTooOld {
		t.Fatalf("older txnNumber: %+v", out)
	}
	// The same txnNumber for another command: refused.
	out = rc.Begin(retryKey(t, "s1", "", 5), "db.readings delete")
	if ce, ok := out.Err.(*mongoerr.Error); !ok || ce.Code != mongoerr.BadValue || !strings.Contains(ce.Msg, "db.readings insert") {
		t.Fatalf("txnNumber reused by a delete: %+v", out)
	}
	// Another uid, or none against one, is another session.
	run(t, rc, retryKey(t, "s1", "userA", 1), op, okReply(t, 7))
	out = rc.Begin(retryKey(t, "s1", "userA", 1), op)
	if !bytes.Equal(out.Reply, okReply(t, 7)) {
		t.Fatalf("uid session: %+v", out)
	}
	out = rc.Begin(retryKey(t, "s1", "userB", 5), op)
	if out.Attempt == nil {
		t.Fatalf("another uid answered from s1's record: %+v", out)
	}
	out.Attempt.Finish() // no reply offered: nothing recorded
	if rc.Len() != 2 {
		t.Fatalf("%d sessions recorded, want 2", rc.Len())
	}
	// A newer write runs, told when the session's last write was
	// recorded, and replaces the session's record.
	rc.Now = func() time.Time { return time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC) }
	run(t, rc, retryKey(t, "s1", "", 6), op, okReply(t, 1))
	out = rc.Begin(retryKey(t, "s1", "", 7), op)
	if out.Attempt == nil || !out.Attempt.Previous.Equal(rc.Now()) {
		t.Fatalf("txnNumber 7: %+v, want an attempt whose Previous is txnNumber 6's record", out)
	}
	out.Attempt.Finish()
	if out = rc.Begin(retryKey(t, "s9", "", 1), op); out.Attempt == nil || !out.Attempt.Previous.IsZero() {
		t.Fatalf("a session never seen: %+v, want no Previous", out)
	}
	out.Attempt.Finish()
	if out = rc.Begin(retryKey(t, "s1", "", 5), op); out.Err == nil {
		t.Fatalf("txnNumber 5 after 6: %+v", out)
	}
	// A failed command is not recorded: its retry runs again.
	failed, _ := bson.Marshal(bson.D{{Key: "ok", Value: 0.0}, {Key: "code", Value: 91}})
	run(t, rc, retryKey(t, "s2", "", 1), op, failed)
	out = rc.Begin(retryKey(t, "s2", "", 1), op)
	if out.Attempt == nil || out.Attempt.Check {
		t.Fatalf("retry of a failed command: %+v", out)
	}
	out.Attempt.Finish()
}

func TestReplyCacheBoundAndTTL(t *testing.T) {
	const op = "db.c insert"
	rc := New(3, time.Hour)
	for i := range 5 {
		run(t, rc, retryKey(t, string(rune('a'+i)), "", 1), op, okReply(t, i))
	}
	if rc.Len() != 3 {
		t.Fatalf("%d records, want the bound 3", rc.Len())
	}
	// The two oldest are gone, young: a retry of them may still come, so
	// the miss is checked against what is stored.
	for _, id := range []string{"a", "b"} {
		out := rc.Begin(retryKey(t, id, "", 1), op)
		if out.Attempt == nil || !out.Attempt.Check {
			t.Fatalf("evicted %s: %+v, want a checked run", id, out)
		}
		out.Attempt.Finish()
	}
	for i, id := range []string{"c", "d", "e"} {
		if out := rc.Begin(retryKey(t, id, "", 1), op); !bytes.Equal(out.Reply, okReply(t, i+2)) {
			t.Fatalf("kept %s: %+v", id, out)
		}
	}
	// Used last, c survives the next record; d, now the least recently
	// used, does not.
	rc.Begin(retryKey(t, "c", "", 1), op)
	run(t, rc, retryKey(t, "f", "", 1), op, okReply(t, 0))
	if out := rc.Begin(retryKey(t, "c", "", 1), op); out.Reply == nil {
		t.Fatal("recently used record evicted first")
	}
	if out := rc.Begin(retryKey(t, "d", "", 1), op); out.Attempt == nil {
		t.Fatal("least recently used record kept")
	} else {
		out.Attempt.Finish()
	}

	// Old records evicted for room leave no doubt.
	now := time.Now()
	rc = New(1, time.Hour)
	rc.Now = func() time.Time { return now }
	run(t, rc, retryKey(t, "a", "", 1), op, okReply(t, 1))
	now = now.Add(RetryWindow + time.Second)
	run(t, rc, retryKey(t, "b", "", 1), op, okReply(t, 1))
	if out := rc.Begin(retryKey(t, "c", "", 1), op); out.Attempt == nil || out.Attempt.Check {
		t.Fatalf("after an old eviction: %+v, want an unchecked run", out)
	}

	// TTL: a record is forgotten after it.
	rc = New(10, 50*time.Millisecond)
	run(t, rc, retryKey(t, "a", "", 1), op, okReply(t, 1))
	if out := rc.Begin(retryKey(t, "a", "", 1), op); out.Reply == nil {
		t.Fatal("record missing before its TTL")
	}
	time.Sleep(150 * time.Millisecond)
	out := rc.Begin(retryKey(t, "a", "", 1), op)
	if out.Attempt == nil {
		t.Fatalf("record kept past its TTL: %+v", out)
	}
	out.Attempt.Finish()
}

// TestReplyCacheConcurrentAttempts: copies of one write that arrive while
// it runs wait for it and get its reply; when it ends without one, one
// copy runs, the others wait again.
func TestReplyCacheConcurrentAttempts(t *testing.T) {
	const op = "db.c insert"
	rc := New(100, time.Hour)
	key := retryKey(t, "s", "", 1)
	first := rc.Begin(key, op)
	if first.Attempt == nil {
		t.Fatal("first not run")
	}
	var ran, answered atomic.Int32
	var wg sync.WaitGroup
	results := make(chan Outcome, 3)
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := rc.Begin(key, op)
			if out.Attempt != nil {
				ran.Add(1)
				time.Sleep(20 * time.Millisecond) // runs while the others wait
				out.Attempt.Offer(okReply(t, 9))
				out.Attempt.Finish()
				return
			}
			answered.Add(1)
			results <- out
		}()
	}
	time.Sleep(50 * time.Millisecond)
	if ran.Load()+answered.Load() != 0 {
		t.Fatal("a copy went on while the first ran")
	}
	first.Attempt.Finish() // lost its outcome (an upstream failure)
	wg.Wait()
	close(results)
	if ran.Load() != 1 || answered.Load() != 2 {
		t.Fatalf("%d copies ran, %d answered; want 1 and 2", ran.Load(), answered.Load())
	}
	for out := range results {
		if !bytes.Equal(out.Reply, okReply(t, 9)) {
			t.Fatalf("copy answered %+v", out)
		}
	}

	// A copy that waits too long is refused, not run.
	rc.Wait = 30 * time.Millisecond
	next := retryKey(t, "s", "", 2)
	held := rc.Begin(next, op)
	out := rc.Begin(next, op)
	if ce, ok := out.Err.(*mongoerr.Error); out.Attempt != nil || !ok || ce.Code != mongoerr.ConflictingOperationInProgress || !strings.Contains(ce.Msg, "still running") {
		t.Fatalf("copy past the wait limit: %+v", out)
	}
	held.Attempt.Finish()
}

// BenchmarkReplyCache is the cache's cost per retryable write as the
// proxy pays it: the key read from the command, begin, offer of a typical
// reply, finish. Each goroutine is a driver with sessions of its own, each
// write a new txnNumber.
func BenchmarkReplyCache(b *testing.B) {
	rc := New(DefaultSize, DefaultTTL)
	reply, _ := bson.Marshal(bson.D{{Key: "n", Value: int32(100)}, {Key: "ok", Value: 1.0}})
	var driver atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		d := driver.Add(1)
		var bodies [64][]byte
		for s := range bodies {
			lsid := bson.D{{Key: "id", Value: bson.Binary{Subtype: 4, Data: []byte(fmt.Sprintf("%08d%08d", d, s))}}}
			bodies[s], _ = bson.Marshal(bson.D{{Key: "insert", Value: "c"}, {Key: "ordered", Value: true},
				{Key: "lsid", Value: lsid}, {Key: "txnNumber", Value: int64(1)}, {Key: "$db", Value: "db"}})
		}
		txn := int64(0)
		for pb.Next() {
			txn++
			k, ok, err := rewrite.RetryKeyOf(bodies[txn%64])
			if !ok || err != nil {
				b.Error("no key")
				return
			}
			k.TxnNumber = txn // as if the body carried it
			out := rc.Begin(k, "db.c insert")
			if out.Attempt == nil {
				b.Errorf("not run: %v", out.Err)
				return
			}
			out.Attempt.Offer(reply)
			out.Attempt.Finish()
		}
	})
}

// One user's record never answers another's write of the same lsid and
// txnNumber, and does not make it wait: MongoDB's sessions belong to
// their users.
func TestReplyCacheOwnedBySessionUsers(t *testing.T) {
	rc := New(100, time.Hour)
	key := retryKey(t, "session-1", "", 5)
	alice, bob, anon := key.OwnedBy("alice@admin\x00"), key.OwnedBy("bob@admin\x00"), key.OwnedBy("")
	running := rc.Begin(alice, "db.c insert")
	if running.Attempt == nil {
		t.Fatal("alice's write not run")
	}
	other := rc.Begin(bob, "db.c insert") // would wait for alice's if they shared a key
	if other.Attempt == nil {
		t.Fatal("bob's write of the same lsid waited for or was answered from alice's")
	}
	other.Attempt.Finish()
	running.Attempt.Offer(okReply(t, 10))
	running.Attempt.Finish()
	for _, k := range []rewrite.RetryKey{bob, anon} {
		out := rc.Begin(k, "db.c insert")
		if out.Attempt == nil || out.Reply != nil {
			t.Fatalf("%q got alice's recorded reply %v (%v)", k.Session, out.Reply, out.Err)
		}
		out.Attempt.Finish()
	}
	if out := rc.Begin(alice, "db.c insert"); !bytes.Equal(out.Reply, okReply(t, 10)) {
		t.Fatalf("alice's retry: %v %v, want her recorded reply", out.Reply, out.Err)
	}
}
