package replycache

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/expirable"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// Defaults of the reply cache (rules: limits.retryCacheSize,
// limits.retryCacheTTL). MongoDB keeps a session's record for its
// logicalSessionTimeoutMinutes, 30 by default.
const (
	DefaultSize = 100_000
	DefaultTTL  = 30 * time.Minute
)

// RetryWindow is how long after its first attempt a driver's retry may
// plausibly come (drivers retry at once, after selecting a server, within
// serverSelectionTimeoutMS, 30 s by default). A record evicted younger
// than that makes the proxy check what is stored for every retryable write
// it does not find, for RetryWindow.
const RetryWindow = 2 * time.Minute

// waitLimit bounds how long a write waits for its session's running
// write before it is refused.
const waitLimit = 2 * time.Minute

type Cache struct {
	mu      sync.Mutex
	running map[string]*Attempt // by session
	done    *expirable.LRU[string, record]
	Wait    time.Duration
	// unsureUntil (unix ns): a young record was evicted; until then a
	// miss may be a retry whose record is gone. Atomic: the LRU's expiry
	// goroutine sets it too.
	unsureUntil atomic.Int64
	Now         func() time.Time
}

// record is a session's last recorded write.
type record struct {
	txn   int64
	op    string // rule namespace and command name
	reply []byte
	at    time.Time
}

// Attempt is a write running under its session's key; finish ends it.
type Attempt struct {
	cache *Cache
	key   rewrite.RetryKey
	op    string
	done  chan struct{}
	reply []byte
	// check says a retry of this write cannot be ruled out although the
	// cache has no record of it: check what is stored.
	Check bool
	// Previous is when the session's last write was recorded here (zero:
	// none is): the session's writes since went through this proxy.
	Previous time.Time
}

// Outcome is what begin decides for a retryable write: run it
// (attempt), answer with the recorded reply, or refuse it (err).
type Outcome struct {
	Attempt *Attempt
	Reply   []byte
	Err     error
}

func New(size int, ttl time.Duration) *Cache {
	rc := &Cache{running: map[string]*Attempt{}, Wait: waitLimit, Now: time.Now}
	rc.done = expirable.NewLRU[string, record](size, rc.evicted, ttl)
	return rc
}

// evicted runs under the LRU's lock (so it must not call it), from Add
// or from its expiry goroutine. A record evicted while a retry of it may
// still come makes misses unsure for a while.
func (rc *Cache) evicted(_ string, r record) {
	now := rc.Now()
	if now.Sub(r.at) >= RetryWindow {
		return
	}
	until := now.Add(RetryWindow).UnixNano()
	for {
		cur := rc.unsureUntil.Load()
		if cur >= until || rc.unsureUntil.CompareAndSwap(cur, until) {
			return
		}
	}
}

// begin looks the write key (of operation op) up: a record of the same
// txnNumber answers it, an older txnNumber is refused, anything else runs
// as the session's attempt. It waits for a running write of the session.
func (rc *Cache) Begin(key rewrite.RetryKey, op string) Outcome {
	deadline := rc.Now().Add(rc.Wait)
	for {
		rc.mu.Lock()
		if a := rc.running[key.Session]; a != nil {
			rc.mu.Unlock()
			if !waitUntil(a.done, deadline) {
				return Outcome{Err: &mongoerr.Error{Code: mongoerr.ConflictingOperationInProgress, Msg: fmt.Sprintf(
					"tsproxy: a write of session %s (txnNumber %d) is still running after %s; this one (txnNumber %d) is not run beside it",
					key.SessionHex(), a.key.TxnNumber, rc.Wait, key.TxnNumber)}}
			}
			continue
		}
		rec, found := rc.done.Get(key.Session)
		if found && key.TxnNumber <= rec.txn {
			rc.mu.Unlock()
			switch {
			case key.TxnNumber < rec.txn:
				return Outcome{Err: rewrite.TransactionTooOld(key, rec.txn)}
			case rec.op != op:
				return Outcome{Err: &mongoerr.Error{Code: mongoerr.BadValue, Msg: fmt.Sprintf(
					"txnNumber %d of session %s was used by %s; a retry must repeat the same write, not %s", key.TxnNumber, key.SessionHex(), rec.op, op)}}
			}
			return Outcome{Reply: rec.reply}
		}
		a := &Attempt{cache: rc, key: key, op: op, done: make(chan struct{}),
			Check: !found && rc.Now().UnixNano() < rc.unsureUntil.Load()}
		if found {
			a.Previous = rec.at
		}
		rc.running[key.Session] = a
		rc.mu.Unlock()
		return Outcome{Attempt: a}
	}
}

func waitUntil(done <-chan struct{}, deadline time.Time) bool {
	d := time.Until(deadline)
	if d <= 0 {
		select {
		case <-done:
			return true
		default:
			return false
		}
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// offer takes the reply the proxy gives the write; one that says the
// write's outcome is recorded when the attempt finishes.
func (a *Attempt) Offer(reply []byte) {
	if rewrite.ReplyRecordable(reply) {
		a.reply = append(a.reply[:0], reply...)
	}
}

// finish records the attempt's reply, if it got one, and lets the
// session's waiting writes go on.
func (a *Attempt) Finish() {
	rc := a.cache
	rc.mu.Lock()
	delete(rc.running, a.key.Session)
	if a.reply != nil {
		rc.done.Add(a.key.Session, record{txn: a.key.TxnNumber, op: a.op, reply: a.reply, at: rc.Now()})
	}
	rc.mu.Unlock()
	close(a.done)
}

// Len is the number of sessions recorded.
func (rc *Cache) Len() int { return rc.done.Len() }
