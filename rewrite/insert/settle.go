package insert

import (
	"fmt"
	"slices"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// ReplyFromRaw is Reply for callers outside rewrite, which hold replies as
// plain byte slices (only wire/ and rewrite/ use bsoncore).
func (p *Commands) ReplyFromRaw(replies [][]byte) []byte {
	return p.Reply(docs(replies))
}

// FillsFromRaw is Fills over raw reply bodies.
func (p *Commands) FillsFromRaw(replies [][]byte) []bucket.KeyFill { return p.Fills(docs(replies)) }

// RetriableRaw is Retriable over raw reply bodies.
func (p *Commands) RetriableRaw(replies [][]byte) bool { return p.Retriable(docs(replies)) }

// RetryFromRaw is Retry over raw reply bodies.
func (p *Commands) RetryFromRaw(replies [][]byte, buckets func(bucket.Key) bucket.Fill) *Commands {
	return p.Retry(docs(replies), buckets)
}

// Continue says whether, after command i returned reply (nil for a
// transport error), the proxy should run command i+1: not after a transport
// error (the connection is gone), and not after any failure when the client
// asked for ordered:true.
func (p *Commands) Continue(i int, reply bsoncore.Document) bool {
	if i < 0 || i+1 >= len(p.upstream) || reply == nil {
		return false
	}
	return !p.ordered || !p.readReply(i, reply).failed()
}

// readReply reads the reply to command i (nil: no reply). A duplicate key
// on a statement means its bucket _id was taken (a full bucket met by a
// guarded upsert, or a seq another writer created): nothing of it was
// written, and Retry can place its events again.
func (p *Commands) readReply(i int, reply bsoncore.Document) commandOutcome {
	pc := p.upstream[i]
	out := commandOutcome{stmts: make([]stmtResult, len(pc.statements))}
	if reply == nil {
		for j := range out.stmts {
			out.stmts[j].state = stmtUnknown
		}
		return out
	}
	out.wce, _ = bsonutil.Lookup(reply, "writeConcernError")
	out.labels, _ = bsonutil.Lookup(reply, "errorLabels")
	if !mongoerr.IsOK(reply) {
		e := CommandErrorOf(reply)
		out.cmdErr = &e
		for j := range out.stmts {
			out.stmts[j] = stmtResult{state: stmtFailed, err: e}
		}
		return out
	}
	failures := ReplyWriteErrors(reply)
	stopAt := len(pc.statements) // an ordered command runs nothing after its first failure
	for j := range pc.statements {
		e, failed := failures[j]
		switch {
		case failed:
			state := stmtFailed
			if e.Code == mongoerr.DuplicateKey {
				state = stmtDupKey
			}
			out.stmts[j] = stmtResult{state: state, err: e}
			if pc.ordered && j < stopAt {
				stopAt = j
			}
		}
	}
	for j := stopAt + 1; j < len(out.stmts); j++ {
		if out.stmts[j].state == stmtWritten {
			out.stmts[j].state = stmtNotRun
		}
	}
	return out
}

// outcomes reads the replies of this round's commands; commands without a
// reply (len(replies) <= i) did not run.
func (p *Commands) outcomes(replies []bsoncore.Document) []*commandOutcome {
	outs := make([]*commandOutcome, len(p.upstream))
	for i := range p.upstream {
		if i < len(replies) {
			o := p.readReply(i, replies[i])
			outs[i] = &o
		}
	}
	return outs
}

// Reply builds the client's reply from the replies of the commands that
// ran, in order (len(replies) <= len(Commands); a nil entry is a transport
// error), merged with what the earlier rounds of a retried plan wrote. It
// is {n: <events written>, writeErrors?, writeConcernError?, errorLabels?,
// ok: 1}, writeErrors sorted by the index of the event in the app's batch:
// the events refused before sending, and every event of a statement that
// was not written (with the upstream's code and errmsg, or a note that it
// was not attempted). When a command failed as a whole and nothing at all
// was written, the reply is that command error.
func (p *Commands) Reply(replies []bsoncore.Document) bsoncore.Document {
	r, _ := p.settle(replies, false)
	if r.cmdErr != nil && r.written == 0 {
		return mongoerr.ReplyWith(r.cmdErr.Code, r.cmdErr.codeName, r.cmdErr.Msg, r.cmdErr.labels)
	}
	return WriteReply(r.written, r.errs, r.wce, r.labels)
}

// settle folds this round's replies into the prior outcome. With retrying,
// the statements that Retry places again (duplicate keys, and those an
// ordered batch did not run after one) are left out and returned.
func (p *Commands) settle(replies []bsoncore.Document, retrying bool) (out priorOutcome, retry []plannedStatement) {
	out = p.prior
	out.errs = append(slices.Clone(p.prior.errs), p.rejected...)
	stop := out.lastError
	for i, o := range p.outcomes(replies) {
		pc := p.upstream[i]
		if o == nil {
			if retrying {
				retry = append(retry, pc.statements...)
			} else {
				out.errs = p.appendNotRun(out.errs, pc.statements, stop)
			}
			continue
		}
		if o.cmdErr != nil && out.cmdErr == nil {
			out.cmdErr = o.cmdErr
		}
		if out.wce.Type == 0 && o.wce.Type != 0 {
			out.wce = o.wce
		}
		if out.labels.Type == 0 && o.labels.Type == bsoncore.TypeArray {
			out.labels = o.labels
		}
		for j, st := range pc.statements {
			res := o.stmts[j]
			switch res.state {
			case stmtWritten:
				out.written += len(st.events)
			case stmtDupKey:
				if retrying {
					retry = append(retry, st)
					continue
				}
				// Not retried (rounds spent, or the caller does not retry).
				out.errs = AppendEventErrors(out.errs, st.events, res.err.Code, res.err.Msg)
				if stop == nil {
					stop = &res.err
				}
			case stmtFailed:
				out.errs = AppendEventErrors(out.errs, st.events, res.err.Code, res.err.Msg)
				if stop == nil {
					stop = &res.err
				}
			case stmtUnknown:
				msg := fmt.Sprintf("tsproxy rule %s: no reply from the upstream for this write (it may or may not have been applied)", p.namespace)
				if o.cmdErr != nil {
					msg = o.cmdErr.Msg
				}
				out.errs = AppendEventErrors(out.errs, st.events, mongoerr.HostUnreachable, msg)
				if stop == nil {
					stop = &UpstreamError{Code: mongoerr.HostUnreachable, Msg: msg}
				}
			case stmtNotRun:
				if retrying {
					retry = append(retry, st)
					continue
				}
				out.errs = p.appendNotRun(out.errs, []plannedStatement{st}, stop)
			}
		}
	}
	out.lastError = stop
	return out, retry
}

// Retry is the next round of the insert after a round whose replies show
// a duplicate key on a bucket _id (the bucket was full, or another writer
// took that seq): the events of those statements — and, for an ordered
// insert, of the statements it did not run after them — planned again
// against fresh fills from buckets (the caller reloads the keys whose
// fills Fills reported unknown). Each statement either wrote all its
// events or none, so no event is written twice or lost. The new plan's
// Reply reports the whole insert, earlier rounds included.
//
// Retry returns nil when there is nothing to retry: no duplicate key, a
// statement failed otherwise or got no reply (the batch stops there, as a
// plain collection's would), the insert is part of a transaction (a write
// error aborts it upstream), or the rounds are spent (maxInsertRounds); the
// caller then answers with Reply(replies).
func (p *Commands) Retry(replies []bsoncore.Document, buckets func(bucket.Key) bucket.Fill) *Commands {
	if !p.Retriable(replies) {
		return nil
	}
	prior, retry := p.settle(replies, true)
	var events []bucket.Event
	for _, st := range retry {
		events = append(events, st.chunk...)
	}
	slices.SortFunc(events, func(a, b bucket.Event) int { return a.Index - b.Index })
	next := &Commands{namespace: p.namespace, ordered: p.ordered, rule: p.rule, lim: p.lim, opts: p.opts,
		body: p.body, inTxn: p.inTxn, round: p.round + 1, prior: prior}
	next.opts.Buckets = buckets
	next.buildCommands(events)
	return next
}

// Retriable reports whether Retry would return a plan for these replies:
// the caller then reloads the unknown fills and calls Retry.
func (p *Commands) Retriable(replies []bsoncore.Document) bool {
	if p.inTxn || p.round+1 >= maxInsertRounds {
		return false
	}
	dup := false
	for _, o := range p.outcomes(replies) {
		if o == nil {
			continue
		}
		for _, r := range o.stmts {
			switch r.state {
			case stmtDupKey:
				dup = true
			case stmtFailed, stmtUnknown:
				if p.ordered {
					return false
				}
			}
		}
	}
	return dup
}

// Round is the plan's round: 0 for the plan Insert returns, then 1, 2, ...
// for the plans Retry returns.
func (p *Commands) Round() int { return p.round }

// Fills reports, for every key this round wrote to, the key's fill after
// the round: the planned fill (Known) when every statement of the key was
// written; unknown when any was not (or its outcome is unknown), and
// always unknown inside a transaction, whose writes may yet be aborted.
// The caller keeps the known fills for the next insert and reloads the
// unknown ones before planning again.
func (p *Commands) Fills(replies []bsoncore.Document) []bucket.KeyFill {
	ok := make([]bool, len(p.fills))
	for i := range ok {
		ok[i] = !p.inTxn
	}
	outs := p.outcomes(replies)
	for i, pc := range p.upstream {
		for j, st := range pc.statements {
			if outs[i] == nil || outs[i].stmts[j].state != stmtWritten {
				ok[st.key] = false
			}
		}
	}
	out := make([]bucket.KeyFill, len(p.fills))
	for i, f := range p.fills {
		out[i] = bucket.KeyFill{Key: f.key, Fill: f.fill}
		if !ok[i] {
			out[i].Fill = bucket.Fill{Seq: -1}
		}
	}
	return out
}

// appendNotRun reports the events of statements that never ran because an
// earlier write failed (ordered) or the proxy stopped: they are not
// stored, and the client must not count them as written.
func (p *Commands) appendNotRun(errs []bucket.WriteError, stmts []plannedStatement, stop *UpstreamError) []bucket.WriteError {
	code, cause := mongoerr.InternalError, "the proxy stopped the batch"
	if stop != nil {
		code, cause = stop.Code, stop.Msg
	}
	msg := fmt.Sprintf("tsproxy rule %s: event not written: an earlier bucket write of this batch failed: %s", p.namespace, cause)
	for _, st := range stmts {
		errs = AppendEventErrors(errs, st.events, code, msg)
	}
	return errs
}
