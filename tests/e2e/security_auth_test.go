package e2e

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/tsproxy/tsproxy/proxy"
	"github.com/tsproxy/tsproxy/tests/backend"
)

// authMarker is a field value of every event the auth test writes, to
// look for in the proxy's logs.
const authMarker = "event-content-7f3a91"

// authOp is one command a client sends through the proxy, on a plain or a
// bucketed namespace.
type authOp struct {
	name string
	run  func(ctx context.Context, db *mongo.Database) error
}

// authOps are the commands tried with each kind of credentials: plain ones
// pass through, the bucketed ones are rewritten (insert: fill loads and
// bucket upserts; reads: aggregates on the bucket collection).
func authOps(events []sentEvent) []authOp {
	docs := make([]any, len(events))
	for i, e := range events {
		docs[i] = append(e.doc(), bson.E{Key: "note", Value: authMarker})
	}
	readings := func(db *mongo.Database) *mongo.Collection { return db.Collection("readings") }
	return []authOp{
		{"plain insert", func(ctx context.Context, db *mongo.Database) error {
			_, err := db.Collection("items").InsertOne(ctx, bson.D{{Key: "v", Value: 1}})
			return err
		}},
		{"plain find", func(ctx context.Context, db *mongo.Database) error {
			cur, err := db.Collection("items").Find(ctx, bson.D{})
			if err != nil {
				return err
			}
			return cur.All(ctx, &[]bson.D{})
		}},
		{"bucketed insert", func(ctx context.Context, db *mongo.Database) error {
			_, err := readings(db).InsertMany(ctx, docs)
			return err
		}},
		{"bucketed find", func(ctx context.Context, db *mongo.Database) error {
			cur, err := readings(db).Find(ctx, bson.D{{Key: "sensorId", Value: events[0].sensor}})
			if err != nil {
				return err
			}
			return cur.All(ctx, &[]bson.D{})
		}},
		{"bucketed count", func(ctx context.Context, db *mongo.Database) error {
			_, err := readings(db).CountDocuments(ctx, bson.D{})
			return err
		}},
		{"bucketed distinct", func(ctx context.Context, db *mongo.Database) error {
			return readings(db).Distinct(ctx, "sensorId", bson.D{}).Err()
		}},
		{"bucketed aggregate", func(ctx context.Context, db *mongo.Database) error {
			cur, err := readings(db).Aggregate(ctx, bson.A{bson.D{{Key: "$match", Value: bson.D{}}}})
			if err != nil {
				return err
			}
			return cur.All(ctx, &[]bson.D{})
		}},
		{"listCollections", func(ctx context.Context, db *mongo.Database) error {
			_, err := db.ListCollectionNames(ctx, bson.D{})
			return err
		}},
	}
}

// TestAuthPassesThrough runs the ferretdb command with a SCRAM user behind
// the proxy. A client without credentials, then one with a wrong password,
// get the upstream's authentication error for every command, rewritten
// ones included, and store nothing; a client with the right credentials
// writes and reads events; the proxy's logs at the default level hold
// neither the password nor event contents.
func TestAuthPassesThrough(t *testing.T) {
	t.Parallel()
	const user, pass = "tsproxy_app", "pw-Zq81x-never-in-logs"
	fdb := startFerretDB(t, backend.FerretDBOptions{User: user, Password: pass})
	db := uniqueDB(t)
	var logs syncBuffer
	p := startProxy(t, proxyOptions{
		yaml:        readingsRule(db, 100),
		upstreamURI: "mongodb://" + fdb.Addr + "/",
		edit: func(o *proxy.Options) {
			o.Logger = slog.New(slog.NewTextHandler(&logs, nil)) // the default level, info
		},
	})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("proxy log:\n%s", logs.String())
		}
	})
	ctx := ctxFor(t)
	events := genEvents(300, 4, 2, 61)
	for i := range events {
		events[i].value = 4242.125 + float64(i) // a value no log line would hold by chance
	}
	ops := authOps(events)

	// No credentials first, so that an unauthenticated client is the first
	// to make the proxy detect the upstream and load bucket fills.
	anon := connect(t, p.URI())
	for _, op := range ops {
		err := runOp(ctx, op, anon.Database(db))
		if !hasAuthError(err, 13, "requires authentication") {
			t.Errorf("no credentials, %s: want the upstream's Unauthorized error, got %v", op.name, err)
		}
	}
	bad := connect(t, fmt.Sprintf("mongodb://%s:wrong-%s@%s/?authSource=admin", user, pass, p.addr))
	for _, op := range ops {
		err := runOp(ctx, op, bad.Database(db))
		if !hasAuthError(err, 18, "Authentication failed") {
			t.Errorf("wrong password, %s: want the upstream's AuthenticationFailed error, got %v", op.name, err)
		}
	}

	good := connect(t, fmt.Sprintf("mongodb://%s:%s@%s/?authSource=admin", user, pass, p.addr))
	for _, op := range ops {
		if err := runOp(ctx, op, good.Database(db)); err != nil {
			t.Errorf("right credentials, %s: %v", op.name, err)
		}
	}
	n, err := good.Database(db).Collection("readings").CountDocuments(ctx, bson.D{})
	if err != nil || n != int64(len(events)) {
		t.Fatalf("events through the proxy: %d (%v), want %d: the refused clients' inserts must store nothing", n, err, len(events))
	}
	var got []bson.M
	cur, err := good.Database(db).Collection("readings").Find(ctx, bson.D{{Key: "value", Value: events[7].value}})
	if err != nil || cur.All(ctx, &got) != nil || len(got) != 1 || got[0]["_id"] != events[7].id {
		t.Fatalf("find of one event: %v %v", got, err)
	}
	// What is stored, read straight from the upstream with the same user.
	up := connect(t, fmt.Sprintf("mongodb://%s:%s@%s/?authSource=admin", user, pass, fdb.Addr))
	stored, err := up.Database(db).Collection("readings.buckets").Find(ctx, bson.D{})
	var buckets []bucketDoc
	if err == nil {
		err = stored.All(ctx, &buckets)
	}
	counted := 0
	for _, b := range buckets {
		counted += len(b.Events)
	}
	if err != nil || counted != len(events) {
		t.Fatalf("events stored in buckets: %d %v, want %d", counted, err, len(events))
	}
	if n, err := up.Database(db).Collection("readings").CountDocuments(ctx, bson.D{}); err != nil || n != 0 {
		t.Fatalf("documents in the plain collection of the rule's name: %d %v", n, err)
	}

	// Still refused after an authenticated client warmed the proxy's
	// caches (capabilities, bucket fills, index state).
	anon2 := connect(t, p.URI())
	for _, op := range ops {
		if err := runOp(ctx, op, anon2.Database(db)); !hasAuthError(err, 13, "requires authentication") {
			t.Errorf("no credentials after warm-up, %s: got %v", op.name, err)
		}
	}
	if n, _ := good.Database(db).Collection("readings").CountDocuments(ctx, bson.D{}); n != int64(len(events)) {
		t.Fatalf("events after the refused inserts: %d, want %d", n, len(events))
	}

	out := logs.String()
	for _, secret := range []string{pass, authMarker, "4242.125", "4249.125", events[3].id.Hex()} {
		if strings.Contains(out, secret) {
			t.Errorf("proxy log holds %q:\n%s", secret, out)
		}
	}
	t.Logf("proxy log at the default level: %d lines", strings.Count(out, "\n"))
}

// hasAuthError reports whether err is the server's error with code, or (a
// failed handshake) a driver error carrying the server's message.
func hasAuthError(err error, code int, msg string) bool {
	if err == nil {
		return false
	}
	var se mongo.ServerError
	if errors.As(err, &se) && se.HasErrorCode(code) {
		return true
	}
	return strings.Contains(err.Error(), msg)
}

// runOp runs one op with a bound of its own, so that a hang shows as
// that op's error rather than the whole test's timeout.
func runOp(ctx context.Context, op authOp, db *mongo.Database) error {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	return op.run(ctx, db)
}
