package proxy

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/tsproxy/tsproxy/proxy/handler"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/wire"
)

// readAhead is the client read buffer's size; see conn's buffer sizes.
const readAhead = 4 << 10

// conn is the front door's side of one client connection: it reads the
// client's frames, with their timeouts and limits, hands each to its
// handler (handler.Conn) and writes the replies the handler gives it
// (Write). Its loop runs on the connection's own goroutine; closed,
// clientLeft and busy are touched by Shutdown and the client watch from
// others, so they are atomic.
//
// Buffer sizes (what an idle connection holds): c.r's read-ahead buffer is
// small (readAhead): a small request arrives in one read, and bufio reads
// a body larger than its buffer straight into the frame, so a large
// buffer would only copy. Replies are whole frames written with one
// Write, so there is no write buffer at all. c.inBuf starts empty, grows
// to the largest frame seen and is kept only up to handler.MaxKeptBuf; a larger
// frame gets memory of its own that is dropped after its request. A
// request frame aliases c.inBuf and is valid until the next client read.
// An idle connection therefore holds about 4 KiB of read-ahead per side
// plus its last ordinary frames.
type conn struct {
	s     *Server
	nc    net.Conn
	r     *bufio.Reader
	log   *slog.Logger
	h     *handler.Conn
	inBuf []byte

	// watch notices a client that leaves while its request waits on
	// the upstream; clientLeft records that it did.
	watch      *clientWatch
	clientLeft atomic.Bool

	busy   atomic.Bool // serving a request
	closed atomic.Bool
}

func newConn(s *Server, nc net.Conn, id uint64) *conn {
	c := &conn{
		s:   s,
		nc:  nc,
		r:   bufio.NewReaderSize(nc, readAhead),
		log: s.log.With("conn", id, "client", nc.RemoteAddr().String()),
	}
	c.h = handler.NewConn(s.eng, c, id, c.log)
	c.watch = newClientWatch(c, s.opts.ClientWatchAfter)
	return c
}

// Write writes a reply frame to the client, within the write timeout
// (handler.Front).
func (c *conn) Write(frame []byte) error {
	_ = c.nc.SetWriteDeadline(time.Now().Add(c.s.opts.WriteTimeout))
	_, err := c.nc.Write(frame)
	return err
}

// Watch starts the client watch for the request being served.
func (c *conn) Watch() { c.watch.arm() }

// Left says whether the client left while its request waited.
func (c *conn) Left() bool { return c.clientLeft.Load() }

// Closed says whether the connection was closed.
func (c *conn) Closed() bool { return c.closed.Load() }

// serve reads and answers requests until the client goes away, a frame
// cannot be read (the stream is out of step then), the upstream
// connection breaks, or the server shuts down.
func (c *conn) serve() {
	defer c.forceClose()
	defer c.watch.stop()
	defer func() {
		// The one recover of the proxy: a bug in serving one client must
		// not take the others down. It logs and closes this connection.
		if r := recover(); r != nil {
			c.log.Error("connection closed after internal error", "panic", r, "stack", string(debug.Stack()))
		}
	}()
	defer c.h.Close()
	for {
		if c.s.closing.Load() {
			return
		}
		// Idle as long as it likes, as with mongod; but a frame once
		// begun must arrive within FrameTimeout: a client that sent half
		// a frame (or half a TLS handshake) and stalled kept its slot for
		// good, and maxConnections of them refused everyone else
		// (Options.FrameTimeout).
		if _, err := c.r.Peek(1); err == nil {
			_ = c.nc.SetReadDeadline(time.Now().Add(c.s.opts.FrameTimeout))
		}
		h, frame, err := wire.ReadMessage(c.r, c.inBuf, c.s.opts.MaxMessageBytes)
		if err == nil {
			_ = c.nc.SetReadDeadline(time.Time{})
		}
		if err != nil {
			c.refuseOversized(h, err)
			c.logReadError(err)
			return
		}
		if cap(frame) > cap(c.inBuf) && cap(frame) <= handler.MaxKeptBuf {
			c.inBuf = frame[:0] // keep ordinary buffers; let huge ones go
		}
		c.busy.Store(true)
		c.s.tel.BytesIn(len(frame))
		err = c.h.Handle(h, frame) // arms c.watch for a request that expects a reply
		c.watch.disarm()
		c.h.AfterReply()
		c.busy.Store(false)
		c.h.ShrinkBuffers()
		if err != nil {
			if c.clientLeft.Load() {
				c.log.Info("client left while its request waited on the upstream; closed its upstream connection", "reason", err.Error())
				return
			}
			c.log.Warn("closing client connection", "reason", err.Error())
			return
		}
	}
}

func (c *conn) logReadError(err error) {
	switch {
	case errors.Is(err, io.EOF), c.closed.Load(), c.s.closing.Load():
		c.log.Debug("client disconnected")
	case errors.Is(err, net.ErrClosed):
		c.log.Debug("client connection closed")
	default:
		c.s.tel.ErrorSeen("bad_frame")
		c.log.Warn("closing client connection: bad frame", "reason", err.Error())
	}
}

// refuse answers the first request of a connection over the limit with an
// error and closes it.
func (c *conn) refuse(msg string) {
	defer c.forceClose()
	c.log.Warn("refusing client connection", "reason", msg)
	_ = c.nc.SetDeadline(time.Now().Add(5 * time.Second))
	h, _, err := wire.ReadMessage(c.r, nil, c.s.opts.MaxMessageBytes)
	if err != nil {
		return
	}
	_ = c.h.Refuse(h, mongoerr.TooManyConnections, msg)
}

// closeIfIdle closes the connection now if it is between requests; a busy
// one closes itself after its reply (serve checks Server.closing).
func (c *conn) closeIfIdle() {
	if !c.busy.Load() {
		// Unblock the read; serve then sees closing and returns.
		_ = c.nc.SetReadDeadline(time.Now())
	}
}

// forceClose closes both sides; safe from any goroutine.
func (c *conn) forceClose() {
	if c.closed.Swap(true) {
		return
	}
	c.nc.Close()
	c.h.Abort()
}

func (s *Server) startConn(nc net.Conn) {
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	c := newConn(s, nc, s.nextID.Add(1))
	over := s.numConns.Add(1) > int64(s.opts.MaxConnections)
	s.mu.Lock()
	if s.closing.Load() {
		s.mu.Unlock()
		s.numConns.Add(-1)
		nc.Close()
		return
	}
	s.conns[c] = struct{}{}
	s.connWG.Add(1)
	s.mu.Unlock()
	s.tel.ConnOpened()
	go func() {
		defer func() {
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
			s.numConns.Add(-1)
			s.tel.ConnClosed()
			s.connWG.Done()
		}()
		if tc, ok := nc.(*tls.Conn); ok {
			// The handshake, bounded: run by the first read otherwise,
			// a client that never sent its hello held a slot for good.
			_ = tc.SetDeadline(time.Now().Add(s.opts.FrameTimeout))
			if err := tc.Handshake(); err != nil {
				c.log.Warn("closing client connection: TLS handshake failed", "err", err.Error())
				s.tel.ErrorSeen("tls_handshake")
				nc.Close()
				return
			}
			_ = tc.SetDeadline(time.Time{})
		}
		if over {
			c.refuse(fmt.Sprintf("tsproxy: connection limit of %d reached", s.opts.MaxConnections))
			return
		}
		c.serve()
	}()
}
