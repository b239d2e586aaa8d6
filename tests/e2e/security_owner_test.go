package e2e

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tsproxy/tsproxy/tests/backend"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// ownerSetup is the ferretdb command with two SCRAM users, alice and bob
// (FerretDB has no roles: both may run everything), behind a proxy with
// an events rule (readings) and a counter rule (hits).
type ownerSetup struct {
	db          string
	p           *testProxy
	alice, bob  *mongo.Client
	aliceURI    string
	aliceEvents []sentEvent
}

const ownerPass = "pw-owner-81x"

func newOwnerSetup(t *testing.T) *ownerSetup {
	t.Helper()
	fdb := startFerretDB(t, backend.FerretDBOptions{User: "alice", Password: ownerPass})
	db := uniqueDB(t)
	yaml := readingsRule(db, 100) + strings.TrimPrefix(counterRule(db), "rules:\n")
	p := startProxy(t, proxyOptions{yaml: yaml, upstreamURI: "mongodb://" + fdb.Addr + "/"})
	ctx := ctxFor(t)
	up := connect(t, fmt.Sprintf("mongodb://alice:%s@%s/?authSource=admin", ownerPass, fdb.Addr))
	if err := up.Database("admin").RunCommand(ctx, bson.D{{Key: "createUser", Value: "bob"},
		{Key: "pwd", Value: ownerPass}, {Key: "roles", Value: bson.A{}}}).Err(); err != nil {
		t.Fatalf("create user bob: %v", err)
	}
	s := &ownerSetup{db: db, p: p,
		aliceURI: fmt.Sprintf("mongodb://alice:%s@%s/?authSource=admin", ownerPass, p.addr)}
	s.alice = connect(t, s.aliceURI)
	s.bob = connect(t, fmt.Sprintf("mongodb://bob:%s@%s/?authSource=admin", ownerPass, p.addr))
	s.aliceEvents = genEvents(300, 2, 1, 11)
	if _, err := s.alice.Database(db).Collection("readings").InsertMany(ctx, eventDocs(s.aliceEvents)); err != nil {
		t.Fatal(err)
	}
	hits, _ := genHits(200, 5)
	if _, err := s.alice.Database(db).Collection("hits").InsertMany(ctx, hits); err != nil {
		t.Fatal(err)
	}
	return s
}

// ownedCursor is a cursor alice opened, and how many documents it yields.
type ownedCursor struct {
	name string
	cur  *mongo.Cursor
	coll string
	want int
}

// openAliceCursors opens, in one explicit session of alice's, one cursor
// of each kind the proxy serves: a point read and a bucket scan (both held
// by the proxy), an aggregate (an upstream cursor mapped by the proxy) and
// a counter read (held by the proxy). Each has read its first batch of 5.
func (s *ownerSetup) openAliceCursors(t *testing.T, ctx context.Context) ([]ownedCursor, *mongo.Session) {
	t.Helper()
	sess, err := s.alice.StartSession()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sess.EndSession(context.Background()) })
	sctx := mongo.NewSessionContext(ctx, sess)
	readings := s.alice.Database(s.db).Collection("readings")
	day := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	inDay := bson.D{{Key: "$gte", Value: day}, {Key: "$lt", Value: day.Add(24 * time.Hour)}}
	sensor0 := 0
	for _, e := range s.aliceEvents {
		if e.sensor == "sensor-00" {
			sensor0++
		}
	}
	batch := options.Find().SetBatchSize(5)
	var out []ownedCursor
	open := func(name, coll string, want int, cur *mongo.Cursor, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if cur.ID() == 0 {
			t.Fatalf("%s: no cursor left open after the first batch", name)
		}
		out = append(out, ownedCursor{name, cur, coll, want})
	}
	cur, err := readings.Find(sctx, bson.D{{Key: "sensorId", Value: "sensor-00"}, {Key: "ts", Value: inDay}}, batch)
	open("point read", "readings", sensor0, cur, err)
	cur, err = readings.Find(sctx, bson.D{{Key: "ts", Value: inDay}}, batch)
	open("bucket scan", "readings", len(s.aliceEvents), cur, err)
	cur, err = readings.Aggregate(sctx, bson.A{bson.D{{Key: "$match", Value: bson.D{{Key: "value", Value: bson.D{{Key: "$gte", Value: 0}}}}}}},
		options.Aggregate().SetBatchSize(5))
	open("aggregate", "readings", len(s.aliceEvents), cur, err)
	// A counter read yields one document per non-empty slot.
	all, err := s.alice.Database(s.db).Collection("hits").Find(ctx, bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	var slotDocs []bson.D
	if err := all.All(ctx, &slotDocs); err != nil {
		t.Fatal(err)
	}
	cur, err = s.alice.Database(s.db).Collection("hits").Find(sctx, bson.D{}, batch)
	open("counter read", "hits", len(slotDocs), cur, err)
	return out, sess
}

// TestCursorsBelongToTheirUsers: getMore and killCursors of a cursor the
// proxy serves, from a client without credentials or another user, are
// refused with Unauthorized (13) and touch nothing; a getMore from the
// same user in another session gets MongoDB's session error (50738);
// another user's endSessions of the owner's session ends nothing of hers.
// Then alice reads every cursor to its end.
func TestCursorsBelongToTheirUsers(t *testing.T) {
	t.Parallel()
	s := newOwnerSetup(t)
	ctx := ctxFor(t)
	cursors, sess := s.openAliceCursors(t, ctx)
	anon := dialRaw(t, s.p.addr)
	for _, oc := range cursors {
		getMore := bson.D{{Key: "getMore", Value: oc.cur.ID()}, {Key: "collection", Value: oc.coll}, {Key: "batchSize", Value: 1000}, {Key: "$db", Value: s.db}}
		kill := bson.D{{Key: "killCursors", Value: oc.coll}, {Key: "cursors", Value: bson.A{oc.cur.ID()}}, {Key: "$db", Value: s.db}}
		for _, cmd := range []bson.D{getMore, kill} {
			errorReply(t, anon.command(cmd), 13, "Unauthorized")
			err := s.bob.Database(s.db).RunCommand(ctx, cmd).Err()
			if !hasAuthError(err, 13, "was not created by the authenticated user") {
				t.Errorf("%s: bob's %s: %v, want Unauthorized", oc.name, cmd[0].Key, err)
			}
		}
		// RunCommand runs in an implicit session of its own.
		err := s.alice.Database(s.db).RunCommand(ctx, getMore).Err()
		var se mongo.ServerError
		if !errors.As(err, &se) || !se.HasErrorCode(50738) {
			t.Errorf("%s: alice's getMore in another session: %v, want 50738", oc.name, err)
		}
	}
	lsid := sess.ID()
	if err := s.bob.Database("admin").RunCommand(ctx, bson.D{{Key: "endSessions", Value: bson.A{lsid}}}).Err(); err != nil {
		t.Logf("bob's endSessions of alice's session (passed through): %v", err)
	}
	sctx := mongo.NewSessionContext(ctx, sess)
	for _, oc := range cursors {
		n := 0
		for oc.cur.Next(sctx) {
			n++
		}
		if err := oc.cur.Err(); err != nil {
			t.Errorf("%s: alice reading her cursor after the refusals: %v", oc.name, err)
		}
		if n != oc.want {
			t.Errorf("%s: alice read %d documents, want %d", oc.name, n, oc.want)
		}
	}
}

// TestReplayedSessionGetsNoRecordedReply: an authenticated client's
// retryable insert is recorded with its reply; the same command (same lsid
// and txnNumber, same documents) sent without credentials gets the
// upstream's Unauthorized error, not the recorded acknowledgement, and
// stores nothing.
func TestReplayedSessionGetsNoRecordedReply(t *testing.T) {
	t.Parallel()
	s := newOwnerSetup(t)
	ctx := ctxFor(t)
	var mu sync.Mutex
	var inserts []bson.Raw
	mon := &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		if e.CommandName == "insert" {
			mu.Lock()
			inserts = append(inserts, append(bson.Raw(nil), e.Command...))
			mu.Unlock()
		}
	}}
	watched, err := mongo.Connect(options.Client().ApplyURI(s.aliceURI).SetMonitor(mon).SetRetryWrites(true))
	if err != nil {
		t.Fatal(err)
	}
	defer watched.Disconnect(context.Background())
	evs := seriesEvents(10, "sensor-replay", time.Date(2026, 3, 2, 5, 0, 0, 0, time.UTC))
	if _, err := watched.Database(s.db).Collection("readings").InsertMany(ctx, docsOf(evs)); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if len(inserts) != 1 {
		t.Fatalf("%d insert commands seen, want 1", len(inserts))
	}
	sent := inserts[0]
	mu.Unlock()
	if _, err := sent.LookupErr("txnNumber"); err != nil {
		t.Fatalf("the driver's insert is not retryable: %v", sent)
	}
	// The same command, replayed on a raw connection without credentials
	// (the driver sent the documents as a sequence; here they go in the
	// body, which is the same command).
	var body bson.D
	for _, e := range mustD(t, sent) {
		switch e.Key {
		case "$clusterTime":
			continue
		case "documents":
			continue
		}
		body = append(body, e)
	}
	body = append(body, bson.E{Key: "documents", Value: docsOf(evs)})
	anon := dialRaw(t, s.p.addr)
	reply := anon.command(body)
	errorReply(t, reply, 13, "Unauthorized")
	if n, err := s.alice.Database(s.db).Collection("readings").CountDocuments(ctx, bson.D{{Key: "sensorId", Value: "sensor-replay"}}); err != nil || n != 10 {
		t.Fatalf("replayed events stored: %d %v, want 10", n, err)
	}
}

// TestAuthorizationBeforeRefusals: without credentials, every command on a
// bucketed namespace that the proxy would refuse or answer itself (update,
// findAndModify, an explain, a find shape it refuses, an invalid event, a
// rename onto the rule, an unsupported command) gets the upstream's
// Unauthorized error, naming neither the rule nor its bucket collection.
func TestAuthorizationBeforeRefusals(t *testing.T) {
	t.Parallel()
	s := newOwnerSetup(t)
	ctx := ctxFor(t)
	db := s.db
	cmds := []bson.D{
		{{Key: "update", Value: "readings"}, {Key: "updates", Value: bson.A{bson.D{{Key: "q", Value: bson.D{}}, {Key: "u", Value: bson.D{{Key: "$set", Value: bson.D{{Key: "v", Value: 1}}}}}}}}},
		{{Key: "findAndModify", Value: "readings"}, {Key: "query", Value: bson.D{}}, {Key: "update", Value: bson.D{{Key: "$set", Value: bson.D{{Key: "v", Value: 1}}}}}},
		{{Key: "explain", Value: bson.D{{Key: "find", Value: "readings"}, {Key: "filter", Value: bson.D{}}}}},
		{{Key: "find", Value: "readings"}, {Key: "filter", Value: bson.D{{Key: "$where", Value: "true"}}}},
		{{Key: "find", Value: "readings"}, {Key: "collation", Value: bson.D{{Key: "locale", Value: "fr"}}}},
		{{Key: "find", Value: "readings"}, {Key: "filter", Value: bson.D{{Key: "$or", Value: bson.A{bson.D{{Key: "sensorId", Value: "x"}}}}}}, {Key: "sort", Value: bson.D{{Key: "sensorId", Value: 1}}}}, // an event scan
		{{Key: "insert", Value: "readings"}, {Key: "documents", Value: bson.A{bson.D{{Key: "sensorId", Value: "x"}}}}},
		{{Key: "delete", Value: "readings"}, {Key: "deletes", Value: bson.A{bson.D{{Key: "q", Value: bson.D{{Key: "$where", Value: "1"}}}, {Key: "limit", Value: 0}}}}},
		{{Key: "aggregate", Value: "readings"}, {Key: "pipeline", Value: bson.A{bson.D{{Key: "$lookup", Value: bson.D{{Key: "from", Value: "x"}, {Key: "as", Value: "y"}, {Key: "localField", Value: "a"}, {Key: "foreignField", Value: "b"}}}}}}, {Key: "cursor", Value: bson.D{}}},
		{{Key: "validate", Value: "readings"}},
		{{Key: "find", Value: "hits"}, {Key: "filter", Value: bson.D{{Key: "$where", Value: "true"}}}},
		{{Key: "update", Value: "hits"}, {Key: "updates", Value: bson.A{bson.D{{Key: "q", Value: bson.D{}}, {Key: "u", Value: bson.D{{Key: "$set", Value: bson.D{{Key: "v", Value: 1}}}}}}}}},
	}
	anon := dialRaw(t, s.p.addr)
	for _, cmd := range cmds {
		cmd = append(cmd, bson.E{Key: "$db", Value: db})
		reply := anon.command(cmd)
		errorReply(t, reply, 13, "Unauthorized")
		if msg := reply.Lookup("errmsg").StringValue(); strings.Contains(msg, "tsproxy") || strings.Contains(msg, "buckets") {
			t.Errorf("%s: the refusal tells of the rule: %q", cmd[0].Key, msg)
		}
	}
	rename := bson.D{{Key: "renameCollection", Value: db + ".other"}, {Key: "to", Value: db + ".readings"}, {Key: "$db", Value: "admin"}}
	errorReply(t, anon.command(rename), 13, "Unauthorized")
	// The authenticated user still gets the proxy's refusal.
	err := s.alice.Database(db).RunCommand(ctx, bson.D{{Key: "findAndModify", Value: "readings"},
		{Key: "query", Value: bson.D{{Key: "tags", Value: "x"}}}, {Key: "update", Value: bson.D{{Key: "$set", Value: bson.D{{Key: "tags.$", Value: 1}}}}}}).Err()
	if err == nil || !strings.Contains(err.Error(), "tsproxy") || !strings.Contains(err.Error(), "positional") {
		t.Fatalf("alice's findAndModify with the positional $: %v, want the proxy's refusal", err)
	}
}
