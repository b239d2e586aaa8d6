package proxy

import (
	"context"
	"time"

	"github.com/tsproxy/tsproxy/upstream"
)

// backgroundConn is the upstream connection of one piece of the proxy's
// background work (retention, merges): dialled like the clients' (so with
// the credentials of the upstream URI, if any) when needed, and closed
// when ctx ends, so that a round trip in progress at shutdown returns.
// It belongs to one goroutine.
type backgroundConn struct {
	s    *Server
	ctx  context.Context
	up   *upstream.Conn
	stop func() bool // stops the close at ctx's end
}

func newBackgroundConn(ctx context.Context, s *Server) *backgroundConn {
	return &backgroundConn{s: s, ctx: ctx}
}

// get returns the connection, dialling one when there is none.
func (b *backgroundConn) get() (*upstream.Conn, error) {
	if b.up != nil {
		return b.up, nil
	}
	dctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	c, err := b.s.opts.Dialer.Dial(dctx)
	cancel()
	if err != nil {
		return nil, err
	}
	b.up = c
	b.stop = context.AfterFunc(b.ctx, func() { _ = c.Close() })
	return c, nil
}

// close closes the connection, if any; the next get dials again.
func (b *backgroundConn) close() {
	if b.up == nil {
		return
	}
	b.stop()
	b.up.Close()
	b.up = nil
}
