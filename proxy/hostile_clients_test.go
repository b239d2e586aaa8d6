package proxy

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/upstream"
	"github.com/tsproxy/tsproxy/wire"
)

// fakeUpstream listens on a free port and serves each connection with
// serve, which returns when it is done with it. open counts the
// connections still open; closeAll closes the listener and every
// connection (also at the test's end).
func fakeUpstream(t *testing.T, serve func(nc net.Conn, r *bufio.Reader)) (addr string, open *atomic.Int64, closeAll func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	closeAll = func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	}
	t.Cleanup(closeAll)
	open = new(atomic.Int64)
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, nc)
			mu.Unlock()
			open.Add(1)
			go func() {
				defer open.Add(-1)
				defer nc.Close()
				serve(nc, bufio.NewReader(nc))
			}()
		}
	}()
	return ln.Addr().String(), open, closeAll
}

// scriptedUpstream is a fake upstream answering each command with the
// body answer gives; when stall, it sends half of that reply, then nothing
// until the proxy closes the connection.
func scriptedUpstream(t *testing.T, answer func(m *wire.Msg) (body []byte, stall bool)) (addr string, open *atomic.Int64, closeAll func()) {
	t.Helper()
	return fakeUpstream(t, func(nc net.Conn, r *bufio.Reader) {
		for {
			h, frame, err := wire.ReadMessage(r, nil, 0)
			if err != nil {
				return
			}
			var m wire.Msg
			_ = m.Decode(frame)
			body, stall := answer(&m)
			reply := wire.AppendMsg(nil, h.RequestID+1, h.RequestID, 0, body)
			if stall {
				_, _ = nc.Write(reply[:10])   // half a reply, then silence
				_, _ = io.Copy(io.Discard, r) // until the proxy closes
				return
			}
			if _, err := nc.Write(reply); err != nil {
				return
			}
		}
	})
}

// stallServer is a fake upstream answering {ok: 1}, except that a command
// for which stall(name, body) is true gets half a reply, then nothing.
// open counts its connections still open.
func stallServer(t *testing.T, stall func(name string, body bson.Raw) bool) (addr string, open *atomic.Int64) {
	t.Helper()
	ok, _ := bson.Marshal(bson.D{{Key: "ok", Value: 1.0}})
	addr, open, _ = scriptedUpstream(t, func(m *wire.Msg) ([]byte, bool) {
		return ok, stall(m.CommandName(), bson.Raw(m.Body))
	})
	return addr, open
}

func startRawProxy(t *testing.T, upAddr string, edit func(*Options)) (*Server, string) {
	t.Helper()
	d, err := upstream.NewDialer(upstream.Options{URI: "mongodb://" + upAddr, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{Dialer: d, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), CreateTimeseries: rules.CreateTimeseriesUpstream}
	if edit != nil {
		edit(&opts)
	}
	return serveProxy(t, opts)
}

// serveProxy starts a proxy with opts on a free port, shut down at the
// test's end.
func serveProxy(t *testing.T, opts Options) (*Server, string) {
	t.Helper()
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
		<-done
	})
	return s, ln.Addr().String()
}

// TestHalfFrameHoldsSlotForever: with maxConnections 2, two clients
// that send half a header and stall hold both slots for ever; every other
// client is refused.
func TestHalfFrameHoldsSlotForever(t *testing.T) {
	upAddr, _ := stallServer(t, func(string, bson.Raw) bool { return false })
	s, addr := startRawProxy(t, upAddr, func(o *Options) { o.MaxConnections = 2; o.FrameTimeout = time.Second })
	for range 2 {
		c := dialWire(t, addr)
		c.sendRaw([]byte{0x40, 0, 0, 0, 1, 0, 0, 0}) // 8 of the 16 header bytes
	}
	time.Sleep(100 * time.Millisecond)
	deadline := time.Now().Add(6 * time.Second)
	for {
		c := dialWire(t, addr)
		c.send(0, bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}})
		_, body, err := c.read(3 * time.Second)
		if err == nil && body.Lookup("ok").Double() == 1 {
			return // a slot was freed
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 6s two half-frame clients still hold both slots (%d connections); a new client gets: %v %v", s.Connections(), body, err)
		}
		c.nc.Close()
		time.Sleep(500 * time.Millisecond)
	}
}

// TestClientNeverReadsHoldsForever: a client that sends requests
// and never reads the replies blocks its goroutine in Write for ever
// (no write deadline), holding its slot and its upstream connection.
func TestClientNeverReadsHoldsForever(t *testing.T) {
	big := make([]byte, 4<<20)
	bigReply, _ := bson.Marshal(bson.D{{Key: "pad", Value: bson.Binary{Data: big}}, {Key: "ok", Value: 1.0}})
	ok, _ := bson.Marshal(bson.D{{Key: "ok", Value: 1.0}})
	upAddr, open, _ := fakeUpstream(t, func(nc net.Conn, r *bufio.Reader) {
		for first := true; ; first = false {
			h, _, err := wire.ReadMessage(r, nil, 0)
			if err != nil {
				return
			}
			body := bigReply
			if first {
				body = ok
			}
			if _, err := nc.Write(wire.AppendMsg(nil, h.RequestID+1, h.RequestID, 0, body)); err != nil {
				return
			}
		}
	})
	s, addr := startRawProxy(t, upAddr, func(o *Options) { o.WriteTimeout = time.Second })
	c := dialWire(t, addr)
	if tc, ok := c.nc.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(4096)
	}
	for range 8 { // 32 MiB of replies, never read
		c.send(0, bson.D{{Key: "find", Value: "x"}, {Key: "$db", Value: "db"}})
	}
	deadline := time.Now().Add(6 * time.Second)
	for s.Connections() != 0 || open.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("6s after the client stopped reading: %d client connection(s) held, %d upstream connection(s) open", s.Connections(), open.Load())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
