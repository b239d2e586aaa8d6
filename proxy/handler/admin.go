package handler

import (
	"fmt"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite/admin"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/wire"
)

// This file serves the admin commands of a bucketed namespace (create,
// createIndexes, listIndexes, dropIndexes), keeps renameCollection away
// from rule namespaces, and ends the rewritten cursors of sessions the client ends.

// rewriteCreate creates the bucket collection (and its index) for a
// create of the app's namespace.
func (c *Conn) rewriteCreate(req *request, rule *rules.Rule) error {
	res, err := c.runPlan(req, rule, routeRewrite, admin.Create(req.msg.Body, rule))
	if err != nil {
		return err
	}
	if mongoerr.IsOK(res.Reply) {
		c.ensureBucketIndex(rule)
	}
	return c.answer(req, rule, res)
}

// rewriteDropIndexes drops translated indexes; after "*" the proxy's own
// index is created again at once.
func (c *Conn) rewriteDropIndexes(req *request, rule *rules.Rule) error {
	res, err := c.runPlan(req, rule, routeRewrite, admin.DropIndexes(req.msg.Body, rule))
	if err != nil {
		return err
	}
	if len(res.Forget) > 0 {
		c.ensureBucketIndex(rule)
	}
	return c.answer(req, rule, res)
}

// renameTouchesRule reports the rule whose namespace a renameCollection
// names as its source or target: renaming the (empty) upstream collection
// of the app's name, or another collection onto it, would hide the
// buckets from the app.
func (c *Conn) renameTouchesRule(req *request) *rules.Rule {
	body := bson.Raw(req.msg.Body)
	for _, key := range []string{"renameCollection", "to"} {
		ns, ok := body.Lookup(key).StringValueOK()
		if !ok {
			continue
		}
		db, coll, ok := strings.Cut(ns, ".")
		if !ok {
			continue
		}
		if rule := c.rules.Lookup(db, coll); rule != nil {
			return rule
		}
	}
	return nil
}

// refuseRename answers renameCollection of or onto a rule's namespace.
func (c *Conn) refuseRename(req *request, rule *rules.Rule) error {
	if req.msg.Flags&wire.MoreToCome != 0 {
		return nil
	}
	if rule.Declared != nil {
		return c.replyRewriteError(req, admin.RenameError(rule.Namespace))
	}
	return c.replyError(req, mongoerr.NotImplemented,
		fmt.Sprintf("tsproxy rule %s: renameCollection of or onto a bucketed namespace is not supported (its events are in %s; change the rule instead)", rule.Namespace, rule.BucketNamespace()))
}

// endCursorSessions kills upstream, and forgets, the rewritten reads'
// cursors of the sessions an endSessions names, before the command itself
// passes through. A failed kill leaves the cursor to the upstream's
// timeout.
func (c *Conn) endCursorSessions(req *request) {
	ids, ok := bson.Raw(req.msg.Body).Lookup("endSessions").ArrayOK()
	if !ok {
		return
	}
	vals, err := ids.Values()
	if err != nil {
		return
	}
	ended := make(map[string]bool, len(vals))
	for _, v := range vals {
		if doc, ok := v.DocumentOK(); ok {
			ended[sessionKey(doc)] = true
		}
	}
	if len(ended) == 0 || c.s.Cursors.Len() == 0 || c.ensureUpstream() != nil {
		return
	}
	users, err := c.users()
	if err != nil {
		return
	}
	// The users are who connectionStatus names, which FerretDB on
	// PostgreSQL reports for a PLAIN login before it checks the password:
	// the server authorizes the client on each rule first, as for a
	// getMore.
	may := func(rule *rules.Rule) bool {
		denied, err := c.authorize(req, rule)
		return err == nil && denied == nil
	}
	for _, cur := range c.s.Cursors.ForgetSessions(ended, users, may) {
		_ = c.releaseEntry(cur.Entry)
	}
}

// sessionKey identifies a logical session by the bytes of its id (an
// lsid document {id: UUID}); "" for none.
func sessionKey(lsid bson.Raw) string {
	v, err := lsid.LookupErr("id")
	if err != nil {
		return ""
	}
	return string(v.Value)
}

// requestSession is the session key of a request's lsid, or "".
func requestSession(req *request) string {
	lsid, ok := bson.Raw(req.msg.Body).Lookup("lsid").DocumentOK()
	if !ok {
		return ""
	}
	return sessionKey(lsid)
}
