package rewrite

import (
	"fmt"

	"github.com/tsproxy/tsproxy/rewrite/bucket"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// Continue reports whether to run the command after command i, given its
// reply: an ordered insert stops at the first failure.
func (p *LayoutWrite) Continue(i int, reply bsoncore.Document) bool {
	if !p.ordered {
		return true
	}
	return mongoerr.IsOK(reply) && len(replyWriteErrors(reply)) == 0
}

// Reply is the app's insert reply: n is the events the acknowledged
// statements stand for (counted, for a counter; written, for slots), and
// writeErrors name the app's own indexes: rejected events, the events of a
// failed statement, and those of statements an ordered insert did not run.
func (p *LayoutWrite) Reply(replies [][]byte) []byte {
	n := p.done
	errs := append([]bucket.WriteError(nil), p.rejected...)
	var wce bsoncore.Value
	var stop *upstreamError
	for c, stmts := range p.events {
		if c >= len(replies) || stop != nil {
			errs = p.notRun(errs, stmts, stop)
			continue
		}
		reply := bsoncore.Document(replies[c])
		if v, ok := bsonutil.Lookup(reply, "writeConcernError"); ok && wce.Type == 0 {
			wce = v
		}
		if !mongoerr.IsOK(reply) {
			e := commandErrorOf(reply)
			errs = p.notRun(errs, stmts, &e)
			if p.ordered {
				stop = &e
			}
			continue
		}
		failed := replyWriteErrors(reply)
		for s, evs := range stmts {
			if e, ok := failed[s]; ok {
				errs = appendEventErrors(errs, evs, e.code, p.errmsg(e.errmsg))
				if p.ordered {
					stop = &e
					errs = p.notRun(errs, stmts[s+1:], stop)
					break
				}
				continue
			}
			n += len(evs)
		}
	}
	return writeReply(n, errs, wce, bsoncore.Value{})
}

func (p *LayoutWrite) errmsg(upstream string) string {
	return fmt.Sprintf("tsproxy rule %s: bucket update failed: %s", p.rule.Namespace, upstream)
}

// notRun reports the events of statements that did not run (or whose
// command failed as a whole).
func (p *LayoutWrite) notRun(errs []bucket.WriteError, stmts [][]int, cause *upstreamError) []bucket.WriteError {
	code, msg := mongoerr.InternalError, fmt.Sprintf("tsproxy rule %s: not written: an earlier bucket update of this ordered insert failed", p.rule.Namespace)
	if cause != nil {
		code, msg = cause.code, p.errmsg(cause.errmsg)
	}
	for _, evs := range stmts {
		errs = appendEventErrors(errs, evs, code, msg)
	}
	return errs
}
