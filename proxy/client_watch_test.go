package proxy

import (
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/wire"
)

// TestClientLeavesDuringStalledReply: an upstream stops answering a find
// mid-reply and the client gives up and closes. Before the watch, the
// client's slot and its upstream connection stayed held until the
// upstream closed (here: never).
func TestClientLeavesDuringStalledReply(t *testing.T) {
	upAddr, open := stallServer(t, func(name string, _ bson.Raw) bool { return name == "find" })
	s, addr := startRawProxy(t, upAddr, func(o *Options) { o.ClientWatchAfter = 50 * time.Millisecond })
	c := dialWire(t, addr)
	if ok := c.cmd(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}}); ok.Lookup("ok").Double() != 1 {
		t.Fatalf("ping: %v", ok)
	}
	c.send(0, bson.D{{Key: "find", Value: "x"}, {Key: "$db", Value: "db"}})
	if _, _, err := c.read(300 * time.Millisecond); err == nil {
		t.Fatal("the stalled find was answered")
	}
	c.nc.Close()
	deadline := time.Now().Add(5 * time.Second)
	for s.Connections() != 0 || open.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("5s after the client left: %d client connection(s) held, %d upstream connection(s) open", s.Connections(), open.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestWatchedClientKeepsItsRequests: a client still there while a slow
// upstream answers is not taken for gone, and a request it sends before
// the reply (read by the watch) is answered next, in order.
func TestWatchedClientKeepsItsRequests(t *testing.T) {
	upAddr := slowFindUpstream(t, 300*time.Millisecond)
	_, addr := startRawProxy(t, upAddr, func(o *Options) { o.ClientWatchAfter = 20 * time.Millisecond })
	c := dialWire(t, addr)
	for round := range 3 {
		find := c.send(0, bson.D{{Key: "find", Value: "x"}, {Key: "$db", Value: "db"}})
		time.Sleep(100 * time.Millisecond) // the watch is peeking by now
		ping := c.send(0, bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}})
		for _, want := range []struct {
			id   int32
			name string
		}{{find, "find"}, {ping, "ping"}} {
			h, body, err := c.read(5 * time.Second)
			if err != nil {
				t.Fatalf("round %d: reading the %s reply: %v", round, want.name, err)
			}
			if h.ResponseTo != want.id || body.Lookup("cmd").StringValue() != want.name {
				t.Fatalf("round %d: got %v (responseTo %d), want the %s reply (to %d)", round, body, h.ResponseTo, want.name, want.id)
			}
		}
	}
}

// TestMoreToComeThenCloseStillWrites: a client that sends a moreToCome
// (w:0) insert and closes has ended normally; it waits for no reply.
// While the proxy waited on a slow catalog read before sending the
// insert, the watch took the close for a client that gave up and closed
// the upstream connection: the insert never reached the upstream.
func TestMoreToComeThenCloseStillWrites(t *testing.T) {
	inserted := make(chan struct{}, 10)
	upAddr, _, _ := scriptedUpstream(t, func(m *wire.Msg) ([]byte, bool) {
		var body []byte
		switch m.CommandName() {
		case "find": // the catalog read
			time.Sleep(300 * time.Millisecond)
			body, _ = bson.Marshal(bson.D{{Key: "cursor", Value: bson.D{{Key: "firstBatch", Value: bson.A{}}, {Key: "id", Value: int64(0)}, {Key: "ns", Value: "x.y"}}}, {Key: "ok", Value: 1.0}})
		case "insert":
			inserted <- struct{}{}
			body, _ = bson.Marshal(bson.D{{Key: "n", Value: 1}, {Key: "ok", Value: 1.0}})
		default:
			body, _ = bson.Marshal(bson.D{{Key: "ok", Value: 1.0}})
		}
		return body, false
	})
	_, addr := startRawProxy(t, upAddr, func(o *Options) {
		o.ClientWatchAfter = 20 * time.Millisecond
		o.CreateTimeseries = "proxy"
		o.CatalogLease = time.Millisecond
	})
	c := dialWire(t, addr)
	c.cmd(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}})
	time.Sleep(20 * time.Millisecond)
	c.send(wire.MoreToCome, bson.D{{Key: "insert", Value: "x"}, {Key: "documents", Value: bson.A{bson.D{{Key: "a", Value: 1}}}}, {Key: "$db", Value: "db"}})
	time.Sleep(5 * time.Millisecond)
	c.nc.Close()
	select {
	case <-inserted:
	case <-time.After(3 * time.Second):
		t.Fatal("the moreToCome insert never reached the upstream after its client closed")
	}
}

// TestIdleAfterWatchedRequest: the watch's read deadline is cleared
// after a watched request; an idle client is never timed out.
func TestIdleAfterWatchedRequest(t *testing.T) {
	upAddr := slowFindUpstream(t, 200*time.Millisecond)
	_, addr := startRawProxy(t, upAddr, func(o *Options) {
		o.ClientWatchAfter = 20 * time.Millisecond
		o.FrameTimeout = 100 * time.Millisecond
	})
	c := dialWire(t, addr)
	for round := range 3 {
		c.cmd(bson.D{{Key: "find", Value: "x"}, {Key: "$db", Value: "db"}})
		time.Sleep(400 * time.Millisecond) // idle past FrameTimeout
		if r := c.cmd(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}}); r.Lookup("cmd").StringValue() != "ping" {
			t.Fatalf("round %d: %v", round, r)
		}
	}
}

// slowFindUpstream is a scripted upstream that answers every command
// with {cmd: <its name>, ok: 1}, a find after delay.
func slowFindUpstream(t *testing.T, delay time.Duration) string {
	t.Helper()
	upAddr, _, _ := scriptedUpstream(t, func(m *wire.Msg) ([]byte, bool) {
		if m.CommandName() == "find" {
			time.Sleep(delay)
		}
		body, _ := bson.Marshal(bson.D{{Key: "cmd", Value: m.CommandName()}, {Key: "ok", Value: 1.0}})
		return body, false
	})
	return upAddr
}
