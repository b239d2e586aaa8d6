package rewrite

import (
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
)

// CursorSession is the session a client's command runs in, as the
// upstream's getMore and killCursors of a cursor opened in it must carry
// it: lsid, and inside a transaction txnNumber and autocommit too. A
// server binds a cursor to the session that opened it and refuses to
// continue it in another or in none (MongoDB; FerretDB 2.x answers
// Unauthorized "Cursor session id ... is not the same as the operation
// context's session id (none)"), and the plans build their getMores
// without the client's fields. Nil: the command has no session.
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

// Clone is s with elements of its own (ReadCursorSession's alias the
// command's buffer), to keep past the command.
func (s CursorSession) Clone() CursorSession {
	if s == nil {
		return nil
	}
	out := make(CursorSession, len(s))
	for i, e := range s {
		out[i] = append(bsoncore.Element(nil), e...)
	}
	return out
}

// CursorSessions gives the getMores and killCursors of one plan's run
// the session their cursor was opened in: the client's where the plan's
// own command that opened it carried the client's lsid, or where the
// cursor was opened before this run (a client's getMore of a rewritten
// read, whose first command carried the client's fields); none where
// the plan opened it without a session (the proxy's own scans).
type CursorSessions struct {
	body    []byte // the client's command
	read    bool   // session is read from body
	session CursorSession
	opened  map[int64]bool // cursor id → whether its opening command had an lsid
}

// NewCursorSessions is the sessions of a run for a client's command of
// body. Nothing is read from body until a command of the run opens or
// continues a cursor: most runs (inserts) never do.
func NewCursorSessions(body []byte) *CursorSessions {
	return &CursorSessions{body: body}
}

// SessionsOf is the sessions of a run for a client whose session is s
// (kept from an earlier command: a cursor's release).
func SessionsOf(s CursorSession) *CursorSessions {
	return &CursorSessions{read: true, session: s}
}

func (c *CursorSessions) clientSession() CursorSession {
	if !c.read {
		c.session, c.read = ReadCursorSession(c.body), true
	}
	return c.session
}

// Prepare is step with the session added to each getMore and killCursors
// that needs it; step itself when none does.
func (c *CursorSessions) Prepare(step Step) Step {
	if c == nil {
		return step
	}
	var out Step
	for i, u := range step {
		id, cont := continuedCursor(u.Body)
		if !cont {
			continue
		}
		if had, known := c.opened[id]; known && !had {
			continue
		}
		body, changed := c.clientSession().AddTo(u.Body)
		if !changed {
			continue
		}
		if out == nil {
			out = append(Step(nil), step...)
		}
		out[i].Body = body
	}
	if out == nil {
		return step
	}
	return out
}

// Note records the cursors step's commands opened, from their replies.
func (c *CursorSessions) Note(step Step, replies [][]byte) {
	if c == nil {
		return
	}
	for i, u := range step {
		if i >= len(replies) {
			return
		}
		if _, cont := continuedCursor(u.Body); cont {
			continue
		}
		id, ok := bsoncore.Document(replies[i]).Lookup("cursor", "id").AsInt64OK()
		if !ok || id == 0 || c.clientSession() == nil {
			continue
		}
		_, err := bsoncore.Document(u.Body).LookupErr("lsid")
		if c.opened == nil {
			c.opened = map[int64]bool{}
		}
		c.opened[id] = err == nil
	}
}

// continuedCursor is the cursor a getMore or killCursors names (the
// first of a killCursors' list).
func continuedCursor(body []byte) (int64, bool) {
	first, err := bsoncore.Document(body).IndexErr(0)
	if err != nil {
		return 0, false
	}
	switch first.Key() {
	case "getMore":
		return first.Value().AsInt64OK()
	case "killCursors":
		ids, ok := bsoncore.Document(body).Lookup("cursors").ArrayOK()
		if !ok {
			return 0, true
		}
		v, err := ids.IndexErr(0)
		if err != nil {
			return 0, true
		}
		id, _ := v.AsInt64OK()
		return id, true
	}
	return 0, false
}
