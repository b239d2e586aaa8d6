package proxy

// A scripted upstream that enforces authentication as MongoDB does (the
// embedded FerretDB enforces none): hello, ping, buildInfo and
// connectionStatus answer anybody; saslStart (its payload is the user
// name, or "user:password", accepted at once) authenticates the
// connection; logout ends it; every other command of an unauthenticated
// connection gets Unauthorized (13). Authenticated connections get empty,
// successful replies, or are relayed to a real upstream (relay).

import (
	"bufio"
	"net"
	"strings"
	"sync"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/wire"
)

type fakeAuthUpstream struct {
	t  *testing.T
	ln net.Listener

	mu sync.Mutex
	// privileges, when not nil, are reported by connectionStatus (as
	// MongoDB does) for an authenticated user; nil reports none (as
	// FerretDB does).
	privileges func(user string) bson.A
	// mongo: buildInfo as MongoDB 7.0, else as FerretDB.
	mongo bool
	// open: authentication is not enforced (every command runs for an
	// unauthenticated connection), as on a server without --auth.
	open bool
	// relay, when set, is the address of a real upstream (the embedded
	// FerretDB) that an authenticated connection's commands are relayed to.
	// A connection whose saslStart payload is "user:password" claims user;
	// as on FerretDB's PLAIN mechanism over PostgreSQL, the claim is
	// accepted at once (connectionStatus reports it), and a wrong
	// password (other than "good") fails each later command with
	// InternalError, when the backend refuses the credentials.
	relay string
}

func startFakeAuthUpstream(t *testing.T, mongo bool) *fakeAuthUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeAuthUpstream{t: t, ln: ln, mongo: mongo}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			go f.serve(nc)
		}
	}()
	return f
}

func (f *fakeAuthUpstream) uri() string { return "mongodb://" + f.ln.Addr().String() + "/" }

func (f *fakeAuthUpstream) setPrivileges(p func(user string) bson.A) {
	f.mu.Lock()
	f.privileges = p
	f.mu.Unlock()
}

func (f *fakeAuthUpstream) serve(nc net.Conn) {
	defer nc.Close()
	r := bufio.NewReader(nc)
	user := ""
	good := true
	var upc net.Conn
	var upr *bufio.Reader
	defer func() {
		if upc != nil {
			upc.Close()
		}
	}()
	for {
		h, frame, err := wire.ReadMessage(r, nil, 0)
		if err != nil {
			return
		}
		var m wire.Msg
		if err := m.Decode(frame); err != nil {
			return
		}
		body := bson.Raw(m.Body)
		name := m.CommandName()
		coll, _ := body.Index(0).Value().StringValueOK()
		f.mu.Lock()
		privs := f.privileges
		mongo, open, relay := f.mongo, f.open, f.relay
		f.mu.Unlock()
		var reply bson.D
		switch name {
		case "hello", "isMaster", "ismaster":
			reply = bson.D{{Key: "isWritablePrimary", Value: true}, {Key: "ismaster", Value: true},
				{Key: "maxBsonObjectSize", Value: int32(16 << 20)}, {Key: "maxMessageSizeBytes", Value: int32(48_000_000)},
				{Key: "maxWriteBatchSize", Value: int32(100_000)}, {Key: "minWireVersion", Value: int32(0)},
				{Key: "maxWireVersion", Value: int32(21)}, {Key: "logicalSessionTimeoutMinutes", Value: int32(30)}, {Key: "ok", Value: 1.0}}
		case "ping":
			reply = bson.D{{Key: "ok", Value: 1.0}}
		case "buildInfo", "buildinfo":
			if mongo {
				reply = bson.D{{Key: "version", Value: "7.0.0"}, {Key: "versionArray", Value: bson.A{int32(7), int32(0), int32(0), int32(0)}}, {Key: "ok", Value: 1.0}}
			} else {
				reply = bson.D{{Key: "version", Value: "7.0.42"}, {Key: "ferretdbVersion", Value: "v1.24.0"}, {Key: "versionArray", Value: bson.A{int32(7), int32(0), int32(42), int32(0)}}, {Key: "ok", Value: 1.0}}
			}
		case "saslStart":
			_, payload := body.Lookup("payload").Binary()
			user = string(payload)
			good = true
			if u, pw, ok := strings.Cut(user, ":"); ok {
				user, good = u, pw == "good"
			}
			reply = bson.D{{Key: "conversationId", Value: int32(1)}, {Key: "done", Value: true}, {Key: "payload", Value: bson.Binary{Data: []byte{}}}, {Key: "ok", Value: 1.0}}
		case "logout":
			user = ""
			reply = bson.D{{Key: "ok", Value: 1.0}}
		case "connectionStatus":
			users := bson.A{}
			if user != "" {
				users = append(users, bson.D{{Key: "user", Value: user}, {Key: "db", Value: "admin"}})
			}
			info := bson.D{{Key: "authenticatedUsers", Value: users}, {Key: "authenticatedUserRoles", Value: bson.A{}}}
			if privs != nil {
				p := bson.A{}
				if user != "" {
					p = privs(user)
				}
				info = append(info, bson.E{Key: "authenticatedUserPrivileges", Value: p})
			}
			reply = bson.D{{Key: "authInfo", Value: info}, {Key: "ok", Value: 1.0}}
		default:
			switch {
			case user == "" && !open:
				reply = bson.D{{Key: "ok", Value: 0.0}, {Key: "errmsg", Value: "Command " + name + " requires authentication"},
					{Key: "code", Value: int32(13)}, {Key: "codeName", Value: "Unauthorized"}}
			case !good:
				reply = bson.D{{Key: "ok", Value: 0.0}, {Key: "errmsg", Value: "failed to connect: password authentication failed for user \"" + user + "\""},
					{Key: "code", Value: int32(1)}, {Key: "codeName", Value: "InternalError"}}
			case relay != "":
				if upc == nil {
					if upc, err = net.Dial("tcp", relay); err != nil {
						return
					}
					upr = bufio.NewReader(upc)
				}
				if _, err := upc.Write(frame); err != nil {
					return
				}
				_, rf, err := wire.ReadMessage(upr, nil, 0)
				if err != nil {
					return
				}
				if _, err := nc.Write(rf); err != nil {
					return
				}
				continue
			case name == "find" || name == "aggregate" || name == "listCollections" || name == "listIndexes":
				reply = bson.D{{Key: "cursor", Value: bson.D{{Key: "id", Value: int64(0)}, {Key: "ns", Value: m.DB() + "." + coll}, {Key: "firstBatch", Value: bson.A{}}}}, {Key: "ok", Value: 1.0}}
			case name == "insert" || name == "update" || name == "delete":
				reply = bson.D{{Key: "n", Value: int32(0)}, {Key: "ok", Value: 1.0}}
			default:
				reply = bson.D{{Key: "ok", Value: 1.0}}
			}
		}
		out, err := bson.Marshal(reply)
		if err != nil {
			f.t.Error(err)
			return
		}
		if _, err := nc.Write(wire.AppendMsg(nil, h.RequestID+1_000_000, h.RequestID, 0, out)); err != nil {
			return
		}
	}
}

// authenticateAs makes the wire client's connection authenticated as user
// on the fake upstream.
func (c *wireClient) authenticateAs(user string) {
	c.t.Helper()
	r := c.cmd(bson.D{{Key: "saslStart", Value: 1}, {Key: "mechanism", Value: "PLAIN"}, {Key: "payload", Value: bson.Binary{Data: []byte(user)}}, {Key: "$db", Value: "admin"}})
	if ok, _ := r.Lookup("ok").AsFloat64OK(); ok != 1 {
		c.t.Fatalf("saslStart: %s", r)
	}
}

func codeOf(r bson.Raw) int64 {
	n, _ := r.Lookup("code").AsInt64OK()
	return n
}
