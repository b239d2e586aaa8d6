package tier

import (
	"errors"
	"sync"
	"sync/atomic"

	"github.com/tsproxy/tsproxy/proxy/exec"
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/stage"
)

// combiner lets concurrent staged inserts share one upstream insert
// (package rewrite/stage says why). Inserts share when their command
// bodies are the same bytes (one staging collection, one write concern)
// and their connections have the same users, so the shared insert runs
// with privileges every one of them has; it runs on the connection of
// the insert that leads it.
//
// An insert leads at once when no insert of its key is in flight; the
// ones that arrive meanwhile wait, and when the flight lands the first
// of them leads the next insert, taking the others along (up to
// stage.MaxCombinedDocs and MaxCombinedBytes). Nothing waits for
// company, so a lone client pays nothing. What waits is bounded by the
// client connections: each has one request in flight at most.
type combiner struct {
	mu     sync.Mutex
	queues map[string][]*combined // by key; present while an insert of the key is in flight

	shared, riders atomic.Int64 // SharedInserts
	// flying counts the combinable inserts in runCombined. One that finds
	// none other there has nothing to share with, nor to wait behind:
	// it runs without a key or a queue (a per-event insert's usual case,
	// one client). One that arrives meanwhile leads a flight of its own
	// key, as when no insert of the key is in flight.
	flying atomic.Int64
}

// combined is one client's insert in the combiner.
type combined struct {
	u     rewrite.Upstream
	bytes int
	// wake is signalled once: with done set, the reply is in; otherwise
	// this insert leads the next flight.
	wake  chan struct{}
	done  bool
	reply []byte
	err   error
}

// errLeaderGone answers inserts whose shared insert's leader stopped
// without an outcome (its connection's goroutine ended).
var errLeaderGone = errors.New("tsproxy: a shared staging insert ended without a reply")

func newCombined(u rewrite.Upstream) *combined {
	n := 0
	for _, d := range u.Seq.Documents {
		n += len(d)
	}
	return &combined{u: u, bytes: n, wake: make(chan struct{}, 1)}
}

// RunCombined runs u, a combinable insert, sharing it with concurrent
// ones of the same key (by identity, the client's
// authenticated user), on r.
func (t *Tier) RunCombined(r exec.Runner, identityOf func() (string, error), u rewrite.Upstream) ([][]byte, error) {
	if u.Seq == nil {
		return r.RunStep(rewrite.Step{{Body: u.Body}})
	}
	cb := &t.combiner
	defer cb.flying.Add(-1)
	if cb.flying.Add(1) == 1 {
		return r.RunStep(rewrite.Step{{Body: u.Body, Seq: u.Seq}})
	}
	identity, err := identityOf()
	if err != nil {
		return nil, err
	}
	key := identity + "\x00" + string(u.Body)
	me := newCombined(u)
	cb.mu.Lock()
	if cb.queues == nil {
		cb.queues = map[string][]*combined{}
	}
	if queue, inFlight := cb.queues[key]; inFlight {
		cb.queues[key] = append(queue, me)
		cb.mu.Unlock()
		<-me.wake
		if me.done {
			if me.err != nil {
				return nil, me.err
			}
			return [][]byte{me.reply}, nil
		}
	} else {
		cb.queues[key] = nil
		cb.mu.Unlock()
	}
	reply, err := t.leadCombined(r, key, me)
	if err != nil {
		return nil, err
	}
	return [][]byte{reply}, nil
}

// leadCombined sends me and the inserts waiting behind it as one insert,
// answers them, and hands the key to the next waiting insert.
func (t *Tier) leadCombined(r exec.Runner, key string, me *combined) (reply []byte, err error) {
	cb := &t.combiner
	flight := cb.board(key, me)
	delivered := 1 // flight[0] is me: answered by the return
	defer func() {
		// Whatever happened, every insert that rode along gets an answer
		// and the next one leads.
		for _, o := range flight[delivered:] {
			o.done, o.err = true, errLeaderGone
			o.wake <- struct{}{}
		}
		cb.handOver(key)
	}()
	if len(flight) == 1 {
		replies, err := r.RunStep(rewrite.Step{{Body: me.u.Body, Seq: me.u.Seq}})
		if err != nil {
			return nil, err
		}
		return replies[0], nil
	}
	parts := make([]*rewrite.Sequence, len(flight))
	sizes := make([]int, len(flight))
	for i, o := range flight {
		parts[i], sizes[i] = o.u.Seq, len(o.u.Seq.Documents)
	}
	cb.shared.Add(1)
	cb.riders.Add(int64(len(flight) - 1))
	replies, err := r.RunStep(rewrite.Step{stage.Combine(me.u.Body, parts)})
	var split [][]byte
	if err == nil {
		split = stage.SplitReply(replies[0], sizes)
	}
	for i, o := range flight[1:] {
		o.done, o.err = true, err
		if err == nil {
			o.reply = split[i+1]
		}
		o.wake <- struct{}{}
		delivered++
	}
	if err != nil {
		return nil, err
	}
	return split[0], nil
}

// board takes me and the inserts waiting for key that fit with it.
func (cb *combiner) board(key string, me *combined) []*combined {
	cb.mu.Lock()
	defer cb.mu.Unlock()
	flight := []*combined{me}
	docs, bytes := len(me.u.Seq.Documents), me.bytes
	queue := cb.queues[key]
	for len(queue) > 0 {
		next := queue[0]
		if docs+len(next.u.Seq.Documents) > stage.MaxCombinedDocs || bytes+next.bytes > stage.MaxCombinedBytes {
			break
		}
		flight = append(flight, next)
		docs, bytes = docs+len(next.u.Seq.Documents), bytes+next.bytes
		queue = queue[1:]
	}
	cb.queues[key] = queue
	return flight
}

// handOver wakes the first insert waiting for key to lead the next
// flight, or ends the key's flights.
func (cb *combiner) handOver(key string) {
	cb.mu.Lock()
	defer cb.mu.Unlock()
	queue := cb.queues[key]
	if len(queue) == 0 {
		delete(cb.queues, key)
		return
	}
	next := queue[0]
	cb.queues[key] = queue[1:]
	next.wake <- struct{}{}
}

// SharedInserts counts, since the start, the upstream inserts that
// carried more than one client's staged insert, and the client inserts
// that rode along in one another led.
func (t *Tier) SharedInserts() (inserts, riders int64) {
	return t.combiner.shared.Load(), t.combiner.riders.Load()
}
