package upstream

import (
	"bufio"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/tsproxy/tsproxy/wire"
)

// Conn is one connection to the upstream server. It is used by a single
// goroutine at a time (the client connection handler that owns it), so it
// has no locks.
//
// Buffer lifetime: the frame ReadMessage returns aliases the Conn's read
// buffer and is valid only until the next ReadMessage or RoundTrip.
//
// Buffer sizes: the read-ahead buffer is small (readAhead), since bufio
// reads a body larger than it straight into the frame; the frame buffer
// grows to the largest reply seen up to maxKeptBuf, and a larger reply
// gets memory of its own, dropped after use, so an idle connection does
// not hold a 16 MiB batch.
type Conn struct {
	nc   net.Conn
	r    *bufio.Reader
	buf  []byte
	addr string
}

// requestIDs numbers the commands the proxy itself sends upstream. Client
// frames forwarded unchanged keep the client's own requestID.
var requestIDs atomic.Int32

// NextRequestID returns a fresh requestID for a message the proxy builds.
func NextRequestID() int32 { return requestIDs.Add(1) }

func newConn(nc net.Conn, addr string) *Conn {
	return &Conn{nc: nc, r: bufio.NewReaderSize(nc, readAhead), addr: addr}
}

const (
	readAhead  = 4 << 10
	maxKeptBuf = 1 << 20
)

// Addr is the upstream address this connection goes to.
func (c *Conn) Addr() string { return c.addr }

// Write sends one whole frame.
func (c *Conn) Write(frame []byte) error {
	if _, err := c.nc.Write(frame); err != nil {
		return &LinkError{Addr: c.addr, Op: "write", Err: err}
	}
	return nil
}

// ReadMessage reads one reply frame.
func (c *Conn) ReadMessage() (wire.Header, []byte, error) {
	h, frame, err := wire.ReadMessage(c.r, c.buf, wire.MaxMsgLen)
	if err != nil {
		return h, nil, &LinkError{Addr: c.addr, Op: "read", Err: err}
	}
	if cap(frame) > cap(c.buf) && cap(frame) <= maxKeptBuf {
		c.buf = frame[:0]
	}
	return h, frame, nil
}

// LinkError is a failure of the connection itself (a write or a read),
// as opposed to an error the upstream answered: after one the connection
// is out of step and must be closed.
type LinkError struct {
	Addr string
	Op   string // "read" or "write"
	Err  error
}

func (e *LinkError) Error() string { return fmt.Sprintf("upstream %s: %s: %v", e.Addr, e.Op, e.Err) }

func (e *LinkError) Unwrap() error { return e.Err }

// RoundTrip writes frame and reads the reply.
func (c *Conn) RoundTrip(frame []byte) (wire.Header, []byte, error) {
	if err := c.Write(frame); err != nil {
		return wire.Header{}, nil, err
	}
	return c.ReadMessage()
}

// SetDeadline bounds the next reads and writes; the zero time removes it.
func (c *Conn) SetDeadline(t time.Time) error { return c.nc.SetDeadline(t) }

// Close closes the connection.
func (c *Conn) Close() error { return c.nc.Close() }
