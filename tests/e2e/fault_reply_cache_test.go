package e2e

import (
	"bufio"
	"crypto/rand"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/wire"
)

// clientInsert matches an app's insert into coll among client→proxy
// frames.
func clientInsert(coll string) func(frame []byte) bool {
	return func(frame []byte) bool {
		var m wire.Msg
		if err := m.Decode(frame); err != nil {
			return false
		}
		if m.CommandName() != "insert" {
			return false
		}
		name, _ := bson.Raw(m.Body).Lookup("insert").StringValueOK()
		return name == coll
	}
}

// TestFaultClientReplyLostRetry (the client's side): the
// proxy stored the insert and wrote its reply, but the client's connection
// broke before the driver read it (the relay sits between the client and
// the proxy and drops the reply). The driver retries with the same lsid
// and txnNumber on a new connection; the proxy knows the buckets' fills, so
// only its reply cache stands between the retry and a second copy of every
// event (or a second count of every hit). Each event is stored, each hit
// counted, exactly once.
func TestFaultClientReplyLostRetry(t *testing.T) {
	t.Parallel()
	t.Run("events", func(t *testing.T) {
		t.Parallel()
		for _, n := range []int{20, 170} { // a $push upsert; complete buckets and an upsert
			db := uniqueDB(t)
			p := startProxy(t, proxyOptions{yaml: readingsRule(db, 1000)})
			r := newRelay(t, p.addr)
			ctx := ctxFor(t)
			coll := connect(t, r.URI(), "retryWrites=true").Database(db).Collection("readings")
			base := time.Date(2026, 8, 1, 5, 0, 0, 0, time.UTC)
			warm := seriesEvents(10, "s1", base)
			if _, err := coll.InsertMany(ctx, docsOf(warm)); err != nil {
				t.Fatal(err)
			}
			batch := seriesEvents(n-10, "s1", base.Add(time.Minute))
			batch = append(batch, seriesEvents(10, "s2", base)...)
			r.CutReplyOf(1, clientInsert("readings"))
			res, err := coll.InsertMany(ctx, docsOf(batch))
			if r.cuts.Load() != 1 {
				t.Fatalf("the relay cut %d replies, want 1 (err %v)", r.cuts.Load(), err)
			}
			if err != nil {
				t.Fatalf("the driver's retry failed: %v", err)
			}
			if len(res.InsertedIDs) != len(batch) {
				t.Fatalf("retry reported %d inserted, want %d", len(res.InsertedIDs), len(batch))
			}
			got := storedIDs(t, ctx, db)
			stored := 0
			for _, e := range append(warm, batch...) {
				if got[e.id] != 1 {
					t.Fatalf("%d events: event %v stored %d times after a retried insert", n, e.id, got[e.id])
				}
			}
			for _, c := range got {
				stored += c
			}
			if stored != len(warm)+len(batch) {
				t.Fatalf("%d events stored, want %d", stored, len(warm)+len(batch))
			}
			if c, err := coll.CountDocuments(ctx, bson.D{}); err != nil || c != int64(stored) {
				t.Fatalf("count through the proxy: %d %v, want %d", c, err, stored)
			}
			t.Logf("%d events: reply cut once, retry answered; %d events in, %d stored", n, len(warm)+len(batch), stored)
		}
	})
	t.Run("counter", func(t *testing.T) {
		t.Parallel()
		db := uniqueDB(t)
		p := startProxy(t, proxyOptions{yaml: counterRule(db)})
		r := newRelay(t, p.addr)
		ctx := ctxFor(t)
		coll := connect(t, r.URI(), "retryWrites=true").Database(db).Collection("hits")
		warm, want := genHits(300, 21)
		if _, err := coll.InsertMany(ctx, warm); err != nil {
			t.Fatal(err)
		}
		batch, wantBatch := genHits(500, 22)
		for k, c := range wantBatch {
			want[k] += c
		}
		r.CutReplyOf(1, clientInsert("hits"))
		if _, err := coll.InsertMany(ctx, batch); err != nil {
			t.Fatalf("the driver's retry failed: %v", err)
		}
		if r.cuts.Load() != 1 {
			t.Fatalf("the relay cut %d replies, want 1", r.cuts.Load())
		}
		got, total := counterBuckets(t, ctx, db)
		if total != 800 {
			t.Fatalf("%d hits counted, want 800", total)
		}
		for k, c := range want {
			if got[k] != c {
				t.Fatalf("%v counted %d, want %d", k, got[k], c)
			}
		}
		t.Logf("counter: reply cut once, retry answered; 800 hits in, %d counted", total)
	})
}

// rawClient speaks OP_MSG to the proxy itself, to send the very same
// retryable write twice (as a driver's retry does) at moments the test
// picks.
type rawClient struct {
	t  *testing.T
	nc net.Conn
	r  *bufio.Reader
	id int32
}

func dialRawClient(t *testing.T, addr string) *rawClient {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return &rawClient{t: t, nc: nc, r: bufio.NewReader(nc)}
}

// run sends body with docs as its "documents" sequence and returns the
// reply's body.
func (c *rawClient) run(body bson.D, docs []any) (bson.Raw, error) {
	raw, err := bson.Marshal(body)
	if err != nil {
		return nil, err
	}
	m := wire.Msg{Body: raw}
	if docs != nil {
		seq := wire.Sequence{Identifier: "documents"}
		for _, d := range docs {
			b, err := bson.Marshal(d)
			if err != nil {
				return nil, err
			}
			seq.Documents = append(seq.Documents, b)
		}
		m.Sequences = []wire.Sequence{seq}
	}
	c.id++
	frame, err := m.Encode(nil, wire.Header{RequestID: c.id})
	if err != nil {
		return nil, err
	}
	_ = c.nc.SetDeadline(time.Now().Add(time.Minute))
	if _, err := c.nc.Write(frame); err != nil {
		return nil, err
	}
	_, rf, err := wire.ReadMessage(c.r, nil, 48_000_000)
	if err != nil {
		return nil, err
	}
	var reply wire.Msg
	if err := reply.Decode(rf); err != nil {
		return nil, err
	}
	return bson.Raw(reply.Body), nil
}

func newLsid(t *testing.T) bson.D {
	var id [16]byte
	if _, err := rand.Read(id[:]); err != nil {
		t.Fatal(err)
	}
	return bson.D{{Key: "id", Value: bson.Binary{Subtype: 4, Data: id[:]}}}
}

// sendCopies sends copies of one command at once, each on a raw
// connection of its own, and returns their replies (failing the test on
// a connection error).
func sendCopies(t *testing.T, addr string, copies int, body bson.D, docs []any) []bson.Raw {
	t.Helper()
	replies := make([]bson.Raw, copies)
	errs := make([]error, copies)
	var wg sync.WaitGroup
	for i := range copies {
		c := dialRawClient(t, addr)
		wg.Add(1)
		go func() {
			defer wg.Done()
			replies[i], errs[i] = c.run(body, docs)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("copy %d: %v", i, err)
		}
	}
	return replies
}

func retryableInsert(db, coll string, lsid bson.D, txn int64) bson.D {
	return bson.D{{Key: "insert", Value: coll}, {Key: "ordered", Value: true},
		{Key: "lsid", Value: lsid}, {Key: "txnNumber", Value: txn}, {Key: "$db", Value: db}}
}

// TestReplyCacheConcurrentRetries: the same retryable insert (same lsid
// and txnNumber) arrives on several connections at once, as when a
// driver's retry overtakes its first attempt: it runs once, every copy
// gets the first's reply, and the events are stored once. Then the
// session's rules: a retry after a later write of the session is
// TransactionTooOld (225), as on MongoDB; the same txnNumber used for
// another command is refused.
func TestReplyCacheConcurrentRetries(t *testing.T) {
	t.Parallel()
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: readingsRule(db, 1000)})
	ctx := ctxFor(t)
	lsid := newLsid(t)
	base := time.Date(2026, 8, 2, 5, 0, 0, 0, time.UTC)
	for round, n := range []int{30, 300} {
		txn := int64(round + 1)
		batch := seriesEvents(n, "s1", base.Add(time.Duration(round)*time.Hour))
		const copies = 4
		replies := sendCopies(t, p.addr, copies, retryableInsert(db, "readings", lsid, txn), docsOf(batch))
		for i := range copies {
			if ok, _ := replies[i].Lookup("ok").AsFloat64OK(); ok != 1 {
				t.Fatalf("copy %d: %s", i, short(replies[i]))
			}
			if got, _ := replies[i].Lookup("n").AsInt64OK(); got != int64(n) {
				t.Fatalf("copy %d: n = %d, want %d (%s)", i, got, n, short(replies[i]))
			}
		}
		got := storedIDs(t, ctx, db)
		for _, e := range batch {
			if got[e.id] != 1 {
				t.Fatalf("%d copies of one retryable insert: event %v stored %d times", copies, e.id, got[e.id])
			}
		}
	}
	total := 0
	for _, c := range storedIDs(t, ctx, db) {
		total += c
	}
	if total != 330 {
		t.Fatalf("%d events stored, want 330", total)
	}
	// A stale retry of txnNumber 1 after txnNumber 2.
	c := dialRawClient(t, p.addr)
	reply, err := c.run(retryableInsert(db, "readings", lsid, 1), docsOf(seriesEvents(5, "s9", base)))
	if err != nil {
		t.Fatal(err)
	}
	if code, _ := reply.Lookup("code").AsInt64OK(); code != 225 || !strings.Contains(reply.Lookup("errmsg").StringValue(), "txnNumber 2") {
		t.Fatalf("stale retry: %s, want TransactionTooOld (225) naming txnNumber 2", reply)
	}
	// txnNumber 2 again, but a delete: not a retry of the insert.
	del := bson.D{{Key: "delete", Value: "readings"}, {Key: "deletes", Value: bson.A{bson.D{{Key: "q", Value: bson.D{}}, {Key: "limit", Value: 0}}}},
		{Key: "lsid", Value: lsid}, {Key: "txnNumber", Value: int64(2)}, {Key: "$db", Value: db}}
	if reply, err = c.run(del, nil); err != nil {
		t.Fatal(err)
	}
	if code, _ := reply.Lookup("code").AsInt64OK(); code != 2 {
		t.Fatalf("txnNumber reused by another command: %s, want BadValue (2)", reply)
	}
	total = 0
	for _, n := range storedIDs(t, ctx, db) {
		total += n
	}
	if total != 330 {
		t.Fatalf("after refused writes %d events stored, want 330", total)
	}
	// A txnNumber without lsid is refused as MongoDB refuses it.
	noLsid := bson.D{{Key: "insert", Value: "readings"}, {Key: "txnNumber", Value: int64(3)}, {Key: "$db", Value: db}}
	if reply, err = c.run(noLsid, docsOf(seriesEvents(1, "s9", base))); err != nil {
		t.Fatal(err)
	}
	if code, _ := reply.Lookup("code").AsInt64OK(); code != 72 {
		t.Fatalf("txnNumber without lsid: %s, want InvalidOptions (72)", reply)
	}
}

// TestReplyCacheConcurrentCounterRetries: copies of one retryable counter
// insert at once. The counter's write marks cannot catch a copy that runs
// while the first is in flight (its marks are not stored yet); the reply
// cache makes the copies wait for the first and answers them with its
// reply, so every hit is counted once.
func TestReplyCacheConcurrentCounterRetries(t *testing.T) {
	t.Parallel()
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: counterRule(db)})
	ctx := ctxFor(t)
	lsid := newLsid(t)
	hits, want := genHits(2000, 31)
	const copies = 4
	replies := sendCopies(t, p.addr, copies, retryableInsert(db, "hits", lsid, 7), hits)
	for i := range copies {
		if n, _ := replies[i].Lookup("n").AsInt64OK(); n != int64(len(hits)) {
			t.Fatalf("copy %d: %s, want n = %d", i, short(replies[i]), len(hits))
		}
	}
	got, total := counterBuckets(t, ctx, db)
	if total != int64(len(hits)) {
		t.Fatalf("%d copies of one retryable insert of %d hits: %d counted", copies, len(hits), total)
	}
	for k, c := range want {
		if got[k] != c {
			t.Fatalf("%v counted %d, want %d", k, got[k], c)
		}
	}
}

// short is a reply for a failure message, cut to a readable length.
func short(r bson.Raw) string {
	s := r.String()
	if len(s) > 400 {
		s = s[:400] + "..."
	}
	return s
}

// TestReplyCacheEvictedRetry: the cache holds one session; a second
// session's write evicts the first's record while a retry of it may still
// come. The retry, found nowhere in the cache, is checked against what is
// stored (the proxy knows the buckets' fills, so it would not check
// otherwise): its events are found and not written again, and the reply
// counts them all as inserted.
func TestReplyCacheEvictedRetry(t *testing.T) {
	t.Parallel()
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: readingsRule(db, 1000) + "limits:\n  retryCacheSize: 1\n"})
	ctx := ctxFor(t)
	base := time.Date(2026, 8, 3, 5, 0, 0, 0, time.UTC)
	a, b := newLsid(t), newLsid(t)
	first := seriesEvents(40, "s1", base)
	c := dialRawClient(t, p.addr)
	for _, w := range []struct {
		lsid bson.D
		evs  []sentEvent
	}{{a, first}, {b, seriesEvents(10, "s1", base.Add(time.Hour))}, {a, first}} {
		reply, err := c.run(retryableInsert(db, "readings", w.lsid, 1), docsOf(w.evs))
		if err != nil {
			t.Fatal(err)
		}
		if n, _ := reply.Lookup("n").AsInt64OK(); n != int64(len(w.evs)) {
			t.Fatalf("reply %s, want n = %d", short(reply), len(w.evs))
		}
	}
	got := storedIDs(t, ctx, db)
	total := 0
	for _, e := range first {
		if got[e.id] != 1 {
			t.Fatalf("event %v stored %d times after a retry whose record was evicted", e.id, got[e.id])
		}
	}
	for _, n := range got {
		total += n
	}
	if total != 50 {
		t.Fatalf("%d events stored, want 50", total)
	}
}

// TestReplyCacheRetriedDelete: a retryable deleteOne sent twice (its
// reply lost the first time) removes one event and answers n: 1 both
// times, as MongoDB does; run again it would remove a second event.
func TestReplyCacheRetriedDelete(t *testing.T) {
	t.Parallel()
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: readingsRule(db, 1000)})
	ctx := ctxFor(t)
	evs := seriesEvents(10, "s5", time.Date(2026, 8, 4, 5, 0, 0, 0, time.UTC))
	coll := connect(t, p.URI()).Database(db).Collection("readings")
	if _, err := coll.InsertMany(ctx, docsOf(evs)); err != nil {
		t.Fatal(err)
	}
	lsid := newLsid(t)
	del := bson.D{{Key: "delete", Value: "readings"},
		{Key: "deletes", Value: bson.A{bson.D{{Key: "q", Value: bson.D{{Key: "sensorId", Value: "s5"}}}, {Key: "limit", Value: 1}}}},
		{Key: "ordered", Value: true}, {Key: "lsid", Value: lsid}, {Key: "txnNumber", Value: int64(1)}, {Key: "$db", Value: db}}
	for attempt := range 2 {
		reply, err := dialRawClient(t, p.addr).run(del, nil)
		if err != nil {
			t.Fatal(err)
		}
		if n, _ := reply.Lookup("n").AsInt64OK(); n != 1 {
			t.Fatalf("attempt %d: %s, want n = 1", attempt+1, short(reply))
		}
	}
	if n, err := coll.CountDocuments(ctx, bson.D{}); err != nil || n != 9 {
		t.Fatalf("%d events left (%v), want 9: the retried deleteOne ran twice", n, err)
	}
}
