package handler

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/proxy/authz"
	"github.com/tsproxy/tsproxy/proxy/engine"
	"github.com/tsproxy/tsproxy/proxy/replycache"
	"github.com/tsproxy/tsproxy/proxy/telemetry"
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/upstream"
	"github.com/tsproxy/tsproxy/wire"
)

// MaxKeptBuf is the largest frame buffer a connection keeps between
// requests, on either side: a larger one gets memory of its own that is
// dropped after its request.
const MaxKeptBuf = 1 << 20

// Conn handles the commands of one client connection: the front door
// (package proxy) reads each frame and hands it to Handle, which answers
// it through the connection's Front. Its methods run on the connection's
// own goroutine, one request at a time (MongoDB clients wait for each
// reply before the next request on a connection), so its state needs no
// locks. The exceptions, touched by Shutdown from another goroutine, are
// atomic.
//
// Buffer lifetimes: a request frame is the front door's and is valid
// until its next client read; an upstream reply aliases the upstream
// connection's buffer and is valid until the next upstream read. A reply
// is written to the client before either is reused. c.outBuf starts
// empty, grows to the largest frame seen and is kept only up to
// MaxKeptBuf (ShrinkBuffers); the upstream connection follows the same
// rules.
type Conn struct {
	s     *engine.Engine
	front Front
	id    uint64
	log   *slog.Logger

	up         *upstream.Conn
	upRef      atomic.Pointer[upstream.Conn] // c.up, for abort from Shutdown
	outBuf     []byte
	compressor uint8 // compressor negotiated with this client (0: none)
	// cursors are the registered cursors this connection opened or
	// continued; see releaseCursors. Pruned when it reaches cursorsPrune
	// (ownCursor).
	cursors      map[int64]struct{}
	cursorsPrune int
	// auth is what the connection knows of its client's authentication.
	auth authz.Verdicts
	// upAuth: an authentication command went over c.up, so the client's
	// authentication may live on it (a new link would not have it).
	upAuth bool
	// rules is the rule set the request being served is routed by: config
	// rules and created time-series collections (catalogGate).
	rules *rules.Set

	// afterReply is bookkeeping of the request being served that waits
	// until its client has the reply (afterReplied): the front door runs
	// it (AfterReply) before it reads the next request, while the client
	// turns the reply around.
	afterReply []func()
}

// Front is the client side of a connection, which the front door keeps.
type Front interface {
	// Write writes a reply frame to the client.
	Write(frame []byte) error
	// Watch starts watching for the client leaving while the request
	// being served waits on the upstream (a request that expects a reply).
	Watch()
	// Left says whether the client left while its request waited.
	Left() bool
	// Closed says whether the connection was closed (Shutdown, a client
	// that left).
	Closed() bool
}

// NewConn is the handler of client connection id, answering through
// front.
func NewConn(s *engine.Engine, front Front, id uint64, log *slog.Logger) *Conn {
	return &Conn{s: s, front: front, id: id, log: log}
}

// Abort closes the upstream connection; safe from any goroutine (the
// front door's forceClose, the client watch).
func (c *Conn) Abort() {
	if up := c.upRef.Load(); up != nil {
		up.Close()
	}
}

// ShrinkBuffers lets a huge reply's buffer go while the connection idles.
func (c *Conn) ShrinkBuffers() {
	if cap(c.outBuf) > MaxKeptBuf {
		c.outBuf = nil
	}
}

// Close releases what the connection holds of the proxy's: its cursors.
func (c *Conn) Close() { c.releaseCursors() }

// Refuse answers a frame with header h, whose body was not read, with
// an error (code, msg): a message over the size limit, a connection over
// the limit.
func (c *Conn) Refuse(h wire.Header, code mongoerr.Code, msg string) error {
	return c.replyError(&request{h: h, legacy: h.OpCode == wire.OpQuery}, code, msg)
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

// afterReplied defers f, bookkeeping that neither the upstream commands
// nor the reply of the request being served depend on (its metrics, the
// merge's counts), until the reply is sent: a per-event insert's client
// waits for less.
func (c *Conn) afterReplied(f func()) { c.afterReply = append(c.afterReply, f) }

// endAfterReply ends span, a request's metrics, once its client has the
// reply: upstream is the time spent waiting on the upstream, err the
// request's failure.
func (c *Conn) endAfterReply(span telemetry.Span, upstream time.Duration, err error) {
	c.afterReplied(func() { span.End(upstream, err) })
}

// AfterReply runs the bookkeeping afterReplied deferred, in order.
func (c *Conn) AfterReply() {
	for i, f := range c.afterReply {
		f()
		c.afterReply[i] = nil
	}
	c.afterReply = c.afterReply[:0]
}

// Handle serves one frame. A returned error closes the connection; errors
// a reply can carry are answered and return nil.
func (c *Conn) Handle(h wire.Header, frame []byte) error {
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
		inner, err := wire.DecompressLimit(frame, c.s.Opts.MaxMessageBytes)
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
			c.s.Tel.ErrorSeen("bad_message")
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
			c.s.Tel.ErrorSeen("bad_message")
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
		c.front.Watch()
	}
	if err := c.route(req); err != nil && !errors.Is(err, errAnswered) {
		return c.afterLinkLoss(req, err)
	}
	return nil
}

// decodeQuery turns a legacy OP_QUERY command (drivers still send their
// first isMaster this way) into an OP_MSG-shaped request; the reply goes
// back as OP_REPLY.
func (c *Conn) decodeQuery(req *request) error {
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
func (c *Conn) rollupTarget(req *request) *rules.Rule {
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

// HasUpstream says whether the connection holds an upstream connection.
func (c *Conn) HasUpstream() bool { return c.upRef.Load() != nil }

// TrackedCursors is how many cursor ids the connection tracks.
func (c *Conn) TrackedCursors() int { return len(c.cursors) }

// Upstream is the client's upstream connection (tier.Client).
func (c *Conn) Upstream() *upstream.Conn { return c.up }
