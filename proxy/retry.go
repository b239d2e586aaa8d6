package proxy

import (
	"github.com/tsproxy/tsproxy/proxy/fills"
	"github.com/tsproxy/tsproxy/proxy/replycache"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/wire"
)

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
	var out replycache.Outcome
	if kerr != nil {
		out.Err = kerr
	} else {
		identity, err := c.identity()
		if err != nil {
			return true, err
		}
		out = c.s.replies.Begin(key.OwnedBy(identity), rule.Namespace+" "+req.name)
	}
	switch {
	case out.Attempt != nil:
		req.txn = out.Attempt
		return false, nil
	case unacked:
		return true, nil
	case out.Err != nil:
		c.log.Info("retryable write refused", "rule", rule.Namespace, "err", out.Err.Error())
		return true, c.replyBody(req, mongoerr.Reply(out.Err))
	}
	c.log.Info("retried write answered with its recorded reply", "rule", rule.Namespace, "txnNumber", key.TxnNumber)
	return true, c.replyBody(req, out.Reply)
}

// endRetryable ends the request's attempt, if it has one.
func (c *conn) endRetryable(req *request) {
	if req.txn != nil {
		req.txn.Finish()
		req.txn = nil
	}
}

// The proxy recognises a driver's retry of an insert the upstream cannot
// recognise (see rewrite/insert/replay.go). Checking costs a read of the key's
// buckets, so it checks only when a retry of a write it did not see
// through is possible: when it does not know the key's fill. That is the
// case after any failure whose outcome it did not learn (it forgets the
// fills then) and after a restart; while it knows a fill, every write of
// that key went through it and got its reply, and a retry of such a
// write is answered from the reply cache (proxy/replycache).

// keysToCheck are the locked keys whose buckets a retry may have been
// stored in already: those whose fill is unknown, or all when the reply
// cache lost records a retry may still need.
func (c *conn) keysToCheck(req *request, l *fills.Locked) []bucket.Key {
	if req.txn != nil && req.txn.Check {
		return l.Keys()
	}
	return l.Unknown()
}
