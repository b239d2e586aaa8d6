package e2e

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/proxy"
)

// TestRetention: with expireAfter, buckets and rollup documents whose
// window ended before now - expireAfter disappear (the proxy's sweeper on
// FerretDB, which has no TTL indexes; the TTL monitor on MongoDB), and
// nothing newer is touched.
func TestRetention(t *testing.T) {
	ctx := ctxFor(t)
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: readingsRule(db, 50) + "    rollups: [1h]\n    expireAfter: 2h\n    sweepInterval: 200ms\n"})
	coll := connect(t, p.URI()).Database(db).Collection("readings")

	now := time.Now().UTC()
	var old, recent []any
	for i := 0; i < 300; i++ {
		sensor := []string{"a", "b", "c"}[i%3]
		// old: windows ending by now-4h (expired); recent: the last 30 min.
		old = append(old, bson.D{{Key: "ts", Value: now.Add(-8*time.Hour + time.Duration(i)*36*time.Second)}, {Key: "sensorId", Value: sensor}, {Key: "value", Value: 1.0}})
		recent = append(recent, bson.D{{Key: "ts", Value: now.Add(-30*time.Minute + time.Duration(i)*5*time.Second)}, {Key: "sensorId", Value: sensor}, {Key: "value", Value: 2.0}})
	}
	for _, batch := range [][]any{old[:150], recent[:150], old[150:], recent[150:]} {
		res, err := coll.InsertMany(ctx, batch)
		if err != nil || len(res.InsertedIDs) != len(batch) {
			t.Fatalf("insert: %v", err)
		}
	}

	buckets := direct(t).Database(db).Collection("readings.buckets")
	rollups := direct(t).Database(db).Collection("readings.rollup_1h")
	cutoff := now.Add(-3 * time.Hour) // expireAfter + span
	waitFor := 15 * time.Second
	if env.external {
		waitFor = 3 * time.Minute // MongoDB's TTL monitor runs every 60s
	}
	deadline := time.Now().Add(waitFor)
	for {
		nb, err := buckets.CountDocuments(ctx, bson.D{{Key: "start", Value: bson.D{{Key: "$lt", Value: cutoff}}}})
		if err != nil {
			t.Fatal(err)
		}
		nr, err := rollups.CountDocuments(ctx, bson.D{{Key: "start", Value: bson.D{{Key: "$lt", Value: cutoff}}}})
		if err != nil {
			t.Fatal(err)
		}
		if nb == 0 && nr == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %d expired buckets and %d expired rollup documents remain", waitFor, nb, nr)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// Everything recent is still there, events and rollups alike.
	n, err := coll.CountDocuments(ctx, bson.D{})
	if err != nil || n != int64(len(recent)) {
		t.Fatalf("events left: %d, %v; want the %d recent ones", n, err, len(recent))
	}
	cur, err := rollups.Find(ctx, bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	var docs []rollupDoc
	if err := cur.All(ctx, &docs); err != nil {
		t.Fatal(err)
	}
	var counted int64
	for _, d := range docs {
		counted += d.Count
		if d.Sum["value"] != 2*float64(d.Count) {
			t.Fatalf("rollup %v of %s: sum %v for %d recent events", d.Start, d.Meta, d.Sum["value"], d.Count)
		}
	}
	if counted != int64(len(recent)) {
		t.Fatalf("rollups count %d events, want %d", counted, len(recent))
	}

	// A late event for an expired window is stored, then swept again; the
	// recent series keep their buckets and fills.
	late := bson.D{{Key: "ts", Value: now.Add(-6 * time.Hour)}, {Key: "sensorId", Value: "a"}, {Key: "value", Value: 1.0}}
	if _, err := coll.InsertOne(ctx, late); err != nil {
		t.Fatal(err)
	}
	more := bson.D{{Key: "ts", Value: now.Add(-time.Minute)}, {Key: "sensorId", Value: "a"}, {Key: "value", Value: 2.0}}
	if _, err := coll.InsertOne(ctx, more); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(waitFor)
	for {
		n, err := coll.CountDocuments(ctx, bson.D{})
		if err != nil {
			t.Fatal(err)
		}
		if n == int64(len(recent))+1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("events: %d, want %d once the late one is swept", n, len(recent)+1)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The event-id index entries of the swept buckets go with them.
	name := idIndexCollection(t, ctx, db)
	if name == "" && !env.external {
		t.Fatal("no event-id index: the staged merges write one")
	}
	if name != "" {
		index := direct(t).Database(db).Collection(name)
		for {
			n, err := index.CountDocuments(ctx, bson.D{{Key: "s", Value: bson.D{{Key: "$lt", Value: cutoff}}}})
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d event-id index entries of swept buckets left", n)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// TestShardKeyNotSharded: shardKey on an upstream that is not a mongos
// (FerretDB, or a replica set) logs once and stores events as usual.
func TestShardKeyNotSharded(t *testing.T) {
	if env.external {
		t.Skip("checks the embedded upstream's answer; a mongos would shard")
	}
	ctx := ctxFor(t)
	db := uniqueDB(t)
	var logs syncBuffer
	p := startProxy(t, proxyOptions{yaml: readingsRule(db, 100) + "    shardKey: true\n", edit: func(o *proxy.Options) {
		o.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}})
	coll := connect(t, p.URI()).Database(db).Collection("readings")
	base := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	for i := 0; i < 3; i++ {
		if _, err := coll.InsertOne(ctx, bson.D{{Key: "ts", Value: base.Add(time.Duration(i) * time.Second)}, {Key: "sensorId", Value: "a"}, {Key: "value", Value: 1.0}}); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := coll.CountDocuments(ctx, bson.D{}); err != nil || n != 3 {
		t.Fatalf("count %d, %v", n, err)
	}
	if got := strings.Count(logs.String(), "shardKey: the upstream is not a mongos"); got != 1 {
		t.Fatalf("logged %d times, want once:\n%s", got, logs.String())
	}
}

// TestRetentionOneSweeper: three proxies on one upstream run a rule's
// retention, and one of them sweeps at a time (the holder of the rule's
// retention lease); when it is killed, another sweeps within seconds.
func TestRetentionOneSweeper(t *testing.T) {
	if env.external {
		t.Skip("MongoDB expires documents with its TTL index: no proxy sweeps")
	}
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	yaml := readingsRule(db, 50) + "    expireAfter: 2h\n    sweepInterval: 200ms\n    mergeAfter: 200ms\n"
	pps := startProxyProcesses(t, 3, yaml)
	buckets := direct(t).Database(db).Collection("readings.buckets")
	now := time.Now().UTC()
	// sweeps counts each live proxy's sweeps so far.
	sweeps := func() []int {
		n := make([]int, len(pps))
		for i, pp := range pps {
			if pp.cmd != nil {
				n[i] = strings.Count(pp.log.String(), "retention: expired documents deleted")
			}
		}
		return n
	}
	// expire inserts expired events through p and waits until they are
	// swept: no bucket left, and some live proxy swept since the insert.
	// It returns the proxies that swept. (The events reach buckets only
	// once the rule's writer-lease holder merged them, which after a kill
	// may take a lease term: a bucket count of 0 alone can be "not merged
	// yet".)
	expire := func(p *proxyProcess, round int) []int {
		t.Helper()
		before := sweeps()
		coll := connect(t, p.URI()).Database(db).Collection("readings")
		var old []any
		for i := 0; i < 60; i++ {
			old = append(old, bson.D{{Key: "ts", Value: now.Add(-8*time.Hour + time.Duration(round*60+i)*time.Second)}, {Key: "sensorId", Value: "a"}, {Key: "value", Value: 1.0}})
		}
		if _, err := coll.InsertMany(ctx, old); err != nil {
			t.Fatal(err)
		}
		if _, err := coll.CountDocuments(ctx, bson.D{}); err != nil {
			t.Fatalf("count before the sweep: %v", err)
		}
		deadline := time.Now().Add(40 * time.Second)
		for {
			nb, err := buckets.CountDocuments(ctx, bson.D{})
			if err != nil {
				t.Fatal(err)
			}
			var swept []int
			for i, n := range sweeps() {
				if n > before[i] {
					swept = append(swept, i)
				}
			}
			if nb == 0 && len(swept) > 0 {
				return swept
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: %d expired buckets left after 40s, proxies that swept %v", round, nb, swept)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	swept := expire(pps[0], 0)
	if len(swept) != 1 {
		t.Fatalf("proxies that swept: %v, want one", swept)
	}
	owner := swept[0]
	for round := 1; round <= 4; round++ {
		if again := expire(pps[(owner+1)%3], round); len(again) != 1 || again[0] != owner {
			t.Fatalf("round %d: proxies that swept: %v, want only %d", round, again, owner)
		}
	}
	t0 := time.Now()
	pps[owner].kill()
	next := expire(pps[(owner+1)%3], 5)
	if len(next) != 1 || next[0] == owner {
		t.Fatalf("after proxy %d was killed: proxies that swept: %v, want one other", owner, next)
	}
	t.Logf("proxy %d swept; killed; proxy %d swept %v later", owner, next[0], time.Since(t0).Round(100*time.Millisecond))
}
