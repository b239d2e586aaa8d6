package e2e

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/tsproxy/tsproxy/tests/backend"
)

// Many proxies behind one TCP load balancer (HAProxy), drivers in
// load-balanced mode (loadBalanced=true): the issue "Scale out".

// fleet is n proxies with the same config behind HAProxy.
type fleet struct {
	proxies []*testProxy
	lb      *backend.HAProxy
}

func startFleet(t *testing.T, n int, po proxyOptions) *fleet {
	t.Helper()
	if _, err := backend.HAProxyBinary(); err != nil {
		if env.external {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	f := &fleet{}
	var addrs []string
	for i := 0; i < n; i++ {
		p := startProxy(t, po)
		f.proxies = append(f.proxies, p)
		addrs = append(addrs, p.addr)
	}
	lb, err := backend.StartHAProxy(addrs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lb.Close)
	f.lb = lb
	return f
}

// TestLoadBalancedReads: the Go driver and mongosh in load-balanced mode
// through HAProxy in front of three proxies: the handshake answers a
// serviceId, every connection lands on some proxy, and cursors of
// rewritten reads are read to their end with getMore (the driver pins a
// cursor to its connection, so its getMores reach the proxy that holds
// it).
func TestLoadBalancedReads(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	f := startFleet(t, 3, proxyOptions{yaml: readingsRule(db, 50)})
	base := time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC)
	var events []sentEvent
	for s := 0; s < 4; s++ {
		events = append(events, seriesBatch(fmt.Sprintf("s%d", s), base, 0, 300)...)
	}
	// Written through one proxy: on FerretDB one proxy at a time writes a
	// namespace (its writer lease).
	if _, err := connect(t, f.proxies[0].URI()).Database(db).Collection("readings").InsertMany(ctx, eventDocs(events)); err != nil {
		t.Fatal(err)
	}

	c := connect(t, f.lb.URI())
	var hello bson.M
	if err := c.Database("admin").RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&hello); err != nil {
		t.Fatal(err)
	}
	if hello["msg"] != "isdbgrid" || hello["hosts"] != nil || hello["setName"] != nil {
		t.Fatalf("hello through the balancer: %v", hello)
	}
	coll := c.Database(db).Collection("readings")
	// Sixteen readers at once spread their connections over the fleet;
	// each reads a series to its end in batches of 7.
	runClients(t, 16, func(i int) error {
		sensor := fmt.Sprintf("s%d", i%4)
		cur, err := coll.Find(ctx, bson.D{{Key: "sensorId", Value: sensor}}, options.Find().SetSort(bson.D{{Key: "ts", Value: 1}}).SetBatchSize(7))
		if err != nil {
			return err
		}
		n := 0
		for cur.Next(ctx) {
			var ev struct {
				TS time.Time `bson:"ts"`
			}
			if err := cur.Decode(&ev); err != nil {
				return err
			}
			if want := base.Add(time.Duration(n) * time.Second); !ev.TS.Equal(want) {
				return fmt.Errorf("%s event %d at %v, want %v", sensor, n, ev.TS, want)
			}
			n++
		}
		if err := cur.Err(); err != nil {
			return err
		}
		if n != 300 {
			return fmt.Errorf("%s: %d events read, want 300", sensor, n)
		}
		return nil
	})
	served := 0
	for _, p := range f.proxies {
		if p.srv.Stats().ClientConns > 0 {
			served++
		}
	}
	if served < 2 {
		t.Fatalf("the balancer sent every connection to %d proxy", served)
	}
	if n, err := coll.CountDocuments(ctx, bson.D{}); err != nil || n != int64(len(events)) {
		t.Fatalf("count through the balancer: %d, %v", n, err)
	}

	// mongosh, the Node.js driver inside it, in load-balanced mode (it
	// refuses a handshake without a serviceId).
	out := runMongosh(t, strings.TrimSuffix(f.lb.URI(), "/?loadBalanced=true"), fmt.Sprintf(`
const d = connect(process.env.TSPROXY_URI + "/%s?loadBalanced=true");
print("READ " + d.readings.find({sensorId: "s2"}).sort({ts: -1}).batchSize(11).toArray().length);
print("COUNT " + d.readings.countDocuments({sensorId: {$in: ["s0", "s3"]}}));
`, db))
	for _, want := range []string{"READ 300", "COUNT 600"} {
		if !strings.Contains(out, want) {
			t.Fatalf("mongosh through the balancer lacks %q:\n%s", want, out)
		}
	}
}

// TestCursorOnAnotherProxy: a getMore that reaches a proxy other than the
// one holding its cursor (a driver not in load-balanced mode behind a
// balancer, or a proxy that died) gets MongoDB's CursorNotFound, never
// another cursor's data; and in load-balanced mode a cursor whose proxy
// died ends with an error while the fleet goes on serving.
func TestCursorOnAnotherProxy(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	f := startFleet(t, 3, proxyOptions{yaml: readingsRule(db, 50)})
	base := time.Date(2026, 4, 2, 0, 0, 0, 0, time.UTC)
	events := seriesBatch("s", base, 0, 200)
	if _, err := connect(t, f.proxies[0].URI()).Database(db).Collection("readings").InsertMany(ctx, eventDocs(events)); err != nil {
		t.Fatal(err)
	}
	var first bson.Raw
	err := connect(t, f.proxies[0].URI()).Database(db).RunCommand(ctx, bson.D{{Key: "find", Value: "readings"}, {Key: "batchSize", Value: 5}}).Decode(&first)
	if err != nil {
		t.Fatal(err)
	}
	id := first.Lookup("cursor", "id").Int64()
	if id == 0 {
		t.Fatal("no cursor")
	}
	err = connectNoTimeout(t, f.proxies[1].URI()).Database(db).RunCommand(context.Background(), bson.D{{Key: "getMore", Value: id}, {Key: "collection", Value: "readings"}}).Err()
	var ce mongo.CommandError
	if !errors.As(err, &ce) || ce.Code != 43 {
		t.Fatalf("getMore of proxy 1's cursor on proxy 2: %v, want CursorNotFound (43)", err)
	}
	if err := connect(t, f.proxies[0].URI()).Database(db).RunCommand(ctx, bson.D{{Key: "killCursors", Value: "readings"}, {Key: "cursors", Value: bson.A{id}}}).Err(); err != nil {
		t.Fatal(err)
	}

	// Load-balanced: the proxy holding an open cursor dies.
	c := connect(t, f.lb.URI())
	coll := c.Database(db).Collection("readings")
	cur, err := coll.Find(ctx, bson.D{}, options.Find().SetBatchSize(5))
	if err != nil || !cur.Next(ctx) {
		t.Fatalf("find through the balancer: %v %v", err, cur.Err())
	}
	var holder *testProxy
	for _, p := range f.proxies {
		if p.srv.Stats().Cursors > 0 {
			holder = p
		}
	}
	if holder == nil {
		t.Fatalf("no proxy holds the balanced cursor")
	}
	sctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_ = holder.srv.Shutdown(sctx) // closes its connections at once
	cancel()
	n := 1
	for cur.Next(ctx) {
		n++
	}
	if cur.Err() == nil {
		t.Fatalf("the cursor of a dead proxy read on to %d events without an error", n)
	}
	t.Logf("cursor of the dead proxy: %d events, then %v", n, cur.Err())
	// The fleet serves on: new connections go to the living proxies.
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, err := coll.CountDocuments(ctx, bson.D{})
		if err == nil && got == int64(len(events)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("count through the balancer after a proxy died: %d, %v\n%s", got, err, f.lb.Output())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestRetryOnAnotherProxy: a driver retries a write whose reply it lost
// on a new connection, which a load balancer may give to another proxy.
// The same retryable insert (same lsid and txnNumber) sent to one proxy,
// then to another: both answer it, and its events are stored once. Each
// proxy staged the write into collections of its own; the merge knows
// the write by the _ids derived from its session.
func TestRetryOnAnotherProxy(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	rule := stagedRule(db, 100, "1h")
	a, b := startProxy(t, proxyOptions{yaml: rule}), startProxy(t, proxyOptions{yaml: rule})
	events := seriesBatch("s", time.Date(2026, 4, 3, 0, 0, 0, 0, time.UTC), 0, 25)
	body := bson.D{{Key: "insert", Value: "readings"}, {Key: "ordered", Value: true}, {Key: "lsid", Value: newLsid(t)},
		{Key: "txnNumber", Value: int64(1)}, {Key: "$db", Value: db}}
	for i, p := range []*testProxy{a, b} {
		reply, err := dialRawClient(t, p.addr).run(body, docsOf(events))
		if err != nil || reply.Lookup("ok").Double() != 1 || reply.Lookup("n").Int32() != 25 {
			t.Fatalf("attempt %d: %s %v", i+1, reply, err)
		}
	}
	// A third attempt, on the first proxy again, after a merge.
	flush(t, ctx, connect(t, a.URI()), 1)
	if reply, err := dialRawClient(t, a.addr).run(body, docsOf(events)); err != nil || reply.Lookup("n").Int32() != 25 {
		t.Fatalf("attempt 3: %s %v", reply, err)
	}
	stored := storedIDs(t, ctx, db)
	for _, e := range events {
		if stored[e.id] != 1 {
			t.Fatalf("event %v stored %d times, want once", e.id, stored[e.id])
		}
	}
	if len(stored) != len(events) {
		t.Fatalf("%d events stored, want %d", len(stored), len(events))
	}
	for _, p := range []*testProxy{a, b} {
		if n, err := connect(t, p.URI()).Database(db).Collection("readings").CountDocuments(ctx, bson.D{}); err != nil || n != 25 {
			t.Fatalf("count through %s: %d, %v", p.addr, n, err)
		}
	}
}

// TestLoadBalancedWrites: 16 clients in load-balanced mode ingest one
// rule through HAProxy in front of three proxies (processes of their
// own), and each proxy is killed (SIGKILL) and restarted in turn while
// they write: every proxy takes inserts (no writer lease on the ingest
// path), every acknowledged event is stored exactly once, and an
// unacknowledged batch whole or not at all. The merges of the rule move
// to another proxy when the one holding its lease dies, and the staging
// collections of a dead proxy are taken over once its announcement
// lapsed.
func TestLoadBalancedWrites(t *testing.T) {
	t.Parallel()
	if _, err := backend.HAProxyBinary(); err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t)
	db := uniqueDB(t)
	rule := stagedRule(db, 200, "500ms")
	pps := startProxyProcesses(t, 3, rule)
	var addrs []string
	for _, pp := range pps {
		addrs = append(addrs, pp.addr)
	}
	lb, err := backend.StartHAProxy(addrs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lb.Close)
	colls := loadCollections(t, db, 16, 10*time.Second, func(int) string { return lb.URI() })
	stop := make(chan struct{})
	done := make(chan [][]batchOutcome)
	base := time.Date(2026, 10, 3, 0, 0, 0, 0, time.UTC)
	go func() { done <- loadClients(ctx, colls, []int{1, 10, 1, 50, 5}, base, stop) }()
	for _, pp := range pps {
		time.Sleep(1500 * time.Millisecond)
		pp.kill()
		time.Sleep(500 * time.Millisecond)
		pp.start()
	}
	time.Sleep(1500 * time.Millisecond)
	close(stop)
	outcomes := <-done
	stored := settleAndCheck(t, ctx, db, "3 proxies behind HAProxy, 16 clients, each proxy killed and restarted", pps, outcomes)
	n, err := connect(t, lb.URI()).Database(db).Collection("readings").CountDocuments(ctx, bson.D{})
	if err != nil || n != int64(len(stored)) {
		t.Fatalf("count through the balancer: %d (%v), want %d", n, err, len(stored))
	}
	// What the proxies cost, merges included (README, Scale out).
	var cpu time.Duration
	for _, pp := range pps {
		cpu += pp.cpuTime()
	}
	t.Logf("the three proxies used %v of CPU for %d stored events: %.1f µs an event", cpu.Round(time.Millisecond), len(stored), float64(cpu.Microseconds())/float64(len(stored)))
}
