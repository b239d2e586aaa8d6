package e2e

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/tsproxy/tsproxy/proxy"
	"github.com/tsproxy/tsproxy/wire"
)

// bystander is a Go driver client, connected and used before some bad
// input reaches the same proxy, that must keep working afterwards.
type bystander struct {
	t    testing.TB
	c    *mongo.Client
	coll *mongo.Collection
	n    int
}

func newBystander(t testing.TB, p *testProxy) *bystander {
	t.Helper()
	b := &bystander{t: t, c: connect(t, p.URI())}
	b.coll = b.c.Database(uniqueDB(t)).Collection("bystander")
	b.check()
	return b
}

// check inserts one more document and reads all back.
func (b *bystander) check() {
	b.t.Helper()
	ctx := ctxFor(b.t)
	if _, err := b.coll.InsertOne(ctx, bson.D{{Key: "_id", Value: b.n}}); err != nil {
		b.t.Fatalf("bystander insert: %v", err)
	}
	b.n++
	n, err := b.coll.CountDocuments(ctx, bson.D{})
	if err != nil {
		b.t.Fatalf("bystander count: %v", err)
	}
	if n != int64(b.n) {
		b.t.Fatalf("bystander counts %d documents, want %d", n, b.n)
	}
}

// waitConnections waits until the proxy holds want client connections.
func waitConnections(t testing.TB, p *testProxy, want int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for p.srv.Connections() != want {
		if time.Now().After(deadline) {
			t.Fatalf("proxy holds %d client connections, want %d", p.srv.Connections(), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// header builds a 16-byte message header.
func header(length int32, op wire.OpCode) []byte {
	return wire.Header{MessageLength: length, RequestID: 7, OpCode: op}.Append(nil)
}

// TestBadInputFrames sends broken frames over raw TCP. Each gets its
// specific outcome, the proxy releases the connection, and a Go driver
// client already connected to the same proxy keeps working.
func TestBadInputFrames(t *testing.T) {
	t.Parallel()
	p := startProxy(t, proxyOptions{})
	by := newBystander(t, p)
	// The bystander's pool and monitor connections.
	base := p.srv.Connections()

	t.Run("oversized length is refused before the body is read", func(t *testing.T) {
		c := dialRaw(t, p.addr)
		// Only the header is sent: a proxy that waited for the 50 MB body
		// (or allocated it) would not close at once.
		c.write(header(50_000_000, wire.OpMsg))
		c.expectClosed(3 * time.Second)
	})
	t.Run("length just over the maximum", func(t *testing.T) {
		c := dialRaw(t, p.addr)
		c.write(header(wire.MaxMsgLen+1, wire.OpMsg))
		c.expectClosed(3 * time.Second)
	})
	t.Run("negative length", func(t *testing.T) {
		c := dialRaw(t, p.addr)
		c.write(header(-1, wire.OpMsg))
		c.expectClosed(3 * time.Second)
	})
	t.Run("length shorter than a header", func(t *testing.T) {
		c := dialRaw(t, p.addr)
		c.write(header(10, wire.OpMsg))
		c.expectClosed(3 * time.Second)
	})
	t.Run("length that lies", func(t *testing.T) {
		c := dialRaw(t, p.addr)
		frame := append(header(1000, wire.OpMsg), make([]byte, 84)...) // 100 bytes of 1000
		c.write(frame)
		// The client stops sending: the proxy sees the frame end early
		// and closes.
		if err := c.nc.(*net.TCPConn).CloseWrite(); err != nil {
			t.Fatal(err)
		}
		c.expectClosed(3 * time.Second)
	})
	t.Run("garbage bytes", func(t *testing.T) {
		c := dialRaw(t, p.addr)
		// An HTTP request: "GET " read as a length is 542,393,671.
		c.write([]byte("GET / HTTP/1.1\r\nHost: localhost\r\n\r\n"))
		c.expectClosed(3 * time.Second)
	})
	t.Run("unknown opcode", func(t *testing.T) {
		c := dialRaw(t, p.addr)
		c.write(append(header(40, wire.OpCode(9999)), []byte("0123456789abcdef01234567")...))
		c.expectClosed(3 * time.Second)
	})
	t.Run("removed legacy opcode OP_INSERT", func(t *testing.T) {
		c := dialRaw(t, p.addr)
		body := append([]byte{0, 0, 0, 0}, "db.c\x00"...)
		body = append(body, marshal(t, bson.D{{Key: "x", Value: 1}})...)
		c.write(append(header(int32(16+len(body)), wire.OpCode(2002)), body...))
		c.expectClosed(3 * time.Second)
	})
	t.Run("client disconnects mid-frame", func(t *testing.T) {
		c := dialRaw(t, p.addr)
		ping := wire.AppendMsg(nil, 1, 0, 0, marshal(t, bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}}))
		c.write(ping[:len(ping)/2])
		waitConnections(t, p, base+1)
		c.nc.Close()
		// The proxy notices and lets the connection go.
		waitConnections(t, p, base)
	})
	t.Run("client disconnects mid-header", func(t *testing.T) {
		c := dialRaw(t, p.addr)
		c.write([]byte{0x30, 0, 0})
		waitConnections(t, p, base+1)
		c.nc.Close()
		waitConnections(t, p, base)
	})

	// Every bad connection is gone; the bystander never noticed.
	waitConnections(t, p, base)
	by.check()
	fresh := dialRaw(t, p.addr)
	fresh.ping()
}

// TestBadInputMessages sends well-framed messages with bad contents: each
// gets an error reply naming the problem, and the same connection serves
// the next request.
func TestBadInputMessages(t *testing.T) {
	t.Parallel()
	p := startProxy(t, proxyOptions{})
	by := newBystander(t, p)
	// Each case on a connection of its own, used before and after.
	var c *rawConn
	run := func(name string, f func(t *testing.T)) {
		t.Run(name, func(t *testing.T) {
			c = dialRaw(t, p.addr)
			c.ping()
			f(t)
		})
	}

	pingBody := marshal(t, bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}})

	run("invalid BSON in the body", func(t *testing.T) {
		// A document whose only element has type 0x99, which BSON lacks.
		doc := []byte{0, 0, 0, 0, 0x99, 'x', 0, 1, 2, 3, 4, 0}
		binary.LittleEndian.PutUint32(doc, uint32(len(doc)))
		id := c.nextID()
		c.write(wire.AppendMsg(nil, id, 0, 0, doc))
		errorReply(t, c.readMsgReply(id), 22, "InvalidBSON", "invalid BSON", "body")
		c.ping()
	})
	run("document length inside the body disagrees", func(t *testing.T) {
		doc := append([]byte(nil), pingBody...)
		binary.LittleEndian.PutUint32(doc, uint32(len(doc)+20)) // claims more than the frame holds
		id := c.nextID()
		c.write(wire.AppendMsg(nil, id, 0, 0, doc))
		errorReply(t, c.readMsgReply(id), 22, "InvalidBSON", "body")
		c.ping()
	})
	run("string without its NUL", func(t *testing.T) {
		// {s: "abc"} with the string's terminating NUL replaced: MongoDB
		// answers InvalidBSON; an upstream may drop the connection.
		doc := marshal(t, bson.D{{Key: "ping", Value: 1}, {Key: "s", Value: "abc"}, {Key: "$db", Value: "admin"}})
		i := strings.Index(string(doc), "abc")
		doc[i+3] = 'd'
		id := c.nextID()
		c.write(wire.AppendMsg(nil, id, 0, 0, doc))
		errorReply(t, c.readMsgReply(id), 22, "InvalidBSON", "invalid BSON")
		c.ping()
	})
	run("bad checksum", func(t *testing.T) {
		id := c.nextID()
		frame := wire.AppendMsg(nil, id, 0, wire.ChecksumPresent, pingBody)
		frame[len(frame)-1] ^= 0xff
		c.write(frame)
		errorReply(t, c.readMsgReply(id), 22, "InvalidBSON", "checksum mismatch")
		c.ping()
	})
	run("good checksum", func(t *testing.T) {
		id := c.nextID()
		c.write(wire.AppendMsg(nil, id, 0, wire.ChecksumPresent, pingBody))
		r := c.readMsgReply(id)
		if ok, _ := r.Lookup("ok").AsFloat64OK(); ok != 1 {
			t.Fatalf("checksummed ping: %v", r)
		}
	})
	run("unknown required flag bit", func(t *testing.T) {
		id := c.nextID()
		c.write(wire.AppendMsg(nil, id, 0, 1<<5, pingBody))
		errorReply(t, c.readMsgReply(id), 22, "InvalidBSON", "unknown required flag")
		c.ping()
	})
	run("two body sections", func(t *testing.T) {
		id := c.nextID()
		frame := wire.AppendMsg(nil, id, 0, 0, pingBody)
		frame = append(frame, 0)
		frame = append(frame, pingBody...)
		binary.LittleEndian.PutUint32(frame, uint32(len(frame)))
		c.write(frame)
		errorReply(t, c.readMsgReply(id), 22, "InvalidBSON", "2 body sections")
		c.ping()
	})
	run("unknown section kind", func(t *testing.T) {
		id := c.nextID()
		frame := wire.AppendMsg(nil, id, 0, 0, pingBody)
		frame = append(frame, 7, 1, 2, 3)
		binary.LittleEndian.PutUint32(frame, uint32(len(frame)))
		c.write(frame)
		errorReply(t, c.readMsgReply(id), 22, "InvalidBSON", "unknown section kind 7")
		c.ping()
	})
	run("invalid BSON with moreToCome gets no reply", func(t *testing.T) {
		doc := []byte{0, 0, 0, 0, 0x99, 'x', 0, 1, 2, 3, 4, 0}
		binary.LittleEndian.PutUint32(doc, uint32(len(doc)))
		c.write(wire.AppendMsg(nil, c.nextID(), 0, wire.MoreToCome, doc))
		// The next reply on the connection is the ping's, not an error
		// for the fire-and-forget message.
		c.ping()
	})
	run("invalid BSON in a legacy OP_QUERY", func(t *testing.T) {
		doc := []byte{0, 0, 0, 0, 0x99, 'x', 0, 1, 2, 3, 4, 0}
		binary.LittleEndian.PutUint32(doc, uint32(len(doc)))
		// wire.Query.Encode checks only the length prefix, so it frames
		// the bad document as sent by a broken client.
		q := wire.Query{FullCollectionName: "admin.$cmd", NumberToReturn: -1, Query: doc}
		id := c.nextID()
		frame, err := q.Encode(nil, wire.Header{RequestID: id})
		if err != nil {
			t.Fatal(err)
		}
		c.write(frame)
		h, rf := c.readFrame()
		if h.OpCode != wire.OpReply || h.ResponseTo != id {
			t.Fatalf("reply %s to %d, want OP_REPLY to %d", h.OpCode, h.ResponseTo, id)
		}
		var r wire.Reply
		if err := r.Decode(rf); err != nil {
			t.Fatal(err)
		}
		errorReply(t, bson.Raw(r.Documents[0]), 22, "InvalidBSON", "invalid BSON")
		c.ping()
	})
	run("OP_QUERY on a collection", func(t *testing.T) {
		q := wire.Query{FullCollectionName: "test.items", NumberToReturn: 1, Query: marshal(t, bson.D{})}
		id := c.nextID()
		frame, err := q.Encode(nil, wire.Header{RequestID: id})
		if err != nil {
			t.Fatal(err)
		}
		c.write(frame)
		h, rf := c.readFrame()
		var r wire.Reply
		if err := r.Decode(rf); err != nil || h.OpCode != wire.OpReply {
			t.Fatalf("reply %s: %v", h.OpCode, err)
		}
		body := bson.Raw(r.Documents[0])
		msg, _ := body.Lookup("errmsg").StringValueOK()
		if ok, _ := body.Lookup("ok").AsFloat64OK(); ok != 0 || !strings.Contains(msg, "only commands") {
			t.Fatalf("OP_QUERY on a collection: %v", body)
		}
		c.ping()
	})
	by.check()
}

// TestBadInputConnectionLimit: with MaxConnections 2, a third connection is
// answered with an error naming the limit and closed, while the first two
// keep working; once one goes, a new one is served.
func TestBadInputConnectionLimit(t *testing.T) {
	t.Parallel()
	p := startProxy(t, proxyOptions{edit: func(o *proxy.Options) { o.MaxConnections = 2 }})
	c1 := dialRaw(t, p.addr)
	c1.ping()
	c2 := dialRaw(t, p.addr)
	c2.ping()

	c3 := dialRaw(t, p.addr)
	id := c3.sendMsg(marshal(t, bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}}), 0)
	errorReply(t, c3.readMsgReply(id), 8001, "TooManyConnections", "connection limit of 2")
	c3.expectClosed(3 * time.Second)

	// A legacy handshake over the limit is refused in OP_REPLY.
	c4 := dialRaw(t, p.addr)
	q := wire.Query{FullCollectionName: "admin.$cmd", NumberToReturn: -1, Query: marshal(t, bson.D{{Key: "isMaster", Value: 1}})}
	frame, err := q.Encode(nil, wire.Header{RequestID: 77})
	if err != nil {
		t.Fatal(err)
	}
	c4.write(frame)
	h, rf := c4.readFrame()
	var r wire.Reply
	if err := r.Decode(rf); err != nil || h.OpCode != wire.OpReply || h.ResponseTo != 77 {
		t.Fatalf("refusal of a legacy handshake: %s to %d, %v", h.OpCode, h.ResponseTo, err)
	}
	errorReply(t, bson.Raw(r.Documents[0]), 8001, "TooManyConnections", "connection limit of 2")
	c4.expectClosed(3 * time.Second)

	c1.ping()
	c2.ping()
	waitConnections(t, p, 2)

	// One leaves; a newcomer is served.
	c1.nc.Close()
	waitConnections(t, p, 1)
	c5 := dialRaw(t, p.addr)
	c5.ping()
	c2.ping()

	// A driver over the limit sees the refusal as an error, not a hang.
	// (The driver keeps trying until its server selection timeout.)
	cl, err := mongo.Connect(options.Client().ApplyURI(p.URI()).SetServerSelectionTimeout(2 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Disconnect(context.Background())
	start := time.Now()
	err = cl.Ping(ctxFor(t), nil)
	if err == nil {
		t.Fatal("a driver connection over the limit succeeded")
	}
	if el := time.Since(start); el > 6*time.Second {
		t.Fatalf("refusal took %v", el)
	}
	if !strings.Contains(fmt.Sprint(err), "connection limit of 2") {
		t.Fatalf("driver error does not quote the proxy's refusal: %v", err)
	}
	c2.ping()
	c5.ping()
}
