package proxy

import (
	"errors"
	"net"
	"sync"
	"time"
)

// clientWatch notices a client that leaves while its request waits on the
// upstream, and closes the connection's upstream connection so the request
// ends: without it, an upstream that stopped answering mid-reply held the
// client's slot and its upstream connection until the upstream closed,
// long after the client had gone. mongod likewise ends an operation whose
// client disconnected.
//
// Nothing reads the client while a request is served (a client waits for
// each reply before its next request), so once a request that expects a
// reply has run for Options.ClientWatchAfter, a goroutine peeks at the
// client's connection: EOF or a reset means the client left; a byte means
// it sent its next request early, which stays buffered in c.r for serve.
// A request that ends before then costs a timer's Reset and Stop, and no
// goroutine.
//
// A client that half-closes its side after a request (a FIN, as some
// command-line tools send) reads as one that left, as it does to mongod;
// drivers never half-close.
type clientWatch struct {
	c     *conn
	after time.Duration
	timer *time.Timer

	mu      sync.Mutex
	armed   bool          // a request is being served
	watcher chan struct{} // closed when the running peek returns; nil: none runs
}

func newClientWatch(c *conn, after time.Duration) *clientWatch {
	w := &clientWatch{c: c, after: after}
	w.timer = time.AfterFunc(time.Hour, w.watch)
	w.timer.Stop()
	return w
}

// arm starts the watch of one request that expects a reply; serve calls
// disarm (armed or not) before its next client read.
func (w *clientWatch) arm() {
	w.mu.Lock()
	w.armed = true
	w.mu.Unlock()
	w.timer.Reset(w.after)
}

// disarm ends the watch and waits until nothing but serve reads the
// client: c.r is not safe for two readers.
func (w *clientWatch) disarm() {
	w.timer.Stop()
	w.mu.Lock()
	w.armed = false
	done := w.watcher
	w.watcher = nil
	w.mu.Unlock()
	if done == nil {
		return
	}
	// Unblock the peek; a timeout leaves c.r usable, with what it read.
	_ = w.c.nc.SetReadDeadline(time.Now())
	<-done
	_ = w.c.nc.SetReadDeadline(time.Time{})
}

// watch runs on the timer's goroutine once a request has run for w.after.
func (w *clientWatch) watch() {
	w.mu.Lock()
	if !w.armed || w.watcher != nil {
		w.mu.Unlock()
		return
	}
	done := make(chan struct{})
	w.watcher = done
	w.mu.Unlock()
	defer close(done)

	_, err := w.c.r.Peek(1)
	var ne net.Error
	if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		return // the client is there (or disarm ended the peek)
	}
	if w.c.closed.Load() {
		return // forceClose closed both sides
	}
	w.c.clientLeft.Store(true)
	w.c.h.Abort()
}

func (w *clientWatch) stop() { w.timer.Stop() }
