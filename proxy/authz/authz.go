package authz

import (
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/proxy/cursors"
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
)

// authVerdictTTL bounds how long a verdict is trusted: privileges revoked
// by an administrator reach the proxy's own answers within it.
const authVerdictTTL = time.Minute

// Verdicts is what a connection knows of its client's authentication.
// Like all of a connection's state it is touched only by the
// connection's goroutine. The zero value knows nothing.
type Verdicts struct {
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

// Changes says whether command name, with body, may change who is
// authenticated on the connection: then Forget what it knew.
func Changes(name string, body []byte) bool {
	if authCommands[name] {
		return true
	}
	if name == "hello" || name == "isMaster" || name == "ismaster" {
		_, ok := bson.Raw(body).Lookup("speculativeAuthenticate").DocumentOK()
		return ok
	}
	return false
}

// Forget forgets every verdict and who is authenticated.
func (a *Verdicts) Forget() { *a = Verdicts{} }

// Run runs a command on the client's own upstream connection, with its
// credentials.
type Run func(body []byte) ([]byte, error)

// Info is who is authenticated on the connection, asked of the
// upstream once per authentication change.
func (a *Verdicts) Info(run Run) (rewrite.AuthInfo, error) {
	// Privileges an administrator revokes reach the proxy's own
	// decisions within authVerdictTTL, as its verdicts do.
	if a.info != nil && time.Since(a.infoAt) <= authVerdictTTL {
		return *a.info, nil
	}
	reply, err := run(rewrite.ConnectionStatusCommand())
	if err != nil {
		return rewrite.AuthInfo{}, err
	}
	info, err := rewrite.ParseConnectionStatus(reply)
	if err != nil {
		return rewrite.AuthInfo{}, err
	}
	a.info, a.infoAt = &info, time.Now()
	return info, nil
}

// Users are the connection's authenticated users ("user@db", sorted).
func (a *Verdicts) Users(run Run) ([]string, error) {
	info, err := a.Info(run)
	return info.Users, err
}

// Identity names the connection's users in one string, for keys.
func (a *Verdicts) Identity(run Run) (string, error) {
	users, err := a.Users(run)
	if err != nil {
		return "", err
	}
	id := ""
	for _, u := range users {
		id += u + "\x00"
	}
	return id, nil
}

// Authorize asks the upstream, with run, whether the client may run
// command on rule's namespace. denied, when not nil, is the reply the client gets instead;
// err is an upstream failure (it closes the connection).
func (a *Verdicts) Authorize(run Run, command string, rule *rules.Rule) (denied []byte, err error) {
	ns := rule.Namespace
	v, ok := a.verdicts[ns]
	if !ok || time.Since(v.at) > authVerdictTTL {
		reply, err := run(rewrite.AuthProbe(rule.DB, rule.Collection))
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
		if a.verdicts == nil {
			a.verdicts = map[string]verdict{}
		}
		a.verdicts[ns] = v
	}
	if v.denied != nil {
		return v.denied, nil
	}
	action := rewrite.ActionOf(command)
	if action == rewrite.ActionFind {
		return nil, nil
	}
	info, err := a.Info(run)
	if err != nil {
		return nil, err
	}
	if info.Allows(action, rule.DB, rule.Collection) && info.Allows(action, rule.DB, rule.BucketCollection) {
		return nil, nil
	}
	return mongoerr.Reply(rewrite.NotAuthorized(rule.DB, command)), nil
}

// CursorUserError is MongoDB's refusal of a getMore or killCursors of a
// cursor none of the client's users opened.
func CursorUserError(id int64, e *cursors.Entry, users []string) error {
	if rewrite.Coauthorized(e.Users, users) {
		return nil
	}
	return &mongoerr.Error{Code: mongoerr.Unauthorized,
		Msg: fmt.Sprintf("cursor id %d was not created by the authenticated user", id)}
}

// CursorOwnerError is MongoDB's refusal of a getMore of a cursor the
// client's users did not open, or opened in another session.
func CursorOwnerError(id int64, e *cursors.Entry, users []string, session string) error {
	if err := CursorUserError(id, e, users); err != nil {
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
