package exec

import (
	"context"

	"github.com/tsproxy/tsproxy/upstream"
)

// Background is the upstream connection of one piece of the proxy's
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
type Background struct {
	pool *Pool
	ctx  context.Context
	up   *upstream.Conn
	stop func() bool // stops the close at ctx's end
}

// NewBackground is a background connection taken from pool, closed when
// ctx ends.
func NewBackground(ctx context.Context, pool *Pool) *Background {
	return &Background{pool: pool, ctx: ctx}
}

// Get returns the connection, dialling one when there is none.
func (b *Background) Get() (*upstream.Conn, error) {
	if b.up != nil {
		return b.up, nil
	}
	c, err := b.pool.Take(b.ctx)
	if err != nil {
		return nil, err
	}
	b.up = c
	b.stop = context.AfterFunc(b.ctx, func() { b.pool.Discard(c) })
	return c, nil
}

// Close closes the connection, if any; the next get takes another.
func (b *Background) Close() { b.End(false) }

// Fail closes the connection after a failed round, whose connection's
// state is not known, and the pool's idle ones: the failure may be the
// upstream's restart, which leaves each of them dead, to fail a round of
// its own.
func (b *Background) Fail() {
	b.Close()
	b.pool.CloseIdle()
}

// Release gives the connection, if any, back to the pool after a round
// that went well; the next get takes one from there.
func (b *Background) Release() { b.End(true) }

// EndRound lets the connection go after a round of background work
// that ended with err: back to the pool between rounds (release), or
// closed with the pool's idle ones after a failure (fail).
func (b *Background) EndRound(err error) {
	if err != nil {
		b.Fail()
	} else {
		b.Release()
	}
}

// End lets the connection go, if any: back to the pool when pooled, else
// closed. A connection whose ctx ended is closed already.
func (b *Background) End(pooled bool) {
	if b.up == nil {
		return
	}
	if b.stop() {
		if pooled {
			b.pool.Put(b.up)
		} else {
			b.pool.Discard(b.up)
		}
	}
	b.up = nil
}
