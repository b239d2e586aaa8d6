package exec

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/upstream"
)

// Pool holds upstream connections of the proxy's own: dialled
// with the upstream URI's credentials, kept for a while after use
// (connIdle) so that a run of merges or background rounds does not dial
// for each, then closed, and at most maxIdle at a time. The merges'
// parallel inserts take theirs from Server.helpers, which an idle proxy
// holds none of; the background loops from Server.background, which their
// rounds, a second apart, keep in use.
type Pool struct {
	dial    func(ctx context.Context) (*upstream.Conn, error)
	maxIdle int
	open    atomic.Int64 // dialled and not closed: idle or in use (Server.BackgroundConns)

	mu     sync.Mutex
	idle   []*idleConn
	closed bool
}

type idleConn struct {
	up    *upstream.Conn
	timer *time.Timer // closes it once idle for connIdle
}

// connIdle is how long a pooled connection stays open unused;
// HelperMaxIdle how many of the merges' helpers stay open.
const (
	connIdle      = 10 * time.Second
	HelperMaxIdle = MergeInsertStreams
)

// helperTimeout bounds one command on a helper connection; the merge
// then runs it on its own connection.
const helperTimeout = 2 * time.Minute

func NewPool(dial func(ctx context.Context) (*upstream.Conn, error), maxIdle int) *Pool {
	return &Pool{dial: dial, maxIdle: maxIdle}
}

// run sends u on a helper connection (Helpers).
func (p *Pool) Run(u rewrite.Upstream) []byte {
	up, err := p.Get()
	if err != nil {
		return nil
	}
	if err := up.SetDeadline(time.Now().Add(helperTimeout)); err != nil {
		p.Discard(up)
		return nil
	}
	var buf []byte
	replies, err := Pipeline(up, &buf, rewrite.Step{u})
	if err != nil {
		p.Discard(up) // its state is not known
		return nil
	}
	p.Put(up)
	if !mongoerr.IsOK(replies[0]) {
		return nil
	}
	return replies[0]
}

func (p *Pool) Get() (*upstream.Conn, error) {
	return p.Take(context.Background())
}

// take returns an idle connection, or one dialled within ctx.
func (p *Pool) Take(ctx context.Context) (*upstream.Conn, error) {
	p.mu.Lock()
	for len(p.idle) > 0 {
		h := p.idle[len(p.idle)-1]
		p.idle = p.idle[:len(p.idle)-1]
		if h.timer.Stop() { // else its timer closes it
			p.mu.Unlock()
			return h.up, nil
		}
	}
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	up, err := p.dial(ctx)
	if err == nil {
		p.open.Add(1)
	}
	return up, err
}

// discard closes up, a connection of the pool's, for good.
func (p *Pool) Discard(up *upstream.Conn) {
	up.Close()
	p.open.Add(-1)
}

func (p *Pool) Put(up *upstream.Conn) {
	_ = up.SetDeadline(time.Time{})
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || len(p.idle) >= p.maxIdle {
		p.Discard(up)
		return
	}
	h := &idleConn{up: up}
	h.timer = time.AfterFunc(connIdle, func() {
		p.mu.Lock()
		for i, o := range p.idle {
			if o == h {
				p.idle = append(p.idle[:i], p.idle[i+1:]...)
				break
			}
		}
		p.mu.Unlock()
		p.Discard(up)
	})
	p.idle = append(p.idle, h)
}

// close closes the idle connections; those in use close when returned.
func (p *Pool) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	p.closeIdleLocked()
}

// closeIdle closes the idle connections: after a failure, which an
// upstream restart gives every one of them.
func (p *Pool) CloseIdle() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closeIdleLocked()
}

func (p *Pool) closeIdleLocked() {
	for _, h := range p.idle {
		if h.timer.Stop() {
			p.Discard(h.up)
		}
	}
	p.idle = nil
}

// Open counts the connections dialled and not closed: idle or in use.
func (p *Pool) Open() int { return int(p.open.Load()) }

// Idle counts the idle connections.
func (p *Pool) Idle() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle)
}
