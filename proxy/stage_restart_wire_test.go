package proxy

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/upstream"
	"github.com/tsproxy/tsproxy/wire"
)

// TestRestartedGuestsStaging: a proxy that stopped with events
// staged and came back on the same address (its Stager tag) while
// another proxy holds the rule's writer lease. Its previous run's staging
// collections are neither its own (an earlier generation) nor, while it
// announces its tag again, a stopped proxy's: nobody freezes them, and
// every flush and read of the rule waits for them and fails.
func TestRestartedGuestsStaging(t *testing.T) {
	e, err := upstream.StartEmbedded(upstream.EmbeddedOptions{DataDir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	uri := e.LocalURI()
	named := func(id string) func(*Options) {
		return func(o *Options) { o.WriterID = id; o.WriterLease = 2 * time.Second }
	}
	t0 := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	ev := func(i int) bson.D {
		return bson.D{{Key: "ts", Value: t0.Add(time.Duration(i) * time.Second)}, {Key: "sensor", Value: "a"}}
	}

	// p2 holds the writer lease.
	_, addr2 := startWireProxy(t, stagedWireRule, uri, named("host/p2"))
	c2 := dialWire(t, addr2)
	wireInsert(t, c2, ev(0))
	if r := c2.cmd(bson.D{{Key: "tsproxyFlush", Value: 1}, {Key: "$db", Value: "admin"}}); !bsonOK(r) {
		t.Fatalf("flush: %s", r)
	}
	// p1 stages 5 events, then stops (its staging stays) ...
	s1a, addr1a := startWireProxy(t, stagedWireRule, uri, named("host/p1"))
	c1a := dialWire(t, addr1a)
	wireInsert(t, c1a, ev(1), ev(2), ev(3), ev(4), ev(5))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = s1a.Shutdown(ctx)
	time.Sleep(10 * time.Millisecond) // the next run's generation is later
	// ... and comes back on the same address, and stages again.
	s1b, addr1b := startWireProxy(t, stagedWireRule, uri, named("host/p1"))
	t.Logf("first run since %d, second run since %d", s1a.eng.Tier().Since(), s1b.eng.Tier().Since())
	c1b := dialWire(t, addr1b)
	wireInsert(t, c1b, ev(6))

	// It keeps taking inserts (on another connection) meanwhile.
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		w := dialWire(t, addr1b)
		for i := 7; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			body, _ := bson.Marshal(bson.D{{Key: "insert", Value: "readings"}, {Key: "documents", Value: bson.A{ev(1000 + i)}}, {Key: "$db", Value: "db"}})
			w.req++
			if _, err := w.nc.Write(wire.AppendMsg(nil, w.req, 0, 0, body)); err != nil {
				return
			}
			if _, _, err := w.read(20 * time.Second); err != nil {
				return
			}
		}
	}()
	began := time.Now()
	// A read on the holder merges first.
	r := c2.cmd(bson.D{{Key: "count", Value: "readings"}, {Key: "$db", Value: "db"}})
	if !bsonOK(r) {
		t.Errorf("a count on the lease holder failed after %s: %s", time.Since(began).Round(time.Millisecond), r.Lookup("errmsg"))
	}
	began = time.Now()
	r = c1b.cmd(bson.D{{Key: "tsproxyFlush", Value: 1}, {Key: "$db", Value: "admin"}})
	if !bsonOK(r) {
		t.Fatalf("flush on the restarted proxy failed after %s: %s", time.Since(began).Round(time.Millisecond), r.Lookup("errmsg"))
	}
	// Every event staged before the inserts that go on is there once:
	// the first run's five among them, merged, not dropped.
	r = c2.cmd(bson.D{{Key: "count", Value: "readings"}, {Key: "query", Value: bson.D{{Key: "ts", Value: bson.D{{Key: "$lte", Value: t0.Add(6 * time.Second)}}}}}, {Key: "$db", Value: "db"}})
	if n, _ := r.Lookup("n").AsInt64OK(); n != 7 {
		t.Fatalf("count of the events before the ongoing inserts: %s, want 7", r)
	}
}
