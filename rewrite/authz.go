package rewrite

import (
	"fmt"
	"slices"
	"strings"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// The proxy answers some commands on a bucketed namespace itself: refusals,
// invalid events, a retried write's recorded reply, the next batch of a
// cursor it holds. MongoDB checks a client's privileges before any of
// those, so the proxy asks the upstream first, on the client's own
// connection: these functions build what it asks and read the answers.

// Action is the privilege a command needs on its namespace, as MongoDB
// names it in a role's privileges.
type Action string

// The actions the commands of a bucketed namespace need.
const (
	ActionFind   Action = "find"
	ActionInsert Action = "insert"
	ActionUpdate Action = "update"
	ActionRemove Action = "remove"
	// The catalog commands of time-series collections: the proxy changes
	// its catalog (with its own credentials) before the upstream sees the
	// client's command, so it checks them first.
	ActionCreateCollection Action = "createCollection"
	ActionDropCollection   Action = "dropCollection"
	ActionCollMod          Action = "collMod"
	ActionDropDatabase     Action = "dropDatabase" // on the database: coll ""
)

// ActionOf is the action MongoDB checks for command name on its namespace;
// other admin commands reach the upstream themselves and are checked
// there, so reading is what the proxy confirms for them.
func ActionOf(name string) Action {
	switch name {
	case "insert":
		return ActionInsert
	case "delete":
		return ActionRemove
	case "update", "findAndModify", "findandmodify":
		return ActionUpdate
	case "create":
		return ActionCreateCollection
	case "drop":
		return ActionDropCollection
	case "collMod":
		return ActionCollMod
	}
	return ActionFind
}

// probeID matches no document: the probe reads or writes nothing.
var probeID = bson.ObjectID{0x74, 0x73, 0x70, 0x72, 0x6f, 0x78, 0x79, 0x2d, 0x61, 0x75, 0x74, 0x68}

// AuthProbe is a command that needs the find privilege on db.coll and has
// no effect: a find by an _id no document has. The proxy sends it on the
// app's namespace, which stays empty (the events are in the bucket
// collection), so it costs the upstream nothing on any backend.
func AuthProbe(db, coll string) []byte {
	b := bsoncore.NewDocumentBuilder().
		AppendString("find", coll).
		AppendDocument("filter", bsoncore.NewDocumentBuilder().AppendObjectID("_id", probeID).Build()).
		AppendInt32("limit", 1).
		AppendBoolean("singleBatch", true).
		AppendString("$db", db)
	return b.Build()
}

// ListProbe asks, as the client, to list db's collections by a name no
// collection has: what the server answers a listCollections of db, before
// the proxy says anything of its own about db's bucketed namespaces.
func ListProbe(db string) []byte {
	return bsoncore.NewDocumentBuilder().
		AppendInt32("listCollections", 1).
		AppendDocument("filter", bsoncore.NewDocumentBuilder().AppendString("name", "\x00tsproxy-probe").Build()).
		AppendBoolean("nameOnly", true).
		AppendString("$db", db).
		Build()
}

// ConnectionStatusCommand asks who is authenticated on a connection and
// with which privileges (MongoDB reports them; FerretDB only the users).
func ConnectionStatusCommand() []byte {
	return bsoncore.NewDocumentBuilder().
		AppendInt32("connectionStatus", 1).
		AppendBoolean("showPrivileges", true).
		AppendString("$db", "admin").
		Build()
}

// Privilege is one resource and the actions granted on it.
type Privilege struct {
	DB, Collection string // "" matches any, as in MongoDB's resource patterns
	AnyResource    bool
	Actions        []Action
}

// AuthInfo is a connection's authentication as connectionStatus reports it.
type AuthInfo struct {
	// Users are "user@db" of each authenticated user, sorted.
	Users []string
	// Privileges are nil when the upstream does not report them (FerretDB,
	// whose authenticated users may run everything).
	Privileges []Privilege
}

// ParseConnectionStatus reads a connectionStatus reply.
func ParseConnectionStatus(reply []byte) (AuthInfo, error) {
	doc := bsoncore.Document(reply)
	if err := mongoerr.ReplyError(doc); err != nil {
		return AuthInfo{}, fmt.Errorf("connectionStatus: %w", err)
	}
	info, ok := doc.Lookup("authInfo").DocumentOK()
	if !ok {
		return AuthInfo{}, fmt.Errorf("connectionStatus: reply without authInfo")
	}
	var out AuthInfo
	if users, ok := info.Lookup("authenticatedUsers").ArrayOK(); ok {
		vals, _ := users.Values()
		for _, v := range vals {
			u, ok := v.DocumentOK()
			if !ok {
				continue
			}
			name, _ := u.Lookup("user").StringValueOK()
			db, _ := u.Lookup("db").StringValueOK()
			out.Users = append(out.Users, name+"@"+db)
		}
	}
	slices.Sort(out.Users)
	// With nobody authenticated MongoDB reports no privileges, and runs
	// every command where authentication is off (where it is on, the
	// probe is refused): no privileges to check then, or every rewritten
	// write on a MongoDB without --auth was refused.
	if privs, ok := info.Lookup("authenticatedUserPrivileges").ArrayOK(); ok && len(out.Users) > 0 {
		out.Privileges = []Privilege{}
		vals, _ := privs.Values()
		for _, v := range vals {
			if p, ok := parsePrivilege(v); ok {
				out.Privileges = append(out.Privileges, p)
			}
		}
	}
	return out, nil
}

func parsePrivilege(v bsoncore.Value) (Privilege, bool) {
	d, ok := v.DocumentOK()
	if !ok {
		return Privilege{}, false
	}
	res, ok := d.Lookup("resource").DocumentOK()
	if !ok {
		return Privilege{}, false
	}
	var p Privilege
	if any, ok := res.Lookup("anyResource").BooleanOK(); ok && any {
		p.AnyResource = true
	} else {
		db, okDB := res.Lookup("db").StringValueOK()
		coll, okColl := res.Lookup("collection").StringValueOK()
		if !okDB || !okColl {
			return Privilege{}, false // cluster and system resources grant nothing here
		}
		p.DB, p.Collection = db, coll
	}
	actions, _ := d.Lookup("actions").ArrayOK()
	vals, _ := actions.Values()
	for _, a := range vals {
		if s, ok := a.StringValueOK(); ok {
			p.Actions = append(p.Actions, Action(s))
		}
	}
	return p, true
}

// Allows says whether the privileges grant action on db.coll. MongoDB's
// resource patterns: {db: "", collection: ""} is every ordinary
// collection, an empty db any database, an empty collection any ordinary
// collection of db ("system." collections need naming).
func (a AuthInfo) Allows(action Action, db, coll string) bool {
	if a.Privileges == nil {
		return true
	}
	system := strings.HasPrefix(coll, "system.")
	for _, p := range a.Privileges {
		if !slices.Contains(p.Actions, action) && !slices.Contains(p.Actions, "anyAction") {
			continue
		}
		if p.AnyResource {
			return true
		}
		if (p.DB == "" || p.DB == db) && (p.Collection == coll || (p.Collection == "" && !system)) {
			return true
		}
	}
	return false
}

// NotAuthorized is MongoDB's refusal of a command the client's users may not
// run on db.
func NotAuthorized(db, command string) error {
	return &mongoerr.Error{Code: mongoerr.Unauthorized, Msg: fmt.Sprintf("not authorized on %s to execute command { %s: ... }", db, command)}
}

// IsUnauthorized says whether reply is an authorization or authentication
// refusal (Unauthorized, AuthenticationFailed), which the client must see
// as the upstream gave it.
func IsUnauthorized(reply []byte) bool {
	doc := bsoncore.Document(reply)
	if mongoerr.IsOK(doc) {
		return false
	}
	code, _ := doc.Lookup("code").AsInt64OK()
	return mongoerr.Code(code) == mongoerr.Unauthorized || mongoerr.Code(code) == mongoerr.AuthenticationFailed
}

// Coauthorized says whether a cursor opened by users may be read by others:
// MongoDB lets any one of the cursor's users continue it, and, with no
// users at all (an upstream without authentication), anyone.
func Coauthorized(owners, others []string) bool {
	if len(owners) == 0 {
		return true
	}
	for _, u := range others {
		if slices.Contains(owners, u) {
			return true
		}
	}
	return false
}
