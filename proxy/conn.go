package proxy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tsproxy/tsproxy/proxy/replycache"
	"github.com/tsproxy/tsproxy/proxy/telemetry"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/upstream"
	"github.com/tsproxy/tsproxy/wire"
)

const maxMsgLen = wire.MaxMsgLen

// readAhead is the client read buffer's size; see conn's buffer sizes.
const readAhead = 4 << 10

// maxKeptBuf is the largest frame buffer a connection keeps between
// requests; see conn's buffer sizes.
const maxKeptBuf = 1 << 20

// conn serves one client connection. Its methods run on the connection's
// own goroutine, one request at a time (MongoDB clients wait for each reply
// before the next request on a connection), so its state needs no locks.
// The exceptions, touched by Shutdown from another goroutine, are atomic.
//
// Buffer lifetimes: a request frame aliases c.inBuf and is valid until the
// next client read; an upstream reply aliases the upstream connection's
// buffer and is valid until the next upstream read. A reply is written to
// the client before either is reused.
//
// Buffer sizes (what an idle connection holds): c.r's read-ahead buffer is
// small (readAhead): a small request arrives in one read, and
// bufio reads a body larger than its buffer straight into the frame, so a
// large buffer would only copy. Replies are whole frames written with one
// Write, so there is no write buffer at all. c.inBuf and c.outBuf start
// empty, grow to the largest frame seen and are kept only up to
// maxKeptBuf; a larger frame gets memory of its own that is dropped after
// its request. The upstream connection follows the same rules. An idle
// connection therefore holds about 4 KiB of
// read-ahead per side plus its last ordinary frames.
type conn struct {
	s   *Server
	id  uint64
	nc  net.Conn
	r   *bufio.Reader
	log *slog.Logger

	up         *upstream.Conn
	upRef      atomic.Pointer[upstream.Conn] // c.up, for abort from Shutdown
	inBuf      []byte
	outBuf     []byte
	compressor uint8 // compressor negotiated with this client (0: none)
	// cursors are the registered cursors this connection opened or
	// continued; see releaseCursors. Pruned when it reaches cursorsPrune
	// (ownCursor).
	cursors      map[int64]struct{}
	cursorsPrune int
	// auth is what the connection knows of its client's authentication.
	auth connAuth
	// upAuth: an authentication command went over c.up, so the client's
	// authentication may live on it (a new link would not have it).
	upAuth bool
	// rules is the rule set the request being served is routed by: config
	// rules and created time-series collections (catalogGate).
	rules *rules.Set

	// afterReply is bookkeeping of the request being served that waits
	// until its client has the reply (afterReplied): serve runs it before
	// it reads the next request, while the client turns the reply around.
	afterReply []func()

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
		id:  id,
		nc:  nc,
		r:   bufio.NewReaderSize(nc, readAhead),
		log: s.log.With("conn", id, "client", nc.RemoteAddr().String()),
	}
	c.watch = newClientWatch(c, s.opts.ClientWatchAfter)
	return c
}

// request is one client message, decoded as far as routing needs.
type request struct {
	h          wire.Header
	frame      []byte // the (decompressed) frame as the client sent it
	msg        wire.Msg
	legacy     bool  // came as OP_QUERY: answer with OP_REPLY
	compressor uint8 // came as OP_COMPRESSED with this compressor: answer alike
	name       string
	db         string
	start      time.Time
	txn        *replycache.Attempt   // a retryable write's attempt
	retry      *rewrite.ReadRetryKey // the body's retry key, once retriedReply read it
	replied    bool                  // a reply frame went to the client
}

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
	defer c.releaseCursors()
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
		if cap(frame) > cap(c.inBuf) && cap(frame) <= maxKeptBuf {
			c.inBuf = frame[:0] // keep ordinary buffers; let huge ones go
		}
		c.busy.Store(true)
		c.s.tel.BytesIn(len(frame))
		err = c.handle(h, frame) // arms c.watch for a request that expects a reply
		c.watch.disarm()
		c.runAfterReply()
		c.busy.Store(false)
		if cap(c.outBuf) > maxKeptBuf {
			c.outBuf = nil // a huge reply's buffer is not kept while idle
		}
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

// afterReplied defers f, bookkeeping that neither the upstream commands
// nor the reply of the request being served depend on (its metrics, the
// merge's counts), until the reply is sent: a per-event insert's client
// waits for less.
func (c *conn) afterReplied(f func()) { c.afterReply = append(c.afterReply, f) }

// endAfterReply ends span, a request's metrics, once its client has the
// reply: upstream is the time spent waiting on the upstream, err the
// request's failure.
func (c *conn) endAfterReply(span telemetry.Span, upstream time.Duration, err error) {
	c.afterReplied(func() { span.End(upstream, err) })
}

// runAfterReply runs the bookkeeping afterReplied deferred, in order.
func (c *conn) runAfterReply() {
	for i, f := range c.afterReply {
		f()
		c.afterReply[i] = nil
	}
	c.afterReply = c.afterReply[:0]
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

// handle serves one frame. A returned error closes the connection; errors
// a reply can carry are answered and return nil.
func (c *conn) handle(h wire.Header, frame []byte) error {
	req := &request{h: h, frame: frame, start: time.Now()}
	if h.OpCode == wire.OpCompressed {
		var cm wire.Compressed
		if err := cm.Decode(frame); err != nil {
			return fmt.Errorf("OP_COMPRESSED: %w", err)
		}
		if c.compressor == 0 || cm.CompressorID != c.compressor {
			// Answering with a compressor the client did not negotiate
			// would leave it unable to read the reply.
			if cm.CompressorID != 0 {
				return fmt.Errorf("OP_COMPRESSED with compressor %d, which was not negotiated", cm.CompressorID)
			}
		}
		inner, err := wire.DecompressLimit(frame, c.s.opts.MaxMessageBytes)
		if err != nil {
			c.refuseDecompressed(h, err)
			return fmt.Errorf("OP_COMPRESSED: %w", err)
		}
		ih, err := wire.ParseHeader(inner)
		if err != nil {
			return fmt.Errorf("OP_COMPRESSED: %w", err)
		}
		req.h, req.frame, req.compressor = ih, inner, cm.CompressorID
	}
	switch req.h.OpCode {
	case wire.OpMsg:
		if err := req.msg.Decode(req.frame); err != nil {
			c.s.tel.ErrorSeen("bad_message")
			c.log.Warn("rejected message", "reason", err.Error())
			if req.msg.Flags&wire.MoreToCome != 0 {
				return nil // the client reads no reply
			}
			return c.replyError(req, decodeErrorCode(err), "tsproxy: "+err.Error())
		}
	case wire.OpQuery:
		// A legacy client reads only OP_REPLY, error replies included.
		req.legacy = true
		if err := c.decodeQuery(req); err != nil {
			c.s.tel.ErrorSeen("bad_message")
			c.log.Warn("rejected message", "reason", err.Error())
			return c.replyError(req, mongoerr.InvalidBSON, "tsproxy: "+err.Error())
		}
	default:
		return fmt.Errorf("unsupported opcode %s from a client", req.h.OpCode)
	}
	req.name = req.msg.CommandName()
	req.db = req.msg.DB()
	if req.msg.Flags&wire.MoreToCome == 0 {
		// A client that sent a moreToCome write waits for no reply, so
		// closing right after is how it ends, not a sign it gave up:
		// its write must still go upstream.
		c.watch.arm()
	}
	if err := c.route(req); err != nil && !errors.Is(err, errAnswered) {
		return c.afterLinkLoss(req, err)
	}
	return nil
}

// decodeQuery turns a legacy OP_QUERY command (drivers still send their
// first isMaster this way) into an OP_MSG-shaped request; the reply goes
// back as OP_REPLY.
func (c *conn) decodeQuery(req *request) error {
	var q wire.Query
	if err := q.Decode(req.frame); err != nil {
		return err
	}
	db, ok := strings.CutSuffix(q.FullCollectionName, ".$cmd")
	if !ok || db == "" {
		return fmt.Errorf("OP_QUERY on %q: only commands (db.$cmd) are supported; use OP_MSG", q.FullCollectionName)
	}
	cmd := bson.Raw(q.Query)
	// Old drivers wrap the command with read preference as {$query: cmd}.
	if inner, ok := cmd.Lookup("$query").DocumentOK(); ok {
		cmd = inner
	}
	body, err := appendDB(cmd, db)
	if err != nil {
		return fmt.Errorf("OP_QUERY command: %w", err)
	}
	req.legacy = true
	req.msg = wire.Msg{Body: body}
	req.frame = nil
	return nil
}

// appendDB returns cmd with "$db" set to db (replacing any present).
func appendDB(cmd bson.Raw, db string) ([]byte, error) {
	elems, err := cmd.Elements()
	if err != nil {
		return nil, err
	}
	d := make(bson.D, 0, len(elems)+1)
	for _, e := range elems {
		if e.Key() == "$db" {
			continue
		}
		d = append(d, bson.E{Key: e.Key(), Value: e.Value()})
	}
	d = append(d, bson.E{Key: "$db", Value: db})
	return bson.Marshal(d)
}

// rollupTarget is the rule whose rollup collection a command names (its
// first field's value), or nil; getMore and killCursors name none.
func (c *conn) rollupTarget(req *request) *rules.Rule {
	if c.rules.Len() == 0 || req.name == "getMore" || req.name == "killCursors" {
		return nil
	}
	first, err := bson.Raw(req.msg.Body).IndexErr(0)
	if err != nil {
		return nil
	}
	coll, ok := first.Value().StringValueOK()
	if !ok {
		return nil
	}
	return c.rules.ByRollupCollection(req.db, coll)
}

// refuse answers the first request of a connection over the limit with an
// error and closes it.
func (c *conn) refuse(msg string) {
	defer c.forceClose()
	c.log.Warn("refusing client connection", "reason", msg)
	_ = c.nc.SetDeadline(time.Now().Add(5 * time.Second))
	h, frame, err := wire.ReadMessage(c.r, nil, c.s.opts.MaxMessageBytes)
	if err != nil {
		return
	}
	req := &request{h: h, frame: frame}
	if h.OpCode == wire.OpQuery {
		req.legacy = true
	}
	_ = c.replyError(req, mongoerr.TooManyConnections, msg)
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
	if up := c.upRef.Load(); up != nil {
		up.Close()
	}
}
