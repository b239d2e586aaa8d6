package handler

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/upstream"
	"github.com/tsproxy/tsproxy/wire"
)

// redialTimeout bounds the dial that tells a dropped link from a server
// that is down.
const redialTimeout = 2 * time.Second

// afterLinkLoss decides what a request whose upstream connection broke
// (err) does to its client's connection. A link cut on the way or an
// upstream that is down closes it, as before: the driver reconnects,
// retries what it may and finds the proxy again once the server is back.
// An upstream that drops one connection on a command it cannot take
// (FerretDB v1.24 on a message holding a NaN or a Decimal128) but answers
// a new one must not cost the client its connection: the request is answered with an error saying
// so, and the connection goes on with the new link. Only when the old
// link carried the client's authentication, which the proxy cannot
// replay, is the connection closed after that reply (its driver then
// reconnects and authenticates again).
func (c *Conn) afterLinkLoss(req *request, err error) error {
	var link *upstream.LinkError
	if !errors.As(err, &link) || req.replied || c.front.Left() || c.front.Closed() || c.s.Closing.Load() {
		return err
	}
	// Only a known cause in the client's own message: a link cut on the
	// way (a lost reply) must close the connection as before, so that the
	// driver retries a retryable write and the reply cache answers it.
	path, known := findNaNOrDecimal(&req.msg)
	if !known {
		return err
	}
	c.dropUpstream()
	ctx, cancel := context.WithTimeout(context.Background(), redialTimeout)
	defer cancel()
	up, derr := c.s.Opts.Dialer.Dial(ctx)
	if derr != nil {
		return err // the upstream is down, not just this link
	}
	c.s.Tel.ErrorSeen("upstream_dropped_link")
	c.log.Warn("the upstream closed the connection on a command, and serves a new one", "command", req.name, "db", req.db, "reason", err.Error())
	if c.upAuth {
		up.Close()
	} else {
		c.up = up
		c.upRef.Store(up)
	}
	if req.msg.Flags&wire.MoreToCome == 0 {
		if rerr := c.replyError(req, mongoerr.InternalError, linkLossMessage(req, path)); rerr != nil {
			return rerr
		}
	}
	if c.upAuth {
		return fmt.Errorf("%w (the client's authentication lived on that connection)", err)
	}
	return nil
}

// linkLossMessage says what the upstream did to req, which holds a NaN
// or a Decimal128 at path.
func linkLossMessage(req *request, path string) string {
	return fmt.Sprintf("tsproxy: the upstream closed its connection while it ran %s on database %q, and accepts new connections: the command holds a NaN or a Decimal128 at %s, which the upstream cannot take (FerretDB 1.x closes its connection on any message holding one)", req.name, req.db, path)
}

// findNaNOrDecimal is the path of the first NaN or Decimal128 in m's
// body or document sequences.
func findNaNOrDecimal(m *wire.Msg) (string, bool) {
	if p, ok := bsonutil.FindValue(m.Body, bsonutil.IsNaNOrDecimal); ok {
		return p, true
	}
	for _, seq := range m.Sequences {
		for i, d := range seq.Documents {
			if p, ok := bsonutil.FindValue(d, bsonutil.IsNaNOrDecimal); ok {
				return bsonutil.IndexPath(seq.Identifier, i) + "." + p, true
			}
		}
	}
	return "", false
}

// dropUpstream closes the client's upstream connection after it broke;
// the next command dials a new one.
func (c *Conn) dropUpstream() {
	if c.up != nil {
		c.up.Close()
	}
	c.up = nil
	c.upRef.Store(nil)
}
