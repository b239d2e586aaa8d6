package rewrite

import (
	"fmt"
	"slices"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// upstreamError is a failure reported by the upstream: a command error
// (ok: 0) or one statement's write error.
type upstreamError struct {
	code     int32
	codeName string
	errmsg   string
	labels   bsoncore.Value // errorLabels of a command error
}

// stmtState is what happened to one upstream statement.
type stmtState int

const (
	stmtWritten stmtState = iota // all its events are stored
	stmtFailed                   // the upstream refused it
	stmtNotRun                   // an ordered command stopped before it
	stmtUnknown                  // no reply: the connection failed
)

type stmtResult struct {
	state stmtState
	err   upstreamError // for stmtFailed
}

// commandOutcome is one upstream reply read against the statements sent.
type commandOutcome struct {
	cmdErr *upstreamError // the command failed as a whole (ok: 0)
	stmts  []stmtResult
	wce    bsoncore.Value // writeConcernError, Type 0 when none
	labels bsoncore.Value // errorLabels, Type 0 when none
}

// failed reports whether the command failed as a whole or in some statement.
func (o commandOutcome) failed() bool {
	if o.cmdErr != nil {
		return true
	}
	for _, s := range o.stmts {
		if s.state != stmtWritten {
			return true
		}
	}
	return false
}

// Continue says whether, after command i returned reply (nil for a
// transport error), the proxy should run command i+1: not after a transport
// error (the connection is gone), and not after any failure when the client
// asked for ordered:true.
func (p *InsertPlan) Continue(i int, reply bsoncore.Document) bool {
	if i < 0 || i+1 >= len(p.upstream) || reply == nil {
		return false
	}
	return !p.ordered || !p.readReply(i, reply).failed()
}

// readReply reads the reply to command i. A duplicate key on a complete
// bucket whose _id was derived from the statement means a retry already
// stored that bucket: it counts as written.
func (p *InsertPlan) readReply(i int, reply bsoncore.Document) commandOutcome {
	pc := p.upstream[i]
	out := commandOutcome{stmts: make([]stmtResult, len(pc.statements))}
	if reply == nil {
		for j := range out.stmts {
			out.stmts[j].state = stmtUnknown
		}
		return out
	}
	if err := validateDeep(reply, 0); err != nil {
		out.cmdErr = &upstreamError{code: CodeInternalError, codeName: codeName(CodeInternalError),
			errmsg: fmt.Sprintf("tsproxy rule %s: malformed reply from the upstream: %v", p.namespace, err)}
		for j := range out.stmts {
			out.stmts[j].state = stmtUnknown
		}
		return out
	}
	out.wce, _ = lookupTop(reply, "writeConcernError")
	out.labels, _ = lookupTop(reply, "errorLabels")
	if !replyOK(reply) {
		e := commandErrorOf(reply)
		out.cmdErr = &e
		for j := range out.stmts {
			out.stmts[j] = stmtResult{state: stmtFailed, err: e}
		}
		return out
	}
	failures := replyWriteErrors(reply)
	stopAt := len(pc.statements) // an ordered command runs nothing after its first failure
	for j := range pc.statements {
		e, failed := failures[j]
		switch {
		case failed && e.code == CodeDuplicateKey && pc.statements[j].derivedID:
			out.stmts[j].state = stmtWritten
		case failed:
			out.stmts[j] = stmtResult{state: stmtFailed, err: e}
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

func replyOK(reply bsoncore.Document) bool {
	v, ok := lookupTop(reply, "ok")
	if !ok || !v.IsNumber() {
		return false
	}
	f, ok := v.AsFloat64OK()
	return ok && f == 1
}

func commandErrorOf(reply bsoncore.Document) upstreamError {
	e := upstreamError{code: CodeInternalError, errmsg: "upstream command failed"}
	if v, ok := lookupTop(reply, "code"); ok && v.IsNumber() {
		if c, ok := v.AsInt32OK(); ok {
			e.code = c
		}
	}
	if v, ok := lookupTop(reply, "errmsg"); ok {
		if s, ok := v.StringValueOK(); ok {
			e.errmsg = s
		}
	}
	if v, ok := lookupTop(reply, "codeName"); ok {
		e.codeName, _ = v.StringValueOK()
	}
	e.labels, _ = lookupTop(reply, "errorLabels")
	return e
}

// replyWriteErrors maps statement index to its write error.
func replyWriteErrors(reply bsoncore.Document) map[int]upstreamError {
	out := map[int]upstreamError{}
	v, ok := lookupTop(reply, "writeErrors")
	if !ok {
		return out
	}
	arr, ok := v.ArrayOK()
	if !ok {
		return out
	}
	items, _ := arr.Values()
	for _, item := range items {
		doc, ok := item.DocumentOK()
		if !ok {
			continue
		}
		idx, ok := lookupTop(doc, "index")
		if !ok || !idx.IsNumber() {
			continue
		}
		j, ok := idx.AsInt64OK()
		if !ok || j < 0 || j > maxInt {
			continue
		}
		e := commandErrorOf(doc)
		if _, dup := out[int(j)]; !dup {
			out[int(j)] = e
		}
	}
	return out
}

const maxInt = int64(^uint(0) >> 1)

// Reply builds the client's reply from the replies of the commands that
// ran, in order (len(replies) <= len(Commands); a nil entry is a transport
// error). It is {n: <events written>, writeErrors?, writeConcernError?,
// errorLabels?, ok: 1}, writeErrors sorted by the index of the event in
// the app's batch: the events refused before sending, and every event of a
// statement that was not written (with the upstream's code and errmsg, or
// a note that it was not attempted). When a command failed as a whole and
// nothing at all was written, the reply is that command error.
func (p *InsertPlan) Reply(replies []bsoncore.Document) bsoncore.Document {
	written := 0
	errs := slices.Clone(p.rejected)
	var firstCmdErr *upstreamError
	var wce, labels bsoncore.Value
	var stop *upstreamError // why later statements did not run
	for i, pc := range p.upstream {
		if i >= len(replies) {
			errs = p.appendNotRun(errs, pc.statements, stop)
			continue
		}
		out := p.readReply(i, replies[i])
		if out.cmdErr != nil && firstCmdErr == nil {
			firstCmdErr = out.cmdErr
		}
		if wce.Type == 0 && out.wce.Type != 0 {
			wce = out.wce
		}
		if labels.Type == 0 && out.labels.Type == bsoncore.TypeArray {
			labels = out.labels
		}
		for j, st := range pc.statements {
			res := out.stmts[j]
			switch res.state {
			case stmtWritten:
				written += len(st.events)
			case stmtFailed:
				errs = appendEventErrors(errs, st.events, res.err.code, res.err.errmsg)
				if stop == nil {
					stop = &res.err
				}
			case stmtUnknown:
				msg := fmt.Sprintf("tsproxy rule %s: no reply from the upstream for this write (it may or may not have been applied)", p.namespace)
				if out.cmdErr != nil {
					msg = out.cmdErr.errmsg
				}
				errs = appendEventErrors(errs, st.events, CodeHostUnreachable, msg)
				if stop == nil {
					stop = &upstreamError{code: CodeHostUnreachable, errmsg: msg}
				}
			case stmtNotRun:
				errs = p.appendNotRun(errs, []plannedStatement{st}, stop)
			}
		}
	}
	if firstCmdErr != nil && written == 0 {
		return commandErrorReply(firstCmdErr.code, firstCmdErr.codeName, firstCmdErr.errmsg, firstCmdErr.labels)
	}
	return writeReply(written, errs, wce, labels)
}

// appendNotRun reports the events of statements that never ran because an
// earlier write failed (ordered) or the proxy stopped: they are not
// stored, and the client must not count them as written.
func (p *InsertPlan) appendNotRun(errs []writeError, stmts []plannedStatement, stop *upstreamError) []writeError {
	code, cause := CodeInternalError, "the proxy stopped the batch"
	if stop != nil {
		code, cause = stop.code, stop.errmsg
	}
	msg := fmt.Sprintf("tsproxy rule %s: event not written: an earlier bucket write of this batch failed: %s", p.namespace, cause)
	for _, st := range stmts {
		errs = appendEventErrors(errs, st.events, code, msg)
	}
	return errs
}

func appendEventErrors(errs []writeError, events []int, code int32, msg string) []writeError {
	for _, idx := range events {
		errs = append(errs, writeError{index: idx, code: code, errmsg: msg})
	}
	return errs
}

func writeReply(n int, errs []writeError, wce, labels bsoncore.Value) bsoncore.Document {
	slices.SortStableFunc(errs, func(a, b writeError) int { return a.index - b.index })
	idx, doc := bsoncore.AppendDocumentStart(nil)
	doc = bsoncore.AppendInt32Element(doc, "n", int32(n))
	if len(errs) > 0 {
		arr, d := bsoncore.AppendArrayElementStart(doc, "writeErrors")
		doc = d
		for i, e := range errs {
			sub, d := bsoncore.AppendDocumentElementStart(doc, fmt.Sprint(i))
			d = bsoncore.AppendInt32Element(d, "index", int32(e.index))
			d = bsoncore.AppendInt32Element(d, "code", e.code)
			d = bsoncore.AppendStringElement(d, "errmsg", e.errmsg)
			doc, _ = bsoncore.AppendDocumentEnd(d, sub)
		}
		doc, _ = bsoncore.AppendArrayEnd(doc, arr)
	}
	if wce.Type != 0 {
		doc = bsoncore.AppendValueElement(doc, "writeConcernError", wce)
	}
	if labels.Type == bsoncore.TypeArray {
		doc = bsoncore.AppendArrayElement(doc, "errorLabels", labels.Data)
	}
	doc = bsoncore.AppendDoubleElement(doc, "ok", 1)
	doc, _ = bsoncore.AppendDocumentEnd(doc, idx)
	return doc
}
