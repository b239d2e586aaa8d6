package proxy

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/upstream"
)

// A merge's large bucket insert goes as a step of Parallel commands
// (stage.MergeOptions.InsertStreams): FerretDB spends most of a merge
// encoding the buckets it inserts, on one core per connection, and on
// PostgreSQL a second connection is a second backend process. 56
// buckets of 1,000 events (4.4 MB) took 98 ms on one connection and 55
// ms on two on FerretDB over PostgreSQL 15, 42 and 34 ms on the embedded
// upstream, on this 2-core machine (four connections gained nothing
// more there, and lost on SQLite).

// mergeInsertStreams is how many connections a merge's large bucket
// insert is spread over.
const mergeInsertStreams = 2

// parallelRunner runs a merge's steps on r, but the commands of a step
// that are all Parallel at once: the first on r, each other one on a
// helper connection of the proxy's own. A command a helper could not run
// (no connection, a network failure, a command error such as a refusal
// of the proxy's credentials) runs on r afterwards: the commands are
// inserts a repeated run accepts (a duplicate bucket is verified by the
// merge), so running one twice stores it once.
type parallelRunner struct {
	r       stepRunner
	helpers helperRunner
}

// helperRunner runs one command on a helper connection: its reply body,
// or nil when it could not run it there or the upstream refused it.
type helperRunner interface {
	run(u rewrite.Upstream) []byte
}

func (p parallelRunner) runStep(step rewrite.Step) ([][]byte, error) {
	if len(step) < 2 || p.helpers == nil || !allParallel(step) {
		return p.r.runStep(step)
	}
	out := make([][]byte, len(step))
	var wg sync.WaitGroup
	for i := 1; i < len(step); i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = p.helpers.run(step[i]) // nil: not run
		}()
	}
	first, err := p.r.runStep(step[:1])
	wg.Wait()
	if err != nil {
		return nil, err
	}
	out[0] = first[0]
	for i := 1; i < len(step); i++ {
		if out[i] != nil {
			continue
		}
		replies, err := p.r.runStep(step[i : i+1])
		if err != nil {
			return nil, err
		}
		out[i] = replies[0]
	}
	return out, nil
}

func allParallel(step rewrite.Step) bool {
	for _, u := range step {
		if !u.Parallel {
			return false
		}
	}
	return true
}

// helperPool holds upstream connections of the proxy's own: dialled
// with the upstream URI's credentials, kept for a while after use
// (helperIdle) so that a run of merges or background rounds does not dial
// for each, then closed, and at most maxIdle at a time. The merges'
// parallel inserts take theirs from Server.helpers, which an idle proxy
// holds none of; the background loops from Server.background
// (background.go), which their rounds, a second apart, keep in use.
type helperPool struct {
	dial    func(ctx context.Context) (*upstream.Conn, error)
	maxIdle int
	open    atomic.Int64 // dialled and not closed: idle or in use (Server.BackgroundConns)

	mu     sync.Mutex
	idle   []*idleHelper
	closed bool
}

type idleHelper struct {
	up    *upstream.Conn
	timer *time.Timer // closes it once idle for helperIdle
}

// helperIdle is how long a helper connection stays open unused;
// helperMaxIdle how many of the merges' helpers stay open.
const (
	helperIdle    = 10 * time.Second
	helperMaxIdle = mergeInsertStreams
)

// helperTimeout bounds one command on a helper connection; the merge
// then runs it on its own connection.
const helperTimeout = 2 * time.Minute

func newHelperPool(dial func(ctx context.Context) (*upstream.Conn, error), maxIdle int) *helperPool {
	return &helperPool{dial: dial, maxIdle: maxIdle}
}

// run sends u on a helper connection (helperRunner).
func (p *helperPool) run(u rewrite.Upstream) []byte {
	up, err := p.get()
	if err != nil {
		return nil
	}
	if err := up.SetDeadline(time.Now().Add(helperTimeout)); err != nil {
		p.discard(up)
		return nil
	}
	var buf []byte
	replies, err := pipeline(up, &buf, rewrite.Step{u})
	if err != nil {
		p.discard(up) // its state is not known
		return nil
	}
	p.put(up)
	if !mongoerr.IsOK(replies[0]) {
		return nil
	}
	return replies[0]
}

func (p *helperPool) get() (*upstream.Conn, error) {
	return p.take(context.Background())
}

// take returns an idle connection, or one dialled within ctx.
func (p *helperPool) take(ctx context.Context) (*upstream.Conn, error) {
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
func (p *helperPool) discard(up *upstream.Conn) {
	up.Close()
	p.open.Add(-1)
}

func (p *helperPool) put(up *upstream.Conn) {
	_ = up.SetDeadline(time.Time{})
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || len(p.idle) >= p.maxIdle {
		p.discard(up)
		return
	}
	h := &idleHelper{up: up}
	h.timer = time.AfterFunc(helperIdle, func() {
		p.mu.Lock()
		for i, o := range p.idle {
			if o == h {
				p.idle = append(p.idle[:i], p.idle[i+1:]...)
				break
			}
		}
		p.mu.Unlock()
		p.discard(up)
	})
	p.idle = append(p.idle, h)
}

// close closes the idle helpers; those in use close when returned.
func (p *helperPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	p.closeIdleLocked()
}

// closeIdle closes the idle connections: after a failure, which an
// upstream restart gives every one of them.
func (p *helperPool) closeIdle() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closeIdleLocked()
}

func (p *helperPool) closeIdleLocked() {
	for _, h := range p.idle {
		if h.timer.Stop() {
			p.discard(h.up)
		}
	}
	p.idle = nil
}
