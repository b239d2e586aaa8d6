package proxy

import (
	"bufio"
	"net"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// TestBacklogCountedAfterFreeze: a staged insert counts its events
// into the proxy's backlog (tier.State.staged) only once its client has
// the reply, after it let freezes in. A freeze that takes the insert's
// events in between (here a flush on another connection while the reply
// is on its way) resets the backlog first, and the late count then stays
// with nothing staged: no merge runs (nothing is listed) to reset it, so
// once it reaches maxStaged every later insert of the rule on this proxy
// waits and fails, for good.
func TestBacklogCountedAfterFreeze(t *testing.T) {
	_, addr := startWireProxy(t, stagedWireRule+"    maxStaged: 1000\n", "", nil)
	// A client with a small receive buffer that does not read its reply
	// at once: the insert's large reply (a write error for each rejected
	// event) stays on its way.
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		if err != nil {
			return err
		}
		return serr
	}}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	slow := &wireClient{t: t, nc: nc, r: bufio.NewReader(nc)}
	slow.cmd(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}})

	t0 := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	docs := bson.A{}
	for i := 0; i < 1000; i++ {
		docs = append(docs, bson.D{{Key: "ts", Value: t0.Add(time.Duration(i) * time.Second)}, {Key: "sensor", Value: "a"}})
	}
	for i := 0; i < 60000; i++ {
		docs = append(docs, bson.D{{Key: "sensor", Value: "no time"}}) // rejected: a write error each
	}
	id := slow.send(0, bson.D{{Key: "insert", Value: "readings"}, {Key: "documents", Value: docs}, {Key: "ordered", Value: false}, {Key: "$db", Value: "db"}})
	time.Sleep(2 * time.Second) // stored; its reply is being written

	other := dialWire(t, addr)
	if r := other.cmd(bson.D{{Key: "tsproxyFlush", Value: "db.readings"}, {Key: "$db", Value: "admin"}}); !bsonOK(r) {
		t.Fatalf("flush: %s", r)
	}
	h, body, err := slow.read(30 * time.Second)
	if err != nil || h.ResponseTo != id {
		t.Fatalf("insert reply: %v", err)
	}
	if n, _ := body.Lookup("n").AsInt64OK(); n != 1000 {
		t.Fatalf("insert stored %d, want 1000", n)
	}
	slow.cmd(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}}) // its bookkeeping ran
	if r := other.cmd(bson.D{{Key: "tsproxyFlush", Value: "db.readings"}, {Key: "$db", Value: "admin"}}); !bsonOK(r) {
		t.Fatalf("flush: %s", r)
	}
	if n := wireCount(t, other); n != 1000 {
		t.Fatalf("count %d, want 1000", n)
	}
	// Everything is merged, nothing is staged: an insert has room.
	time.Sleep(2 * time.Second) // a background round or two
	r := other.cmd(bson.D{{Key: "insert", Value: "readings"}, {Key: "documents", Value: bson.A{bson.D{{Key: "ts", Value: t0}, {Key: "sensor", Value: "b"}}}},
		{Key: "maxTimeMS", Value: 3000}, {Key: "$db", Value: "db"}})
	if !bsonOK(r) {
		code, _ := r.Lookup("code").AsInt64OK()
		t.Fatalf("an insert with nothing staged waited for room and failed (code %d, MaxTimeMSExpired is %d): %s", code, mongoerr.MaxTimeMSExpired, r.Lookup("errmsg"))
	}
}
