package proxy

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/tsproxy/tsproxy/rewrite/read"

	"github.com/tsproxy/tsproxy/rewrite/cursor"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/upstream"
	"github.com/tsproxy/tsproxy/wire"
)

// This file serves finds that name their buckets (read.PointRead): the
// proxy looks the buckets up by _id, pipelining the lookups on the
// client's upstream connection, or scans them with one sorted find
// (read_scan.go), and holds the cursor itself.

// pointCursor is a proxy-held cursor; getMores of one cursor take turns.
type pointCursor struct {
	mu sync.Mutex
	pr *read.PointRead
}

// pointCursorID is a fresh id for a proxy-held cursor. Bit 62 set keeps it
// apart from FerretDB's small sequential ids; against MongoDB's random
// ids a collision has a 2^-62 chance.
func pointCursorID() int64 { return rand.Int64()>>2 | 1<<62 }

// servePoint answers a find from bucket lookups.
func (c *conn) servePoint(req *request, rule *rules.Rule, pr *read.PointRead) error {
	span := c.s.tel.startCommand(req, routeRewrite)
	t0 := time.Now()
	reply, id, err := c.runPoint(pr, pointCursorID())
	span.end(req, time.Since(t0), err)
	if err != nil || id == 0 {
		c.closeScan(rule, pr)
	}
	if err != nil {
		return c.pointError(req, err)
	}
	if id != 0 && !c.registerCursor(req, id, &cursorEntry{rule: rule, reshape: &pointCursor{pr: pr}, local: true}) {
		c.closeScan(rule, pr)
		return c.replyTooManyCursors(req, rule)
	}
	return c.replyBody(req, reply)
}

// runPoint does the lookups the next batch needs and builds it; the id
// returned is 0 when the cursor is done.
func (c *conn) runPoint(pr *read.PointRead, id int64) ([]byte, int64, error) {
	for cmds := pr.Lookups(); cmds != nil; cmds = pr.Lookups() {
		replies, err := c.upPipeline(cmds)
		if err != nil {
			return nil, 0, err
		}
		if err := pr.Feed(replies); err != nil {
			return nil, 0, err
		}
	}
	reply, more := pr.Batch(id)
	if !more {
		id = 0
	}
	return reply, id, nil
}

// pointError answers a rewrite error; other errors (the upstream
// connection failed) close the connection as elsewhere.
func (c *conn) pointError(req *request, err error) error {
	var ce *mongoerr.Error
	if errors.As(err, &ce) {
		return c.replyRewriteError(req, err)
	}
	return err
}

// servePointMore continues a proxy-held cursor.
func (c *conn) servePointMore(req *request, rule *rules.Rule, id int64, pc *pointCursor) error {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	// A getMore without batchSize (or 0) takes as many as fit.
	n, ok := cursor.GetMoreBatchSize(req.msg.Body)
	if !ok || n == 0 {
		n = -1
	}
	pc.pr.Want(n)
	c.ownCursor(id)
	span := c.s.tel.startCommand(req, routeCursor)
	t0 := time.Now()
	reply, next, err := c.runPoint(pc.pr, id)
	span.end(req, time.Since(t0), err)
	if err != nil || next == 0 {
		c.closeScan(rule, pc.pr)
	}
	if err != nil {
		c.s.cursors.forget(id)
		return c.pointError(req, err)
	}
	if next == 0 {
		c.s.cursors.forget(id)
	}
	return c.replyBody(req, reply)
}

// upPipeline sends several commands on the upstream connection at once and
// reads their replies in order: the upstream answers one connection's
// requests in order, so only the round trips are saved.
func (c *conn) upPipeline(cmds [][]byte) ([][]byte, error) {
	if len(cmds) == 1 {
		r, err := c.upCommand(cmds[0])
		return [][]byte{r}, err
	}
	buf := c.outBuf[:0]
	for _, cmd := range cmds {
		buf = wire.AppendMsg(buf, upstream.NextRequestID(), 0, 0, cmd)
	}
	c.outBuf = buf[:0]
	if err := c.up.Write(buf); err != nil {
		return nil, err
	}
	out := make([][]byte, len(cmds))
	for i := range cmds {
		_, rf, err := c.up.ReadMessage()
		if err != nil {
			return nil, err
		}
		var m wire.Msg
		if err := m.Decode(rf); err != nil {
			return nil, fmt.Errorf("upstream reply: %w", err)
		}
		out[i] = append([]byte(nil), m.Body...)
	}
	return out, nil
}
