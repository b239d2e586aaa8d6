package handler

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/tsproxy/tsproxy/proxy/exec"
	"github.com/tsproxy/tsproxy/wire"
)

// ensureUpstream dials this client's upstream connection on first use.
func (c *Conn) ensureUpstream() error {
	if c.up != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	up, err := c.s.Opts.Dialer.Dial(ctx)
	if err != nil {
		c.s.Tel.ErrorSeen("upstream_unreachable")
		return err
	}
	c.up = up
	c.upRef.Store(up)
	if c.front.Closed() {
		// forceClose (a Shutdown) ran during the dial and found nothing to
		// close: it sets closed before it loads upRef, and this stores
		// upRef before it loads closed, so one of the two closes it.
		up.Close()
		return net.ErrClosed
	}
	return nil
}

// passthrough forwards the client's bytes unchanged (but for the
// exhaustAllowed and moreToCome flags) and the upstream's reply unchanged.
func (c *Conn) passthrough(req *request) error {
	if err := c.ensureUpstream(); err != nil {
		return c.replyUpstreamDown(req, err)
	}
	fwd := req.frame
	if req.legacy {
		fwd = wire.AppendMsg(c.outBuf[:0], req.h.RequestID, 0, 0, req.msg.Body)
		c.outBuf = fwd[:0]
	} else if req.msg.Flags&(wire.ExhaustAllowed|wire.MoreToCome) != 0 {
		// The proxy answers one request with one reply; without the flag
		// the upstream never streams. A moreToCome request goes upstream
		// as an ordinary one and its reply is dropped: some upstreams
		// (FerretDB 1.24) answer moreToCome messages all the same, and a
		// reply left unread would be taken for the next request's.
		f, err := wire.SetMsgFlags(req.frame, req.msg.Flags&^(wire.ExhaustAllowed|wire.MoreToCome))
		if err != nil {
			return err
		}
		fwd = f
	}
	span := c.s.Tel.Start(req.name, req.db, routePassthrough.String(), req.start)
	upStart := time.Now()
	_, reply, err := exec.Forward(c.up, fwd)
	c.endAfterReply(span, time.Since(upStart), err)
	if err != nil {
		return err // afterLinkLoss decides whether the client keeps its connection
	}
	if req.msg.Flags&wire.MoreToCome != 0 {
		return nil // the client reads no reply
	}
	if coll, ok := quotedCreation(req, reply); ok {
		body, retried, err := c.createQuoted(req, coll, reply, fwd)
		if err != nil {
			return err
		}
		if body != nil {
			return c.replyBody(req, body)
		}
		reply = retried
	}
	if req.legacy {
		var m wire.Msg
		if err := m.Decode(reply); err != nil {
			return fmt.Errorf("upstream reply: %w", err)
		}
		return c.replyBody(req, m.Body)
	}
	return c.writeFrame(req, reply)
}
