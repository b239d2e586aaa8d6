package e2e

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/tsproxy/tsproxy/tests/backend"
)

// ownUpstream starts an upstream of the test's own, of the run's kind (the
// embedded one when the run's upstream is a real MongoDB; a new database of
// the run's cluster on postgresql), stopped at the end of the test.
func ownUpstream(t testing.TB) *backend.Upstream {
	t.Helper()
	kind := cmp.Or(env.kind, backend.KindEmbedded)
	up, err := backend.Start(kind, backend.Options{Postgres: env.pg})
	if err != nil {
		t.Fatalf("start a %s upstream: %v", kind, err)
	}
	t.Cleanup(up.Close)
	return up
}

// upstreamKills is how often TestFaultUpstreamRestart crashes the upstream.
const upstreamKills = 5

// TestFaultUpstreamRestart: the upstream (a FerretDB of
// the test's own, of the run's kind) is killed and started again on the
// same data and port, upstreamKills times, while 16 clients insert (half
// of them retrying writes). Clients get prompt errors
// (none waits past its timeout), the proxy reconnects by itself, writes
// succeed after the restart, nothing acknowledged is lost or doubled, and
// an unacknowledged batch (one bucket write) is stored whole or not at
// all.
// It runs with the rule's ingest mode as the upstream picks it (staged on
// FerretDB) and with direct bucket writes.
func TestFaultUpstreamRestart(t *testing.T) {
	t.Parallel()
	for _, ingest := range []string{"auto", "direct"} {
		t.Run(ingest, func(t *testing.T) {
			t.Parallel()
			upstreamRestarts(t, ingest)
		})
	}
}

func upstreamRestarts(t *testing.T, ingest string) {
	up := ownUpstream(t)
	addr := up.Addr()
	db := uniqueDB(t)
	rule := fmt.Sprintf(`rules:
  - namespace: %s.readings
    timeField: ts
    metaField: sensorId
    bucket:
      span: 1h
      maxEvents: 100
      insertThreshold: 50
    aggregates: [value]
    ingest: %s
`, db, ingest)
	p := startProxy(t, proxyOptions{yaml: rule, upstreamURI: up.ProxyURI()})
	ctx := ctxFor(t)

	const clients = 16
	const opTimeout = 15 * time.Second
	colls := make([]*mongo.Collection, clients)
	for i := range colls {
		// Half retry writes (the default), half do not.
		c := connectNoTimeout(t, fmt.Sprintf("%s?retryWrites=%v", p.URI(), i%2 == 0))
		colls[i] = c.Database(db).Collection("readings")
	}
	stop := make(chan struct{})
	done := make(chan [][]batchOutcome)
	var slowest time.Duration
	var slowMu sync.Mutex
	base := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	go func() {
		// Small batches with a pause: many inserts in flight at each
		// kill, without piling up more events than the check can read.
		done <- runLoad(context.Background(), colls, loadOptions{sizes: []int{1, 5, 1, 10, 2}, base: base, stop: stop, timeout: opTimeout, pause: 20 * time.Millisecond, took: func(d time.Duration) {
			slowMu.Lock()
			slowest = max(slowest, d)
			slowMu.Unlock()
		}})
	}()

	// Five crashes: the upstream is killed at a random point of the load
	// (SIGKILL of the ferretdb process), stays down half a second, and is
	// started again on the same data and port.
	var stoppedAt, restartedAt time.Time
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 11))
	for i := 0; i < upstreamKills; i++ {
		time.Sleep(500*time.Millisecond + time.Duration(rng.Int64N(int64(time.Second))))
		stoppedAt = time.Now()
		up.Kill()
		time.Sleep(500 * time.Millisecond)
		if err := up.Restart(); err != nil {
			t.Fatalf("restart the upstream (kill %d): %v", i+1, err)
		}
		restartedAt = time.Now()
	}
	// How long the restarted upstream itself takes to take a write, for
	// comparison with the first write acknowledged through the proxy.
	upReady := make(chan time.Duration, 1)
	go func() {
		c, err := mongo.Connect(options.Client().ApplyURI("mongodb://" + addr + "/").SetTimeout(20 * time.Second))
		if err != nil {
			upReady <- -1
			return
		}
		defer c.Disconnect(context.Background())
		_, err = c.Database(db).Collection("probe").InsertOne(context.Background(), bson.D{{Key: "x", Value: 1}})
		if err != nil {
			upReady <- -1
			return
		}
		upReady <- time.Since(restartedAt)
	}()
	// And a new client of the proxy.
	proxyReady := make(chan time.Duration, 1)
	go func() {
		c, err := mongo.Connect(options.Client().ApplyURI(p.URI()).SetTimeout(20 * time.Second))
		if err != nil {
			proxyReady <- -1
			return
		}
		defer c.Disconnect(context.Background())
		_, err = c.Database(db).Collection("readings").InsertOne(context.Background(), seriesEvents(1, "fresh", base)[0].doc())
		if err != nil {
			t.Logf("new client's insert: %v", err)
			proxyReady <- -1
			return
		}
		proxyReady <- time.Since(restartedAt)
	}()
	time.Sleep(3 * time.Second)
	close(stop)
	outcomes := <-done
	t.Logf("the restarted upstream took a direct write %v after it started, a new client's write through the proxy %v after", (<-upReady).Round(time.Millisecond), (<-proxyReady).Round(time.Millisecond))

	var firstAfter time.Time
	failed := 0
	var slowestErr time.Duration
	kinds := map[string]int{}
	for _, cl := range outcomes {
		for _, b := range cl {
			if !b.acked {
				failed++
				slowestErr = max(slowestErr, b.took)
				msg := b.err.Error()
				if i := strings.Index(msg, ")"); i > 0 && strings.HasPrefix(msg, "connection(") {
					msg = msg[i+1:]
				}
				kinds[msg[:min(len(msg), 90)]]++
			}
			if b.acked && b.at.After(restartedAt) && (firstAfter.IsZero() || b.at.Before(firstAfter)) {
				firstAfter = b.at
			}
		}
	}
	for k, n := range kinds {
		t.Logf("%4d × %s", n, k)
	}
	t.Logf("proxy after the load: %+v", p.srv.Stats())
	if firstAfter.IsZero() {
		t.Fatal("no insert was acknowledged after the upstream restarted")
	}
	if slowest > opTimeout+2*time.Second {
		t.Fatalf("an insert with a %v timeout returned after %v", opTimeout, slowest)
	}

	// This test's own upstream, not the shared one: settle the proxy's
	// staging tier (when the rule stages) by hand.
	if err := flushAt(p.addr); err != nil {
		t.Fatalf("flush: %v", err)
	}
	stored := storedIDsIn(t, ctx, connect(t, up.URI()), db)
	f := checkOutcomes(t, stored, outcomes)
	t.Logf("%d upstream kills under 16 clients (ingest %s): acknowledged %d, found %d; unacknowledged %d (%d batches failed), found %d (partial batches %d); duplicates %d; slowest insert %v, slowest failure %v; upstream down %v each time; first ack %v after the last restart (%v after the last kill)",
		upstreamKills, ingest, f.acked, f.ackedFound, f.unacked, failed, f.unackedFound, f.partial, f.dups, slowest.Round(time.Millisecond), slowestErr.Round(time.Millisecond),
		restartedAt.Sub(stoppedAt).Round(time.Millisecond), firstAfter.Sub(restartedAt).Round(time.Millisecond), firstAfter.Sub(stoppedAt).Round(time.Millisecond))
	if f.dups != 0 || f.ackedFound != f.acked || f.partial != 0 {
		t.Fatalf("after the upstream restart: %+v", f)
	}
	// The same clients work after the restart.
	extra := seriesEvents(10, "after", base)
	if _, err := colls[1].InsertMany(ctx, docsOf(extra)); err != nil {
		t.Fatalf("insert after the restart: %v", err)
	}
	n, err := colls[1].CountDocuments(ctx, bson.D{{Key: "sensorId", Value: "after"}})
	if err != nil || n != 10 {
		t.Fatalf("read after the restart: %d, %v", n, err)
	}
}
