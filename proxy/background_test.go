package proxy

import (
	"bufio"
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/proxy/exec"
	"github.com/tsproxy/tsproxy/upstream"
	"github.com/tsproxy/tsproxy/wire"
)

// okServer is a wire server that answers every command {ok: 1},
// counting the connections it accepted.
func okServer(t *testing.T) (addr string, accepted *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted = new(atomic.Int64)
	ok, err := bson.Marshal(bson.D{{Key: "ok", Value: 1.0}})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			go func() {
				defer nc.Close()
				r := bufio.NewReader(nc)
				for {
					h, _, err := wire.ReadMessage(r, nil, 0)
					if err != nil {
						return
					}
					if _, err := nc.Write(wire.AppendMsg(nil, h.RequestID+1, h.RequestID, 0, ok)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), accepted
}

// TestBackgroundConnsPooled: the background loops' rounds take their
// connection from the proxy's pool and give it back, so rounds after the
// first dial nothing; a failed round closes its connection and the idle
// ones, and the next round dials; a connection whose loop ended is not
// pooled.
func TestBackgroundConnsPooled(t *testing.T) {
	addr, accepted := okServer(t)
	d, err := upstream.NewDialer(upstream.Options{URI: "mongodb://" + addr})
	if err != nil {
		t.Fatal(err)
	}
	pool := exec.NewPool(d.Dial, 4)
	defer pool.Close()
	ctx, cancel := context.WithCancel(context.Background())
	b := exec.NewBackground(ctx, pool)
	round := func() *upstream.Conn {
		t.Helper()
		up, err := b.Get()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := up.Command(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}}); err != nil {
			t.Fatal(err)
		}
		return up
	}
	first := round()
	b.Release()
	for range 5 {
		if up := round(); up != first {
			t.Fatal("a round after a released one dialled a connection of its own")
		}
		b.Release()
	}
	if n := accepted.Load(); n != 1 {
		t.Fatalf("%d connections for 6 rounds, want 1", n)
	}
	if n := pool.Open(); n != 1 {
		t.Fatalf("BackgroundConns %d, want the 1 pooled", n)
	}
	// Two loops at once: a second connection, both pooled after.
	other := exec.NewBackground(ctx, pool)
	round()
	if _, err := other.Get(); err != nil {
		t.Fatal(err)
	}
	b.Release()
	other.Release()
	if n := accepted.Load(); n != 2 {
		t.Fatalf("%d connections for two loops, want 2", n)
	}
	if n := pool.Open(); n != 2 {
		t.Fatalf("BackgroundConns %d, want 2", n)
	}
	round()
	b.Fail()
	if got, n := pool.Idle(), pool.Open(); got != 0 || n != 0 {
		t.Fatalf("%d idle connections and %d open after a failed round, want none", got, n)
	}
	round()
	if n := accepted.Load(); n != 3 {
		t.Fatalf("%d connections after a failed round, want a third", n)
	}
	cancel() // the loop ends: its connection closes, and is not pooled
	b.Release()
	if got := pool.Idle(); got != 0 {
		t.Fatalf("%d idle connections after the loop ended, want none", got)
	}
	for deadline := time.Now().Add(5 * time.Second); pool.Open() != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) { // the close runs in a goroutine of its own
			t.Fatalf("BackgroundConns %d after the loop ended, want 0", pool.Open())
		}
	}
}
