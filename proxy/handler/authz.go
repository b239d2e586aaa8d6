package handler

import (
	"fmt"
	"time"

	"github.com/tsproxy/tsproxy/proxy/cursors"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/wire"
)

// A command on a bucketed namespace is authorized by the upstream before
// the proxy answers anything of its own (a refusal, an invalid event, a
// recorded reply, a batch of a cursor it holds): the client must see the
// server's authorization error wherever the server would give one, and
// learn nothing of the rule or of others' data first.
//
// The check runs on the client's own upstream connection, with its
// credentials: a find by an impossible _id on the app's namespace (always
// empty: the events are in the bucket collection), which any backend
// answers at once. A refusal is answered to the client as the upstream gave
// it. Where the upstream reports privileges (MongoDB's connectionStatus),
// the action the command needs (insert, remove, update) is checked too;
// FerretDB authorizes any authenticated user for everything.
//
// Verdicts are kept per connection until its authentication changes (any
// saslStart, saslContinue, authenticate or logout, or a hello carrying
// speculativeAuthenticate, passes through) or authVerdictTTL passes, so a
// connection pays one probe per namespace, not one per command.

// authVerdictTTL bounds how long a verdict is trusted: privileges revoked
// by an administrator reach the proxy's own answers within it.
const authVerdictTTL = time.Minute

// connAuth is what a connection knows of its client's authentication.
// Like all conn state it is touched only by the connection's goroutine.
type connAuth struct {
	info     *rewrite.AuthInfo  // nil: not asked since the last change
	infoAt   time.Time          // when info was asked (kept authVerdictTTL)
	verdicts map[string]verdict // by namespace
}

type verdict struct {
	denied []byte // the upstream's refusal; nil when allowed
	at     time.Time
}

// authCommands change who is authenticated on a connection.
var authCommands = map[string]bool{
	"saslStart": true, "saslContinue": true, "authenticate": true, "logout": true,
}

// noteAuthChange forgets what the connection knew of its authentication
// when req may change it.
func (c *Conn) noteAuthChange(req *request) {
	change := authCommands[req.name]
	if !change && (req.name == "hello" || req.name == "isMaster" || req.name == "ismaster") {
		_, change = bson.Raw(req.msg.Body).Lookup("speculativeAuthenticate").DocumentOK()
	}
	if change {
		c.auth = connAuth{}
		c.upAuth = true
	}
}

// authInfo is who is authenticated on the connection, asked of the
// upstream once per authentication change.
func (c *Conn) authInfo() (rewrite.AuthInfo, error) {
	// Privileges an administrator revokes reach the proxy's own
	// decisions within authVerdictTTL, as its verdicts do.
	if c.auth.info != nil && time.Since(c.auth.infoAt) <= authVerdictTTL {
		return *c.auth.info, nil
	}
	reply, err := c.upCommand(rewrite.ConnectionStatusCommand())
	if err != nil {
		return rewrite.AuthInfo{}, err
	}
	info, err := rewrite.ParseConnectionStatus(reply)
	if err != nil {
		return rewrite.AuthInfo{}, err
	}
	c.auth.info, c.auth.infoAt = &info, time.Now()
	return info, nil
}

// users are the connection's authenticated users ("user@db", sorted).
func (c *Conn) users() ([]string, error) {
	info, err := c.authInfo()
	return info.Users, err
}

// identity names the connection's users in one string, for keys.
func (c *Conn) identity() (string, error) {
	users, err := c.users()
	if err != nil {
		return "", err
	}
	id := ""
	for _, u := range users {
		id += u + "\x00"
	}
	return id, nil
}

// authorize asks the upstream whether the client may run req on rule's
// namespace. denied, when not nil, is the reply the client gets instead;
// err is an upstream failure (it closes the connection).
func (c *Conn) authorize(req *request, rule *rules.Rule) (denied []byte, err error) {
	ns := rule.Namespace
	v, ok := c.auth.verdicts[ns]
	if !ok || time.Since(v.at) > authVerdictTTL {
		reply, err := c.upCommand(rewrite.AuthProbe(rule.DB, rule.Collection))
		if err != nil {
			return nil, err
		}
		if !mongoerr.IsOK(reply) && !rewrite.IsUnauthorized(reply) {
			// Any failure denies (an upstream may refuse with another
			// code: FerretDB on PostgreSQL fails a wrong PLAIN password
			// only at the next command), but only a refusal is kept: a
			// passing failure is asked again.
			return reply, nil
		}
		v = verdict{at: time.Now()}
		if rewrite.IsUnauthorized(reply) {
			v.denied = reply
		}
		if c.auth.verdicts == nil {
			c.auth.verdicts = map[string]verdict{}
		}
		c.auth.verdicts[ns] = v
	}
	if v.denied != nil {
		return v.denied, nil
	}
	action := rewrite.ActionOf(req.name)
	if action == rewrite.ActionFind {
		return nil, nil
	}
	info, err := c.authInfo()
	if err != nil {
		return nil, err
	}
	if info.Allows(action, rule.DB, rule.Collection) && info.Allows(action, rule.DB, rule.BucketCollection) {
		return nil, nil
	}
	return mongoerr.Reply(rewrite.NotAuthorized(rule.DB, req.name)), nil
}

// gateList asks the server to list db as the client before the proxy
// lists it (or refuses a filter) with what it knows of db's rules; done
// is true when req was answered (refused) already.
func (c *Conn) gateList(req *request, db string) error {
	reply, err := c.upCommand(rewrite.ListProbe(db))
	if err != nil || mongoerr.IsOK(reply) {
		return err
	}
	c.s.tel.ErrorSeen("Unauthorized")
	return answered(c.replyBody(req, reply))
}

// gate authorizes req before the proxy serves it; done is true when it
// was answered (refused) already.
func (c *Conn) gate(req *request, rule *rules.Rule) error {
	denied, err := c.authorize(req, rule)
	if err != nil || denied == nil {
		return err
	}
	c.s.tel.ErrorSeen("Unauthorized")
	c.log.Info("command refused by the upstream's authorization", "rule", rule.Namespace, "command", req.name)
	if req.msg.Flags&wire.MoreToCome != 0 {
		return errAnswered
	}
	return answered(c.replyBody(req, denied))
}

// cursorUserError is MongoDB's refusal of a getMore or killCursors of a
// cursor none of the client's users opened.
func cursorUserError(id int64, e *cursors.Entry, users []string) error {
	if rewrite.Coauthorized(e.Users, users) {
		return nil
	}
	return &mongoerr.Error{Code: mongoerr.Unauthorized,
		Msg: fmt.Sprintf("cursor id %d was not created by the authenticated user", id)}
}

// cursorOwnerError is MongoDB's refusal of a getMore of a cursor the
// client's users did not open, or opened in another session.
func cursorOwnerError(id int64, e *cursors.Entry, users []string, session string) error {
	if err := cursorUserError(id, e, users); err != nil {
		return err
	}
	switch {
	case session == e.Session:
		return nil
	case e.Session == "":
		return &mongoerr.Error{Code: mongoerr.GetMoreOutsideSession, Msg: fmt.Sprintf(
			"Cannot run getMore on cursor %d, which was not created in a session, in session %s", id, sessionHex(session))}
	case session == "":
		return &mongoerr.Error{Code: mongoerr.GetMoreWithoutSession, Msg: fmt.Sprintf(
			"Cannot run getMore on cursor %d, which was created in session %s, without an lsid", id, sessionHex(e.Session))}
	}
	return &mongoerr.Error{Code: mongoerr.GetMoreInOtherSession, Msg: fmt.Sprintf(
		"Cannot run getMore on cursor %d, which was created in session %s, in session %s", id, sessionHex(e.Session), sessionHex(session))}
}

func sessionHex(key string) string {
	if len(key) > 5 {
		return fmt.Sprintf("%x", key[5:]) // sessionKey's value: a binary's length, subtype and bytes
	}
	return fmt.Sprintf("%x", key)
}
