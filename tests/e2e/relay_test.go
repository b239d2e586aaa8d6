package e2e

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tsproxy/tsproxy/upstream"
)

// relay is a TCP forwarder put between a proxy and the upstream to inject
// faults: Stop closes its listener and every relayed connection (the
// upstream "goes down"); Start listens again on the same port (it "comes
// back"); SetDelay holds back every chunk the upstream sends (a slow
// upstream).
type relay struct {
	t      testing.TB
	target string
	addr   string // 127.0.0.1:port, fixed for the relay's life

	delay atomic.Int64 // nanoseconds added before each upstream→client chunk

	mu      sync.Mutex
	ln      net.Listener
	quit    chan struct{} // closed by Stop: cuts delays short
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
	accepts atomic.Int64 // connections accepted over the relay's life
	down    atomic.Int64 // bytes relayed from the upstream to its clients

	// cut, when set, picks client→upstream messages whose reply is never
	// delivered: the message reaches the upstream, and when its reply
	// comes the relay closes both sides instead (see CutReplyOf).
	cut   atomic.Pointer[func(frame []byte) bool]
	cuts  atomic.Int64 // replies cut so far
	limit atomic.Int64 // replies still to cut

	// refuse, when set, picks client→upstream messages that never reach
	// the upstream: the relay closes both sides instead (see Refuse).
	refuse  atomic.Pointer[func(frame []byte) bool]
	refused atomic.Int64 // messages refused so far
}

// relayPair is the state of one relayed connection.
type relayPair struct {
	dropReply atomic.Bool // the next upstream→client bytes end the pair
}

// newRelay starts a relay to target on a free loopback port; it is stopped
// when the test ends.
func newRelay(t testing.TB, target string) *relay {
	t.Helper()
	r := &relay{t: t, target: target, conns: map[net.Conn]struct{}{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.addr = ln.Addr().String()
	r.serve(ln)
	t.Cleanup(r.Stop)
	return r
}

// URI is a mongodb:// URI naming the relay.
func (r *relay) URI() string { return "mongodb://" + r.addr + "/" }

// SetDelay makes every chunk from the upstream wait d before it is passed on.
func (r *relay) SetDelay(d time.Duration) { r.delay.Store(int64(d)) }

// Start listens again on the relay's port after Stop.
func (r *relay) Start() {
	r.t.Helper()
	var ln net.Listener
	var err error
	// The port was ours a moment ago; retry briefly in case the kernel
	// has not released it yet.
	for i := 0; i < 50; i++ {
		if ln, err = net.Listen("tcp", r.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		r.t.Fatalf("relay: listen again on %s: %v", r.addr, err)
	}
	r.serve(ln)
}

// Stop closes the listener and every relayed connection, and waits for the
// relay's goroutines to end. Stopping a stopped relay does nothing.
func (r *relay) Stop() {
	r.mu.Lock()
	if r.ln != nil {
		r.ln.Close()
		r.ln = nil
		close(r.quit)
	}
	for c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}

func (r *relay) serve(ln net.Listener) {
	quit := make(chan struct{})
	r.mu.Lock()
	r.ln, r.quit = ln, quit
	r.mu.Unlock()
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r.accepts.Add(1)
			up, err := net.DialTimeout(upstream.Network(r.target), r.target, 5*time.Second)
			if err != nil {
				c.Close()
				continue
			}
			if !r.track(c, up) {
				return
			}
			pair := &relayPair{}
			r.wg.Add(2)
			go r.pipeRequests(up, c, pair)
			go r.pipe(c, up, quit, pair)
		}
	}()
}

// track registers a relayed pair; false (and both closed) if the relay
// was stopped meanwhile.
func (r *relay) track(c, up net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ln == nil {
		c.Close()
		up.Close()
		return false
	}
	r.conns[c] = struct{}{}
	r.conns[up] = struct{}{}
	return true
}

// pipe copies src to dst until either ends, then closes both. With quit
// not nil the copy is the delayed direction; quit cuts a delay short.
func (r *relay) pipe(dst, src net.Conn, quit chan struct{}, pair *relayPair) {
	defer r.wg.Done()
	defer func() {
		r.mu.Lock()
		delete(r.conns, src)
		delete(r.conns, dst)
		r.mu.Unlock()
		src.Close()
		dst.Close()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && pair != nil && pair.dropReply.Load() {
			r.cuts.Add(1)
			return // the reply is lost with the connection
		}
		if n > 0 {
			r.down.Add(int64(n))
			if d := time.Duration(r.delay.Load()); quit != nil && d > 0 {
				select {
				case <-time.After(d):
				case <-quit:
					return
				}
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				r.t.Logf("relay: %v", err)
			}
			return
		}
	}
}

// TestRelayForwardsAndStops checks the fault injector itself: traffic goes
// through it, Stop refuses and cuts connections, Start restores service on
// the same port.
func TestRelayForwardsAndStops(t *testing.T) {
	t.Parallel()
	r := newRelay(t, upstreamAddr(t))
	c := connect(t, r.URI(), "directConnection=true", "serverSelectionTimeoutMS=3000")
	ctx := ctxFor(t)
	if err := c.Ping(ctx, nil); err != nil {
		t.Fatalf("ping through relay: %v", err)
	}
	if r.accepts.Load() == 0 {
		t.Fatal("relay accepted no connection, yet the ping succeeded")
	}
	addr := r.addr
	r.Stop()
	if nc, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		nc.Close()
		t.Fatal("stopped relay still accepts connections")
	}
	r.Start()
	if r.addr != addr {
		t.Fatalf("relay moved from %s to %s", addr, r.addr)
	}
	nc, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatalf("restarted relay: %v", err)
	}
	nc.Close()
}

// upstreamAddr is host:port of the shared upstream (its first host), or
// the path of its Unix socket (the embedded upstream's).
func upstreamAddr(t testing.TB) string {
	t.Helper()
	u, err := upstream.ParseURI(env.upstreamURI)
	if err != nil {
		t.Fatal(err)
	}
	return u.Hosts[0]
}

// CutReplyOf makes the relay deliver the next n client→upstream messages
// for which match is true, and then, instead of their replies, close both
// connections: the write happened upstream, its sender never learns.
func (r *relay) CutReplyOf(n int, match func(frame []byte) bool) {
	r.limit.Store(int64(n))
	r.cut.Store(&match)
}

// Refuse makes the relay close the connection of every client→upstream
// message for which match is true, before it reaches the upstream (the
// command fails, nothing of it ran); nil stops refusing.
func (r *relay) Refuse(match func(frame []byte) bool) {
	if match == nil {
		r.refuse.Store(nil)
		return
	}
	r.refuse.Store(&match)
}

// Open is the number of connections relayed now.
func (r *relay) Open() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.conns) / 2
}

// pipeRequests copies client→upstream messages whole, so that CutReplyOf
// can pick them; without a cut armed it is a plain copy.
func (r *relay) pipeRequests(dst, src net.Conn, pair *relayPair) {
	defer r.wg.Done()
	defer func() {
		r.mu.Lock()
		delete(r.conns, src)
		delete(r.conns, dst)
		r.mu.Unlock()
		src.Close()
		dst.Close()
	}()
	br := bufio.NewReaderSize(src, 64<<10)
	for {
		var lenBuf [4]byte
		if _, err := io.ReadFull(br, lenBuf[:]); err != nil {
			return
		}
		size := int(binary.LittleEndian.Uint32(lenBuf[:]))
		if size < 16 || size > 64<<20 {
			r.t.Logf("relay: bad frame length %d", size)
			return
		}
		frame := make([]byte, size)
		copy(frame, lenBuf[:])
		if _, err := io.ReadFull(br, frame[4:]); err != nil {
			return
		}
		if m := r.refuse.Load(); m != nil && (*m)(frame) {
			r.refused.Add(1)
			return
		}
		if m := r.cut.Load(); m != nil && (*m)(frame) && r.limit.Add(-1) >= 0 {
			pair.dropReply.Store(true)
		}
		if _, err := dst.Write(frame); err != nil {
			return
		}
	}
}
