package handler

import (
	"github.com/tsproxy/tsproxy/proxy/fills"
	"github.com/tsproxy/tsproxy/proxy/replycache"
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/wire"
)

// retriedReply runs before a rewritten write. For a retryable write it
// answers a retry of a recorded write with its reply, refuses one that
// cannot be run (done is true then), or registers the attempt in
// req.txn; endRetryable must follow.
func (c *Conn) retriedReply(req *request, rule *rules.Rule) error {
	if !commands[req.name].retryable {
		return nil
	}
	key, ok, kerr := rewrite.RetryKeyOf(req.msg.Body)
	unacked := req.msg.Flags&wire.MoreToCome != 0
	if kerr == nil {
		req.retry = &rewrite.ReadRetryKey{Key: key, Retryable: ok}
	}
	if kerr == nil && !ok {
		return nil
	}
	var out replycache.Outcome
	if kerr != nil {
		out.Err = kerr
	} else {
		identity, err := c.identity()
		if err != nil {
			return answered(err)
		}
		out = c.s.Replies.Begin(key.OwnedBy(identity), rule.Namespace+" "+req.name)
	}
	switch {
	case out.Attempt != nil:
		req.txn = out.Attempt
		return nil
	case unacked:
		return errAnswered
	case out.Err != nil:
		c.log.Info("retryable write refused", "rule", rule.Namespace, "err", out.Err.Error())
		return answered(c.replyBody(req, mongoerr.Reply(out.Err)))
	}
	c.log.Info("retried write answered with its recorded reply", "rule", rule.Namespace, "txnNumber", key.TxnNumber)
	return answered(c.replyBody(req, out.Reply))
}

// endRetryable ends the request's attempt, if it has one.
func (c *Conn) endRetryable(req *request) {
	if req.txn != nil {
		req.txn.Finish()
		req.txn = nil
	}
}

// The proxy recognises a driver's retry of an insert the upstream cannot
// recognise. Checking costs a read of the
// key's buckets, so it checks only when a retry of a write it did not see
// through is possible:
//   - when it does not know the key's fill: after any failure whose outcome
//     it did not learn (it forgets the fills then);
//   - when its reply cache lost records a retry may still need;
//   - within the retry window after an earlier term of the rule's writer
//     lease ended (another proxy's, or this one's before a restart), for a
//     session whose last write it did not record in its current term: the
//     write may have gone through that term's holder. Knowing the fill is
//     no proof then: another client's write loads it.
//
// Otherwise every write of the key went through this proxy and got its
// reply, and a retry of such a write is answered from the reply cache
// (proxy/replycache).

// keysToCheck are the locked keys whose buckets a retry may have been
// stored in already.
func (c *Conn) keysToCheck(req *request, rule *rules.Rule, caps caps.Upstream, l *fills.Locked) []bucket.Key {
	if req.txn != nil && (req.txn.Check || c.s.EarlierTermRetryPossible(rule, caps, req.txn.Previous)) {
		return l.Keys()
	}
	return l.Unknown()
}
