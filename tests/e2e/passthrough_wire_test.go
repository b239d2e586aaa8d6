package e2e

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/wire"
)

// Raw wire-protocol helpers: a client that speaks the protocol byte by byte
// over TCP, for what drivers never send (bad frames, legacy opcodes, hand
// negotiated compression).

// rawConn is a plain TCP connection to a proxy.
type rawConn struct {
	t     testing.TB
	nc    net.Conn
	reqID int32
}

func dialRaw(t testing.TB, addr string) *rawConn {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { nc.Close() })
	return &rawConn{t: t, nc: nc, reqID: 1000}
}

// write sends raw bytes.
func (c *rawConn) write(b []byte) {
	c.t.Helper()
	_ = c.nc.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.nc.Write(b); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// nextID returns a fresh requestID.
func (c *rawConn) nextID() int32 { c.reqID++; return c.reqID }

// marshal encodes a command document.
func marshal(t testing.TB, d any) []byte {
	t.Helper()
	b, err := bson.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// sendMsg sends an OP_MSG with body as its only section; it returns the
// requestID.
func (c *rawConn) sendMsg(body []byte, flags wire.MsgFlags) int32 {
	c.t.Helper()
	id := c.nextID()
	c.write(wire.AppendMsg(nil, id, 0, flags, body))
	return id
}

// readFrame reads one reply frame within 10s.
func (c *rawConn) readFrame() (wire.Header, []byte) {
	c.t.Helper()
	_ = c.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	h, frame, err := wire.ReadMessage(c.nc, nil, 0)
	if err != nil {
		c.t.Fatalf("reading reply: %v", err)
	}
	return h, frame
}

// readMsgReply reads an OP_MSG reply to reqID and returns its body.
func (c *rawConn) readMsgReply(reqID int32) bson.Raw {
	c.t.Helper()
	h, frame := c.readFrame()
	if h.OpCode != wire.OpMsg {
		c.t.Fatalf("reply opcode %s, want OP_MSG", h.OpCode)
	}
	if h.ResponseTo != reqID {
		c.t.Fatalf("reply responseTo %d, want %d", h.ResponseTo, reqID)
	}
	var m wire.Msg
	if err := m.Decode(frame); err != nil {
		c.t.Fatalf("decoding reply: %v", err)
	}
	return bson.Raw(m.Body)
}

// command runs one OP_MSG command and returns the reply body.
func (c *rawConn) command(cmd bson.D) bson.Raw {
	c.t.Helper()
	return c.readMsgReply(c.sendMsg(marshal(c.t, cmd), 0))
}

// ping runs {ping: 1} on admin and fails the test unless it answers ok:1.
func (c *rawConn) ping() {
	c.t.Helper()
	r := c.command(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}})
	if ok, _ := r.Lookup("ok").AsFloat64OK(); ok != 1 {
		c.t.Fatalf("ping: %v", r)
	}
}

// expectClosed asserts that the proxy closes the connection within d
// without sending a single byte.
func (c *rawConn) expectClosed(d time.Duration) {
	c.t.Helper()
	start := time.Now()
	_ = c.nc.SetReadDeadline(time.Now().Add(d))
	var buf [512]byte
	n, err := io.ReadAtLeast(c.nc, buf[:], 1)
	if n > 0 {
		c.t.Fatalf("proxy sent %d bytes (%q) instead of closing", n, buf[:n])
	}
	var ne net.Error
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, syscall.ECONNRESET):
		c.t.Logf("proxy closed the connection after %v", time.Since(start).Round(time.Millisecond))
	case errors.As(err, &ne) && ne.Timeout(), errors.Is(err, os.ErrDeadlineExceeded):
		c.t.Fatalf("proxy did not close the connection within %v", d)
	default:
		c.t.Fatalf("unexpected read error: %v", err)
	}
}

// errorReply checks that body is {ok: 0, code, codeName} with errmsg
// containing each of want.
func errorReply(t testing.TB, body bson.Raw, code int32, codeName string, want ...string) {
	t.Helper()
	if ok, _ := body.Lookup("ok").AsFloat64OK(); ok != 0 {
		t.Fatalf("want an error reply, got %v", body)
	}
	if got, _ := body.Lookup("code").AsInt64OK(); got != int64(code) {
		t.Fatalf("code %d, want %d: %v", got, code, body)
	}
	if got, _ := body.Lookup("codeName").StringValueOK(); got != codeName {
		t.Fatalf("codeName %q, want %q: %v", got, codeName, body)
	}
	msg, _ := body.Lookup("errmsg").StringValueOK()
	for _, w := range want {
		if !bytes.Contains([]byte(msg), []byte(w)) {
			t.Fatalf("errmsg %q does not mention %q", msg, w)
		}
	}
}

// upstreamHello is the upstream's own hello reply, read directly.
func upstreamHello(t testing.TB) bson.M {
	t.Helper()
	var m bson.M
	if err := direct(t).Database("admin").RunCommand(ctxFor(t), bson.D{{Key: "hello", Value: 1}}).Decode(&m); err != nil {
		t.Fatalf("upstream hello: %v", err)
	}
	return m
}

// TestLegacyOpQueryIsMaster: drivers' first handshake may be a legacy
// OP_QUERY on admin.$cmd; the proxy answers it with an OP_REPLY that
// presents a router.
func TestLegacyOpQueryIsMaster(t *testing.T) {
	t.Parallel()
	p := startProxy(t, proxyOptions{})
	up := upstreamHello(t)
	c := dialRaw(t, p.addr)
	for _, cmd := range []bson.D{
		{{Key: "isMaster", Value: 1}, {Key: "client", Value: bson.D{{Key: "application", Value: bson.D{{Key: "name", Value: "legacy"}}}}}},
		{{Key: "ismaster", Value: true}},
		// old drivers wrap the command with a read preference
		{{Key: "$query", Value: bson.D{{Key: "isMaster", Value: 1.0}}}, {Key: "$readPreference", Value: bson.D{{Key: "mode", Value: "primaryPreferred"}}}},
	} {
		q := wire.Query{FullCollectionName: "admin.$cmd", NumberToReturn: -1, Query: marshal(t, cmd)}
		id := c.nextID()
		frame, err := q.Encode(nil, wire.Header{RequestID: id})
		if err != nil {
			t.Fatal(err)
		}
		c.write(frame)
		h, rf := c.readFrame()
		if h.OpCode != wire.OpReply {
			t.Fatalf("%v: reply opcode %s, want OP_REPLY", cmd, h.OpCode)
		}
		if h.ResponseTo != id {
			t.Fatalf("responseTo %d, want %d", h.ResponseTo, id)
		}
		var r wire.Reply
		if err := r.Decode(rf); err != nil {
			t.Fatalf("decode OP_REPLY: %v", err)
		}
		if len(r.Documents) != 1 || r.CursorID != 0 {
			t.Fatalf("OP_REPLY with %d documents, cursor %d", len(r.Documents), r.CursorID)
		}
		checkRouterHello(t, bson.Raw(r.Documents[0]), "ismaster", up)
	}
	// The same connection then speaks OP_MSG, as drivers do after the handshake.
	c.ping()
}

// checkRouterHello asserts a hello reply presents a router with the
// upstream's limits and nothing of its topology.
func checkRouterHello(t testing.TB, r bson.Raw, primaryField string, up bson.M) {
	t.Helper()
	if ok, _ := r.Lookup("ok").AsFloat64OK(); ok != 1 {
		t.Fatalf("hello failed: %v", r)
	}
	if msg, _ := r.Lookup("msg").StringValueOK(); msg != "isdbgrid" {
		t.Fatalf("msg = %q, want isdbgrid: %v", msg, r)
	}
	if b, ok := r.Lookup(primaryField).BooleanOK(); !ok || !b {
		t.Fatalf("%s is not true: %v", primaryField, r)
	}
	for _, k := range []string{"hosts", "passives", "arbiters", "setName", "primary", "me", "topologyVersion", "secondary", "setVersion"} {
		if _, err := r.LookupErr(k); err == nil {
			t.Fatalf("hello reply leaks %q: %v", k, r)
		}
	}
	for _, k := range []string{"maxWireVersion", "minWireVersion", "maxBsonObjectSize", "maxMessageSizeBytes", "maxWriteBatchSize"} {
		got, ok := r.Lookup(k).AsInt64OK()
		if !ok {
			t.Fatalf("hello reply lacks %s: %v", k, r)
		}
		want, ok := asInt64(up[k])
		if !ok {
			t.Fatalf("upstream hello lacks %s: %v", k, up)
		}
		if got != want {
			t.Fatalf("%s = %d through the proxy, %d upstream", k, got, want)
		}
	}
}

func asInt64(v any) (int64, bool) {
	switch n := v.(type) {
	case int32:
		return int64(n), true
	case int64:
		return n, true
	case float64:
		return int64(n), true
	}
	return 0, false
}

// TestCompressionNegotiatedOnTheWire proves real negotiation: the proxy
// picks the client's first supported compressor, then answers an
// OP_COMPRESSED request with an OP_COMPRESSED reply in that compressor.
func TestCompressionNegotiatedOnTheWire(t *testing.T) {
	t.Parallel()
	p := startProxy(t, proxyOptions{})
	for _, tc := range []struct {
		offer []string
		want  string
		id    uint8
	}{
		{[]string{"zstd", "snappy"}, "zstd", wire.CompressorZstd},
		{[]string{"snappy", "zlib"}, "snappy", wire.CompressorSnappy},
		{[]string{"unknown-codec", "zlib"}, "zlib", wire.CompressorZlib},
	} {
		t.Run(tc.want, func(t *testing.T) {
			c := dialRaw(t, p.addr)
			r := c.command(bson.D{{Key: "hello", Value: 1}, {Key: "compression", Value: tc.offer}, {Key: "$db", Value: "admin"}})
			arr, ok := r.Lookup("compression").ArrayOK()
			if !ok {
				t.Fatalf("hello reply has no compression array: %v", r)
			}
			vals, _ := arr.Values()
			if len(vals) != 1 || vals[0].StringValue() != tc.want {
				t.Fatalf("compression = %v, want [%q]", arr, tc.want)
			}

			// An OP_COMPRESSED ping, compressed with the chosen codec.
			id := c.nextID()
			plain := wire.AppendMsg(nil, id, 0, 0, marshal(t, bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}}))
			cf, err := wire.Compress(plain, tc.id)
			if err != nil {
				t.Fatal(err)
			}
			c.write(cf)
			h, rf := c.readFrame()
			if h.OpCode != wire.OpCompressed {
				t.Fatalf("reply to a compressed request came as %s, want OP_COMPRESSED", h.OpCode)
			}
			var cm wire.Compressed
			if err := cm.Decode(rf); err != nil {
				t.Fatal(err)
			}
			if cm.CompressorID != tc.id || cm.OriginalOpCode != wire.OpMsg {
				t.Fatalf("reply compressor %d original opcode %s, want %d OP_MSG", cm.CompressorID, cm.OriginalOpCode, tc.id)
			}
			inner, err := wire.Decompress(rf)
			if err != nil {
				t.Fatalf("decompress reply: %v", err)
			}
			var m wire.Msg
			if err := m.Decode(inner); err != nil {
				t.Fatal(err)
			}
			if h.ResponseTo != id {
				t.Fatalf("responseTo %d, want %d", h.ResponseTo, id)
			}
			if ok, _ := bson.Raw(m.Body).Lookup("ok").AsFloat64OK(); ok != 1 {
				t.Fatalf("compressed ping reply: %v", bson.Raw(m.Body))
			}
			// An uncompressed request on the same connection is answered
			// uncompressed.
			c.ping()
		})
	}

	t.Run("none offered", func(t *testing.T) {
		c := dialRaw(t, p.addr)
		r := c.command(bson.D{{Key: "hello", Value: 1}, {Key: "$db", Value: "admin"}})
		if _, err := r.LookupErr("compression"); err == nil {
			t.Fatalf("compression in reply though none was offered: %v", r)
		}
		// A compressed message with a compressor never negotiated is a
		// protocol violation: the connection is closed, not answered in a
		// codec the client may not read.
		cf, err := wire.Compress(wire.AppendMsg(nil, c.nextID(), 0, 0, marshal(t, bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}})), wire.CompressorZstd)
		if err != nil {
			t.Fatal(err)
		}
		c.write(cf)
		c.expectClosed(5 * time.Second)
	})
}

// TestPassthroughMoreToComeAndExhaust: a fire-and-forget (moreToCome)
// write gets no reply but is applied; a getMore that allows exhaust gets
// exactly one reply, without moreToCome, so the request/reply pairing of
// the connection stays intact.
func TestPassthroughMoreToComeAndExhaust(t *testing.T) {
	t.Parallel()
	p := startProxy(t, proxyOptions{})
	db := uniqueDB(t)
	c := dialRaw(t, p.addr)
	c.ping()

	// Unacknowledged insert of 6 documents.
	var docs bson.A
	for i := 0; i < 6; i++ {
		docs = append(docs, bson.D{{Key: "_id", Value: i}})
	}
	c.sendMsg(marshal(t, bson.D{{Key: "insert", Value: "fire"}, {Key: "documents", Value: docs},
		{Key: "writeConcern", Value: bson.D{{Key: "w", Value: 0}}}, {Key: "$db", Value: db}}), wire.MoreToCome)
	// The next frame read is the ping's reply: nothing answered the insert.
	c.ping()
	ctx := ctxFor(t)
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := direct(t).Database(db).Collection("fire").CountDocuments(ctx, bson.D{})
		if err != nil {
			t.Fatal(err)
		}
		if n == 6 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("unacknowledged insert: %d of 6 documents stored", n)
		}
		time.Sleep(20 * time.Millisecond)
	}

	r := c.command(bson.D{{Key: "find", Value: "fire"}, {Key: "sort", Value: bson.D{{Key: "_id", Value: 1}}}, {Key: "batchSize", Value: 2}, {Key: "$db", Value: db}})
	cursorID, ok := r.Lookup("cursor", "id").Int64OK()
	if !ok || cursorID == 0 {
		t.Fatalf("find opened no cursor: %v", r)
	}
	seen := 0
	countBatch := func(r bson.Raw, key string) {
		t.Helper()
		arr, ok := r.Lookup("cursor", key).ArrayOK()
		if !ok {
			t.Fatalf("reply without cursor.%s: %v", key, r)
		}
		vals, _ := arr.Values()
		for _, v := range vals {
			id, _ := v.Document().Lookup("_id").AsInt64OK()
			if id != int64(seen) {
				t.Fatalf("document %d has _id %d", seen, id)
			}
			seen++
		}
	}
	countBatch(r, "firstBatch")

	id := c.sendMsg(marshal(t, bson.D{{Key: "getMore", Value: cursorID}, {Key: "collection", Value: "fire"}, {Key: "batchSize", Value: 2}, {Key: "$db", Value: db}}), wire.ExhaustAllowed)
	h, frame := c.readFrame()
	if h.ResponseTo != id || h.OpCode != wire.OpMsg {
		t.Fatalf("exhaust getMore reply: %s to %d, want OP_MSG to %d", h.OpCode, h.ResponseTo, id)
	}
	var m wire.Msg
	if err := m.Decode(frame); err != nil {
		t.Fatal(err)
	}
	if m.Flags&wire.MoreToCome != 0 {
		t.Fatalf("the proxy streamed an exhaust reply (flags %#x)", m.Flags)
	}
	countBatch(bson.Raw(m.Body), "nextBatch")
	// Nothing else arrives unasked: the next reply is the ping's.
	c.ping()
	r = c.command(bson.D{{Key: "getMore", Value: cursorID}, {Key: "collection", Value: "fire"}, {Key: "$db", Value: db}})
	countBatch(r, "nextBatch")
	if seen != 6 {
		t.Fatalf("read %d of 6 documents", seen)
	}
}
