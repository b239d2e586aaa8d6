package proxy

import (
	"github.com/tsproxy/tsproxy/rewrite/bucket"
)

// The proxy recognises a driver's retry of an insert the upstream cannot
// recognise (see rewrite/replay.go). Checking costs a read of the key's
// buckets, so it checks only when a retry of a write it did not see
// through is possible: when it does not know the key's fill. That is the
// case after any failure whose outcome it did not learn (it forgets the
// fills then) and after a restart; while it knows a fill, every write of
// that key went through it and got its reply, and a retry of such a
// write is answered from the reply cache (reply_cache.go).

// keysToCheck are the locked keys whose buckets a retry may have been
// stored in already: those whose fill is unknown, or all when the reply
// cache lost records a retry may still need.
func (c *conn) keysToCheck(req *request, l *lockedKeys) []bucket.Key {
	if req.txn != nil && req.txn.check {
		return l.keys
	}
	var out []bucket.Key
	for i, e := range l.entries {
		if !e.fill.Known {
			out = append(out, l.keys[i])
		}
	}
	return out
}
