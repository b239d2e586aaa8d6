package rewrite

import (
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
)

// CursorSession is the session a client's command runs in, as the
// upstream's getMore and killCursors of a cursor that command's plan
// opened must carry it: lsid, and inside a transaction txnNumber and
// autocommit too. A server binds a cursor to the session that opened it
// and refuses to continue it in another or in none (MongoDB; FerretDB 2.x
// answers Unauthorized "Cursor session id ... is not the same as the
// operation context's session id (none)"), and the plans build their
// getMores without the client's fields. Nil: the command has no session.
type CursorSession []bsoncore.Element

// ReadCursorSession reads the session of a client's command body.
func ReadCursorSession(body []byte) CursorSession {
	picked := bsonutil.Pick(body, []string{"lsid", "txnNumber", "autocommit"})
	hasLsid, inTxn := false, false
	for _, e := range picked {
		switch e.Key() {
		case "lsid":
			hasLsid = true
		case "autocommit":
			inTxn = true
		}
	}
	if !hasLsid {
		return nil
	}
	var s CursorSession
	for _, e := range picked {
		// A retryable write's txnNumber is not a getMore's.
		if e.Key() == "lsid" || inTxn {
			s = append(s, e)
		}
	}
	return s
}

// AddTo returns body, an upstream command, with the session's fields when
// it is a getMore or killCursors that names no session of its own, and
// true; else body itself and false.
func (s CursorSession) AddTo(body []byte) ([]byte, bool) {
	if len(s) == 0 {
		return body, false
	}
	doc := bsoncore.Document(body)
	first, err := doc.IndexErr(0)
	if err != nil {
		return body, false
	}
	if k := first.Key(); k != "getMore" && k != "killCursors" {
		return body, false
	}
	if _, err := doc.LookupErr("lsid"); err == nil {
		return body, false
	}
	out := make([]byte, 0, len(body)+64)
	idx, out := bsoncore.AppendDocumentStart(out)
	elems, err := doc.Elements()
	if err != nil {
		return body, false
	}
	for _, e := range elems {
		out = append(out, e...)
	}
	for _, e := range s {
		out = append(out, e...)
	}
	out, err = bsoncore.AppendDocumentEnd(out, idx)
	if err != nil {
		return body, false
	}
	return out, true
}
