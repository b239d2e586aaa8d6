package proxy

import (
	"context"

	"github.com/tsproxy/tsproxy/upstream"
)

// backgroundConn is the upstream connection of one piece of the proxy's
// background work (retention, merges): dialled like the clients' (so with
// the credentials of the upstream URI, if any) when needed, and closed
// when ctx ends, so that a round trip in progress at shutdown returns.
// It belongs to one goroutine. Between rounds it goes back to the proxy's
// pool of background connections (release), which keeps a few open for
// helperIdle: each rule's merger runs a round a second, and dialling for
// each (a handshake, and the credentials' SCRAM exchange where the URI
// has some) cost the upstream a connection a second per rule: in
// tsbench ingest's run of 40 rules on the embedded upstream, one client's
// batch-1 calls took 1.55–1.60x direct at p50, and 1.29x once pooled.
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
	c, err := b.s.background.Take(b.ctx)
	if err != nil {
		return nil, err
	}
	b.up = c
	b.stop = context.AfterFunc(b.ctx, func() { b.s.background.Discard(c) })
	return c, nil
}

// close closes the connection, if any; the next get takes another.
func (b *backgroundConn) close() { b.end(false) }

// fail closes the connection after a failed round, whose connection's
// state is not known, and the pool's idle ones: the failure may be the
// upstream's restart, which leaves each of them dead, to fail a round of
// its own.
func (b *backgroundConn) fail() {
	b.close()
	b.s.background.CloseIdle()
}

// release gives the connection, if any, back to the pool after a round
// that went well; the next get takes one from there.
func (b *backgroundConn) release() { b.end(true) }

// endRound lets the connection go after a round of background work
// that ended with err: back to the pool between rounds (release), or
// closed with the pool's idle ones after a failure (fail).
func (b *backgroundConn) endRound(err error) {
	if err != nil {
		b.fail()
	} else {
		b.release()
	}
}

// end lets the connection go, if any: back to the pool when pooled, else
// closed. A connection whose ctx ended is closed already.
func (b *backgroundConn) end(pooled bool) {
	if b.up == nil {
		return
	}
	if b.stop() {
		if pooled {
			b.s.background.Put(b.up)
		} else {
			b.s.background.Discard(b.up)
		}
	}
	b.up = nil
}

// backgroundMaxIdle is how many background connections stay open between
// rounds: the rules' rounds start at random points of their second, so a few
// serve them all.
const backgroundMaxIdle = 4
