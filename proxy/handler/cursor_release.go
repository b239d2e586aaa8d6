package handler

import (
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/proxy/authz"
	"github.com/tsproxy/tsproxy/proxy/cursors"
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/wire"
)

// cursorKillTimeout bounds the killCursors a closing connection sends for
// its cursors: a stuck upstream must not keep the connection's goroutine.
const cursorKillTimeout = 2 * time.Second

// registerCursor remembers a cursor the client now holds: its session (for
// endSessions) and this connection as its owner (for releaseCursors). It
// reports false, remembering nothing, when the registry is at its limit
// (limits.maxCursors); the caller then releases the cursor and refuses.
func (c *Conn) registerCursor(req *request, id int64, e *cursors.Entry) bool {
	e.Session = requestSession(req)
	e.CursorSession = rewrite.ReadCursorSession(req.msg.Body).Clone()
	users, err := c.users()
	if err != nil {
		// Who opened it is unknown: nobody may continue it, this client
		// included, rather than anybody.
		users = []string{"\x00unknown"}
	}
	e.Users = users
	if !c.s.Cursors.Add(id, e) {
		return false
	}
	c.ownCursor(id)
	return true
}

// ownCursor makes this connection the owner of a registered cursor: the
// last connection to use a cursor is the one the app reads it through.
func (c *Conn) ownCursor(id int64) {
	e := c.s.Cursors.Peek(id)
	if e == nil {
		return
	}
	e.Owner.Store(c.id)
	if c.cursors == nil {
		c.cursors = make(map[int64]struct{})
	}
	if len(c.cursors) >= c.cursorsPrune {
		c.pruneCursors()
	}
	c.cursors[id] = struct{}{}
}

// minCursorsPrune is the size of a connection's set of cursors at which it
// first drops what it no longer owns.
const minCursorsPrune = 64

// pruneCursors drops from the connection's set the cursors it no longer
// owns: the registry forgot them (its TTL or bound, an endSessions) or
// another connection continued them. The next prune waits until the set
// has doubled, so a connection that reads through many cursors keeps a
// set of about what it owns at a constant cost a cursor.
func (c *Conn) pruneCursors() {
	for id := range c.cursors {
		if e := c.s.Cursors.Peek(id); e == nil || e.Owner.Load() != c.id {
			delete(c.cursors, id)
		}
	}
	c.cursorsPrune = max(minCursorsPrune, 2*len(c.cursors))
}

// forgetCursor forgets a cursor this connection ended (exhausted, killed,
// failed).
func (c *Conn) forgetCursor(id int64) {
	c.s.Cursors.Forget(id)
	delete(c.cursors, id)
}

// releaseCursors runs when the client connection ends: the cursors it
// still owns are killed upstream and forgotten. Nobody can continue them
// any more in the common cases (a client that went away, or that
// disconnected before it read the reply naming the cursor), and the
// upstream would otherwise hold them until its own timeout, if it has one
// (FerretDB v1.24 keeps them). A cursor another connection continued since
// belongs to that one and is left alone.
func (c *Conn) releaseCursors() {
	if len(c.cursors) == 0 {
		return
	}
	up := c.upRef.Load()
	usable := up != nil && !c.front.Closed()
	if usable {
		_ = up.SetDeadline(time.Now().Add(cursorKillTimeout))
	}
	for id := range c.cursors {
		e := c.s.Cursors.Peek(id)
		if e == nil || e.Owner.Load() != c.id {
			continue
		}
		c.s.Cursors.Forget(id)
		if !usable {
			continue
		}
		if err := c.releaseEntry(e); err != nil {
			usable = false // the upstream connection is broken or stuck
		}
	}
	c.cursors = nil
}

// checkCursorOwner refuses a getMore of a registered cursor from a client
// none of whose users opened it, or from another session, and a
// killCursors naming such a cursor: MongoDB's Unauthorized (13), or its
// session codes, with nothing read or killed. done is true when req was
// answered.
func (c *Conn) checkCursorOwner(req *request, rule *rules.Rule) error {
	if req.name != "getMore" && req.name != "killCursors" {
		return nil
	}
	var ids []int64
	body := bson.Raw(req.msg.Body)
	if req.name == "getMore" {
		id, ok := body.Lookup("getMore").AsInt64OK()
		if !ok {
			return nil
		}
		ids = []int64{id}
	} else {
		arr, _ := body.Lookup("cursors").ArrayOK()
		vals, _ := arr.Values()
		for _, v := range vals {
			if id, ok := v.AsInt64OK(); ok {
				ids = append(ids, id)
			}
		}
	}
	users, err := c.users()
	if err != nil {
		return err
	}
	for _, id := range ids {
		e := c.s.Cursors.Peek(id)
		if e == nil {
			continue
		}
		var refusal error
		if req.name == "getMore" {
			refusal = authz.CursorOwnerError(id, e, users, requestSession(req))
		} else {
			refusal = authz.CursorUserError(id, e, users)
		}
		if refusal == nil {
			continue
		}
		c.log.Info("cursor of other users refused", "rule", rule.Namespace, "command", req.name, "cursor", id)
		if req.msg.Flags&wire.MoreToCome != 0 {
			return errAnswered
		}
		return answered(c.replyRewriteError(req, refusal))
	}
	return nil
}
