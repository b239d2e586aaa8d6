package proxy

import (
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/wire"
)

// limits.maxMessageBytes bounds one client message: a compressed message
// must not get around it by decompressing into something larger.
func TestCompressedMessageObeysMaxMessageBytes(t *testing.T) {
	const limit = 64 << 10
	_, addr := startWireProxy(t, "", "", func(o *Options) { o.MaxMessageBytes = limit })
	c := dialWire(t, addr)
	hello := c.cmd(bson.D{{Key: "hello", Value: 1}, {Key: "compression", Value: bson.A{"zlib"}}, {Key: "$db", Value: "admin"}})
	if got, _ := hello.Lookup("compression").ArrayOK(); got == nil {
		t.Fatalf("no compression negotiated: %s", hello)
	}
	body, _ := bson.Marshal(bson.D{{Key: "insert", Value: "plain"}, {Key: "documents", Value: bson.A{
		bson.D{{Key: "big", Value: strings.Repeat("x", 1<<20)}}}}, {Key: "$db", Value: "db"}})
	frame := wire.AppendMsg(nil, 99, 0, 0, body)
	cf, err := wire.Compress(frame, wire.CompressorZlib)
	if err != nil {
		t.Fatal(err)
	}
	if len(cf) > limit {
		t.Fatalf("compressed frame of %d bytes is over the limit itself", len(cf))
	}
	c.sendRaw(cf)
	h, reply, err := c.read(20 * time.Second)
	if err != nil {
		t.Fatalf("no reply: %v", err)
	}
	code, _ := reply.Lookup("code").AsInt64OK()
	msg, _ := reply.Lookup("errmsg").StringValueOK()
	if h.ResponseTo != 99 || code != 10334 || !strings.Contains(msg, "limits.maxMessageBytes") {
		t.Fatalf("a message of %d bytes sent compressed in %d, limit %d: reply to %d %s, want BSONObjectTooLarge naming the limit", len(frame), len(cf), limit, h.ResponseTo, reply)
	}
	if _, _, err := c.read(5 * time.Second); err == nil {
		t.Fatal("the connection stayed open after the refusal")
	}
	// Every other client is served.
	if r := dialWire(t, addr).cmd(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}}); r.Lookup("ok").Double() != 1 {
		t.Fatalf("ping: %s", r)
	}
}
