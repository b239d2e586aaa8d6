package insert

import (
	"fmt"
	"slices"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// upstreamError is a failure reported by the upstream: a command error
// (ok: 0) or one statement's write error.
type UpstreamError struct {
	Code     mongoerr.Code
	codeName string
	Msg      string
	labels   bsoncore.Value // errorLabels of a command error
}

// stmtState is what happened to one upstream statement.
type stmtState int

const (
	stmtWritten stmtState = iota // all its events are stored
	stmtFailed                   // the upstream refused it
	stmtNotRun                   // an ordered command stopped before it
	stmtUnknown                  // no reply: the connection failed
	stmtDupKey                   // a duplicate key on the bucket _id: nothing written, Retry re-plans it
)

type stmtResult struct {
	state stmtState
	err   UpstreamError // for stmtFailed
}

// commandOutcome is one upstream reply read against the statements sent.
type commandOutcome struct {
	cmdErr *UpstreamError // the command failed as a whole (ok: 0)
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

func CommandErrorOf(reply bsoncore.Document) UpstreamError {
	e := UpstreamError{Code: mongoerr.InternalError, Msg: "upstream command failed"}
	if v, ok := bsonutil.Lookup(reply, "code"); ok && v.IsNumber() {
		if c, ok := v.AsInt32OK(); ok {
			e.Code = mongoerr.Code(c)
		}
	}
	if v, ok := bsonutil.Lookup(reply, "errmsg"); ok {
		if s, ok := v.StringValueOK(); ok {
			e.Msg = s
		}
	}
	if v, ok := bsonutil.Lookup(reply, "codeName"); ok {
		e.codeName, _ = v.StringValueOK()
	}
	e.labels, _ = bsonutil.Lookup(reply, "errorLabels")
	return e
}

// replyWriteErrors maps statement index to its write error.
func ReplyWriteErrors(reply bsoncore.Document) map[int]UpstreamError {
	out := map[int]UpstreamError{}
	v, ok := bsonutil.Lookup(reply, "writeErrors")
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
		idx, ok := bsonutil.Lookup(doc, "index")
		if !ok || !idx.IsNumber() {
			continue
		}
		j, ok := idx.AsInt64OK()
		if !ok || j < 0 || j > maxInt {
			continue
		}
		e := CommandErrorOf(doc)
		if _, dup := out[int(j)]; !dup {
			out[int(j)] = e
		}
	}
	return out
}

const maxInt = int64(^uint(0) >> 1)

// priorOutcome is what the earlier rounds of an insert wrote and report.
type priorOutcome struct {
	written   int
	errs      []bucket.WriteError
	cmdErr    *UpstreamError
	wce       bsoncore.Value
	labels    bsoncore.Value
	lastError *UpstreamError // why statements did not run, for messages
}

func AppendEventErrors(errs []bucket.WriteError, events []int, code mongoerr.Code, msg string) []bucket.WriteError {
	for _, idx := range events {
		errs = append(errs, bucket.WriteError{Index: idx, Code: code, Msg: msg})
	}
	return errs
}

func WriteReply(n int, errs []bucket.WriteError, wce, labels bsoncore.Value) bsoncore.Document {
	slices.SortStableFunc(errs, func(a, b bucket.WriteError) int { return a.Index - b.Index })
	idx, doc := bsoncore.AppendDocumentStart(nil)
	doc = bsoncore.AppendInt32Element(doc, "n", int32(n))
	if len(errs) > 0 {
		arr, d := bsoncore.AppendArrayElementStart(doc, "writeErrors")
		doc = d
		for i, e := range errs {
			sub, d := bsoncore.AppendDocumentElementStart(doc, fmt.Sprint(i))
			d = bsoncore.AppendInt32Element(d, "index", int32(e.Index))
			d = bsoncore.AppendInt32Element(d, "code", int32(e.Code))
			d = bsoncore.AppendStringElement(d, "errmsg", e.Msg)
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
