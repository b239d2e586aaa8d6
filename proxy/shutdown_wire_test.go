package proxy

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/upstream"
	"github.com/tsproxy/tsproxy/wire"
)

// A Shutdown whose deadline passes while a connection is dialing its
// upstream must not leave that upstream connection open.
// TestShutdownDuringDialClosesUpstream: a Shutdown that closes a
// connection while it dials its upstream closes that upstream connection
// too, once the dial ends.
func TestShutdownDuringDialClosesUpstream(t *testing.T) {
	ok, _ := bson.Marshal(bson.D{{Key: "ok", Value: 1.0}})
	upAddr, open, _ := fakeUpstream(t, func(nc net.Conn, r *bufio.Reader) {
		for first := true; ; first = false {
			h, _, err := wire.ReadMessage(r, nil, 0)
			if err != nil {
				return
			}
			if first {
				time.Sleep(time.Second) // a slow link check
			}
			if _, err := nc.Write(wire.AppendMsg(nil, h.RequestID+1, h.RequestID, 0, ok)); err != nil {
				return
			}
		}
	})
	d, err := upstream.NewDialer(upstream.Options{URI: "mongodb://" + upAddr, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{Dialer: d, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	pln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(pln) }()
	c := dialWire(t, pln.Addr().String())
	c.send(0, bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}})
	time.Sleep(200 * time.Millisecond) // the proxy is dialing now
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_ = s.Shutdown(ctx)
	<-done
	for deadline := time.Now().Add(3 * time.Second); open.Load() != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d upstream connection(s) still open after Shutdown returned", open.Load())
		}
	}
}
