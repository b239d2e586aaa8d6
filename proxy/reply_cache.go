package proxy

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/expirable"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/wire"
)

// The reply cache is the proxy's version of MongoDB's session transaction
// table, for the writes it rewrites. A driver retries a retryable write
// (same lsid and txnNumber) when it did not read the reply, often on
// another connection: the reply may have been lost after the proxy wrote
// it, with the upstream's write done. FerretDB does not recognise retries,
// and the proxy, knowing the buckets' fills, would not check what is
// stored: the events would be stored (or counted) twice. So the proxy
// keeps, per session, the last txnNumber it rewrote and the reply it
// gave, and answers a retry with that reply, as MongoDB does.
//
// The table is in memory: after a restart, the check of what is stored
// (insert_replay.go, rewrite/counter_retry.go) recognises retries. A
// session's write that is still running makes the next write of that
// session wait for its outcome (MongoDB checks a session out to one
// operation at a time), so a retry that overtakes its first attempt never
// runs beside it.

// Defaults of the reply cache (rules: limits.retryCacheSize,
// limits.retryCacheTTL). MongoDB keeps a session's record for its
// logicalSessionTimeoutMinutes, 30 by default.
const (
	defaultRetryCacheSize = 100_000
	defaultRetryCacheTTL  = 30 * time.Minute
)

// retryWindow is how long after its first attempt a driver's retry may
// plausibly come (drivers retry at once, after selecting a server, within
// serverSelectionTimeoutMS, 30 s by default). A record evicted younger
// than that makes the proxy check what is stored for every retryable write
// it does not find, for retryWindow.
const retryWindow = 2 * time.Minute

// retryWaitLimit bounds how long a write waits for its session's running
// write before it is refused.
const retryWaitLimit = 2 * time.Minute

type replyCache struct {
	mu      sync.Mutex
	running map[string]*txnAttempt // by session
	done    *expirable.LRU[string, txnRecord]
	wait    time.Duration
	// unsureUntil (unix ns): a young record was evicted; until then a
	// miss may be a retry whose record is gone. Atomic: the LRU's expiry
	// goroutine sets it too.
	unsureUntil atomic.Int64
	now         func() time.Time
}

// txnRecord is a session's last recorded write.
type txnRecord struct {
	txn   int64
	op    string // rule namespace and command name
	reply []byte
	at    time.Time
}

// txnAttempt is a write running under its session's key; finish ends it.
type txnAttempt struct {
	cache *replyCache
	key   rewrite.RetryKey
	op    string
	done  chan struct{}
	reply []byte
	// check says a retry of this write cannot be ruled out although the
	// cache has no record of it: check what is stored.
	check bool
}

// txnOutcome is what begin decides for a retryable write: run it
// (attempt), answer with the recorded reply, or refuse it (err).
type txnOutcome struct {
	attempt *txnAttempt
	reply   []byte
	err     error
}

func newReplyCache(size int, ttl time.Duration) *replyCache {
	rc := &replyCache{running: map[string]*txnAttempt{}, wait: retryWaitLimit, now: time.Now}
	rc.done = expirable.NewLRU[string, txnRecord](size, rc.evicted, ttl)
	return rc
}

// evicted runs under the LRU's lock (so it must not call it), from Add
// or from its expiry goroutine. A record evicted while a retry of it may
// still come makes misses unsure for a while.
func (rc *replyCache) evicted(_ string, r txnRecord) {
	now := rc.now()
	if now.Sub(r.at) >= retryWindow {
		return
	}
	until := now.Add(retryWindow).UnixNano()
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
func (rc *replyCache) begin(key rewrite.RetryKey, op string) txnOutcome {
	deadline := rc.now().Add(rc.wait)
	for {
		rc.mu.Lock()
		if a := rc.running[key.Session]; a != nil {
			rc.mu.Unlock()
			if !waitUntil(a.done, deadline) {
				return txnOutcome{err: &mongoerr.Error{Code: mongoerr.ConflictingOperationInProgress, Msg: fmt.Sprintf(
					"tsproxy: a write of session %s (txnNumber %d) is still running after %s; this one (txnNumber %d) is not run beside it",
					key.SessionHex(), a.key.TxnNumber, rc.wait, key.TxnNumber)}}
			}
			continue
		}
		rec, found := rc.done.Get(key.Session)
		if found && key.TxnNumber <= rec.txn {
			rc.mu.Unlock()
			switch {
			case key.TxnNumber < rec.txn:
				return txnOutcome{err: rewrite.TransactionTooOld(key, rec.txn)}
			case rec.op != op:
				return txnOutcome{err: &mongoerr.Error{Code: mongoerr.BadValue, Msg: fmt.Sprintf(
					"txnNumber %d of session %s was used by %s; a retry must repeat the same write, not %s", key.TxnNumber, key.SessionHex(), rec.op, op)}}
			}
			return txnOutcome{reply: rec.reply}
		}
		a := &txnAttempt{cache: rc, key: key, op: op, done: make(chan struct{}),
			check: !found && rc.now().UnixNano() < rc.unsureUntil.Load()}
		rc.running[key.Session] = a
		rc.mu.Unlock()
		return txnOutcome{attempt: a}
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
func (a *txnAttempt) offer(reply []byte) {
	if rewrite.ReplyRecordable(reply) {
		a.reply = append(a.reply[:0], reply...)
	}
}

// finish records the attempt's reply, if it got one, and lets the
// session's waiting writes go on.
func (a *txnAttempt) finish() {
	rc := a.cache
	rc.mu.Lock()
	delete(rc.running, a.key.Session)
	if a.reply != nil {
		rc.done.Add(a.key.Session, txnRecord{txn: a.key.TxnNumber, op: a.op, reply: a.reply, at: rc.now()})
	}
	rc.mu.Unlock()
	close(a.done)
}

// Len is the number of sessions recorded.
func (rc *replyCache) Len() int { return rc.done.Len() }

// retriedReply runs before a rewritten write. For a retryable write it
// answers a retry of a recorded write with its reply, refuses one that
// cannot be run (done is true then), or registers the attempt in
// req.txn; endRetryable must follow.
func (c *conn) retriedReply(req *request, rule *rules.Rule) (done bool, err error) {
	if !commands[req.name].retryable {
		return false, nil
	}
	key, ok, kerr := rewrite.RetryKeyOf(req.msg.Body)
	unacked := req.msg.Flags&wire.MoreToCome != 0
	if kerr == nil && !ok {
		return false, nil
	}
	var out txnOutcome
	if kerr != nil {
		out.err = kerr
	} else {
		identity, err := c.identity()
		if err != nil {
			return true, err
		}
		out = c.s.replies.begin(key.OwnedBy(identity), rule.Namespace+" "+req.name)
	}
	switch {
	case out.attempt != nil:
		req.txn = out.attempt
		return false, nil
	case unacked:
		return true, nil
	case out.err != nil:
		c.log.Info("retryable write refused", "rule", rule.Namespace, "err", out.err.Error())
		return true, c.replyBody(req, mongoerr.Reply(out.err))
	}
	c.log.Info("retried write answered with its recorded reply", "rule", rule.Namespace, "txnNumber", key.TxnNumber)
	return true, c.replyBody(req, out.reply)
}

// endRetryable ends the request's attempt, if it has one.
func (c *conn) endRetryable(req *request) {
	if req.txn != nil {
		req.txn.finish()
		req.txn = nil
	}
}
