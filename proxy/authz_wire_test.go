package proxy

import (
	"io"
	"log/slog"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/upstream"
)

// An unauthenticated client on an upstream that enforces authentication:
// the proxy's own answers on a rule's namespace must be the upstream's
// Unauthorized, naming nothing of the rule.
func TestUnauthenticatedSeesNoRule(t *testing.T) {
	up := startFakeAuthUpstream(t, true)
	_, addr := startWireProxy(t, wireRule, up.uri(), nil)
	c := dialWire(t, addr)

	// The baseline: a find is refused by the upstream.
	if r := c.cmd(bson.D{{Key: "find", Value: "readings"}, {Key: "$db", Value: "db"}}); codeOf(r) != 13 {
		t.Fatalf("find: want Unauthorized, got %s", r)
	}
	cases := []struct {
		name string
		cmd  bson.D
	}{
		{"listCollections by $regex", bson.D{{Key: "listCollections", Value: 1}, {Key: "filter", Value: bson.D{{Key: "name", Value: bson.D{{Key: "$regex", Value: "^r"}}}}}, {Key: "$db", Value: "db"}}},
		{"listCollections name in $or", bson.D{{Key: "listCollections", Value: 1}, {Key: "filter", Value: bson.D{{Key: "$or", Value: bson.A{bson.D{{Key: "name", Value: "x"}}}}}}, {Key: "$db", Value: "db"}}},
		{"tsproxyFlush of the rule", bson.D{{Key: "tsproxyFlush", Value: "db.readings"}, {Key: "$db", Value: "admin"}}},
		{"tsproxyFlush of every rule", bson.D{{Key: "tsproxyFlush", Value: 1}, {Key: "$db", Value: "admin"}}},
		{"tsproxyStagingFormat of the rule", bson.D{{Key: "tsproxyStagingFormat", Value: "db.readings"}, {Key: "$db", Value: "admin"}}},
	}
	for _, tc := range cases {
		r := c.cmd(tc.cmd)
		if codeOf(r) != 13 || strings.Contains(r.String(), "readings") {
			t.Errorf("%s: want the upstream's Unauthorized (13) naming nothing of the rule, got %s", tc.name, r)
		}
	}
	// No oracle: a namespace without a rule answers the same.
	if r := c.cmd(bson.D{{Key: "tsproxyFlush", Value: "db.other"}, {Key: "$db", Value: "admin"}}); codeOf(r) != 13 {
		t.Errorf("tsproxyFlush of a namespace without a rule: %s, want the upstream's Unauthorized", r)
	}
}

// The same on a FerretDB-like upstream, where the rule is staged.
func TestUnauthenticatedFlushStaged(t *testing.T) {
	up := startFakeAuthUpstream(t, false)
	_, addr := startWireProxy(t, wireRule, up.uri(), nil)
	c := dialWire(t, addr)
	for _, cmd := range []bson.D{
		{{Key: "tsproxyFlush", Value: 1}, {Key: "$db", Value: "admin"}},
		{{Key: "tsproxyStagingFormat", Value: 1}, {Key: "$db", Value: "admin"}},
	} {
		r := c.cmd(cmd)
		if codeOf(r) != 13 || strings.Contains(r.String(), "readings") {
			t.Errorf("%s: want the upstream's Unauthorized (13) naming nothing of the rule, got %s", cmd[0].Key, r)
		}
	}
}

// MongoDB without authentication enabled answers connectionStatus with
// showPrivileges as it does for any unauthenticated connection: an empty
// authenticatedUserPrivileges array (connection_status.cpp always sets it
// when showPrivileges is true). Every command runs there; the proxy must
// not refuse the rewritten writes.
func TestMongoWithoutAuthAllowsWrites(t *testing.T) {
	up := startFakeAuthUpstream(t, true)
	up.open = true
	up.setPrivileges(func(string) bson.A { return bson.A{} })
	_, addr := startWireProxy(t, wireRule, up.uri(), nil)
	c := dialWire(t, addr)
	for _, cmd := range []bson.D{
		{{Key: "insert", Value: "readings"}, {Key: "documents", Value: bson.A{bson.D{{Key: "ts", Value: bson.DateTime(1700000000000)}, {Key: "sensor", Value: "a"}, {Key: "v", Value: 1}}}}, {Key: "$db", Value: "db"}},
		{{Key: "delete", Value: "readings"}, {Key: "deletes", Value: bson.A{bson.D{{Key: "q", Value: bson.D{}}, {Key: "limit", Value: 0}}}}, {Key: "$db", Value: "db"}},
	} {
		r := c.cmd(cmd)
		if codeOf(r) == 13 {
			t.Errorf("%s on a server without authentication: refused by the proxy: %s", cmd[0].Key, r)
		}
	}
}

// On FerretDB's PLAIN mechanism over PostgreSQL, saslStart accepts any
// claim at once (connectionStatus then reports the claimed user) and the
// backend refuses a wrong password on each later command with
// InternalError, not Unauthorized. A client that claims alice with a wrong
// password must not get alice's recorded retryable-write reply.
func TestImpostorGetsNoRecordedReply(t *testing.T) {
	e, err := upstream.StartEmbedded(upstream.EmbeddedOptions{DataDir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	up := startFakeAuthUpstream(t, false) // buildInfo as FerretDB: staged inserts
	up.relay = e.Addr()
	_, addr := startWireProxy(t, wireRule, up.uri(), nil)

	lsid := bson.D{{Key: "id", Value: bson.Binary{Subtype: 4, Data: []byte("0123456789abcdef")}}}
	insert := bson.D{{Key: "insert", Value: "readings"},
		{Key: "documents", Value: bson.A{bson.D{{Key: "_id", Value: 1}, {Key: "ts", Value: bson.DateTime(1700000000000)}, {Key: "sensor", Value: "a"}, {Key: "secret", Value: 42}}}},
		{Key: "lsid", Value: lsid}, {Key: "txnNumber", Value: int64(7)}, {Key: "$db", Value: "db"}}

	alice := dialWire(t, addr)
	alice.authenticateAs("alice:good")
	if r := alice.cmd(insert); codeOf(r) != 0 {
		t.Fatalf("alice's insert: %s", r)
	}

	mallory := dialWire(t, addr)
	mallory.authenticateAs("alice:wrong")
	if r := mallory.cmd(bson.D{{Key: "find", Value: "plain"}, {Key: "$db", Value: "db"}}); codeOf(r) == 0 {
		t.Fatalf("the impostor's passthrough find succeeded: %s", r)
	}
	r := mallory.cmd(insert)
	if ok, _ := r.Lookup("ok").AsFloat64OK(); ok == 1 {
		t.Errorf("an impostor with a wrong password got alice's recorded reply: %s", r)
	}
}

// TestImpostorEndsNoSession: the same impostor's endSessions of alice's
// session leaves alice's cursor of a rule alone (the users connectionStatus
// names are the claimed ones; the server refuses the impostor on the rule).
func TestImpostorEndsNoSession(t *testing.T) {
	e, err := upstream.StartEmbedded(upstream.EmbeddedOptions{DataDir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	up := startFakeAuthUpstream(t, false)
	up.relay = e.Addr()
	_, addr := startWireProxy(t, wireRule, up.uri(), nil)
	lsid := bson.D{{Key: "id", Value: bson.Binary{Subtype: 4, Data: []byte("fedcba9876543210")}}}
	alice := dialWire(t, addr)
	alice.authenticateAs("alice:good")
	docs := bson.A{}
	for i := range 3 {
		docs = append(docs, bson.D{{Key: "ts", Value: bson.DateTime(1700000000000 + int64(i)*1000)}, {Key: "sensor", Value: "a"}, {Key: "v", Value: i}})
	}
	if r := alice.cmd(bson.D{{Key: "insert", Value: "readings"}, {Key: "documents", Value: docs}, {Key: "$db", Value: "db"}}); codeOf(r) != 0 {
		t.Fatalf("insert: %s", r)
	}
	r := alice.cmd(bson.D{{Key: "find", Value: "readings"}, {Key: "batchSize", Value: 1}, {Key: "lsid", Value: lsid}, {Key: "$db", Value: "db"}})
	id := r.Lookup("cursor", "id").Int64()
	if id == 0 {
		t.Fatalf("no cursor: %s", r)
	}
	mallory := dialWire(t, addr)
	mallory.authenticateAs("alice:wrong")
	mallory.cmd(bson.D{{Key: "endSessions", Value: bson.A{lsid}}, {Key: "$db", Value: "admin"}})
	r = alice.cmd(bson.D{{Key: "getMore", Value: id}, {Key: "collection", Value: "readings"}, {Key: "lsid", Value: lsid}, {Key: "$db", Value: "db"}})
	if n, _ := r.Lookup("cursor", "nextBatch").Array().Values(); len(n) != 2 {
		t.Fatalf("alice's getMore after the impostor's endSessions: %s", r)
	}
}
