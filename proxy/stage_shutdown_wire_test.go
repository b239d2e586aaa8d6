package proxy

import (
	"context"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// TestShutdownWithInsertWaitingForRoom: Shutdown(ctx) returns soon
// after ctx ends even when a client's staged insert waits for room in
// staging (maxStaged). Shutdown stops the background mergers first, so
// nothing makes room any more; the waiting insert must not hold Shutdown
// for its whole wait (maxTimeMS, or a minute).
func TestShutdownWithInsertWaitingForRoom(t *testing.T) {
	s, addr := startWireProxy(t, stagedWireRule+"    maxStaged: 1000\n", "", nil)
	// The merges are behind (here: stopped, as Shutdown stops them first).
	s.eng.StopLoops()
	c := dialWire(t, addr)
	t0 := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	docs := bson.A{}
	for i := 0; i < 1000; i++ {
		docs = append(docs, bson.D{{Key: "ts", Value: t0.Add(time.Duration(i) * time.Second)}, {Key: "sensor", Value: "a"}})
	}
	r := c.cmd(bson.D{{Key: "insert", Value: "readings"}, {Key: "documents", Value: docs}, {Key: "$db", Value: "db"}})
	if n, _ := r.Lookup("n").AsInt64OK(); n != 1000 {
		t.Fatalf("insert: %s", r)
	}
	// The next insert waits for room (up to its maxTimeMS: 20 s).
	w := dialWire(t, addr)
	w.cmd(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}})
	w.send(0, bson.D{{Key: "insert", Value: "readings"}, {Key: "documents", Value: bson.A{bson.D{{Key: "ts", Value: t0}, {Key: "sensor", Value: "b"}}}},
		{Key: "maxTimeMS", Value: 20000}, {Key: "$db", Value: "db"}})
	time.Sleep(300 * time.Millisecond)

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	began := time.Now()
	done := make(chan struct{})
	go func() { _ = s.Shutdown(ctx); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatalf("Shutdown with a 1s deadline still running after %s (a staged insert waits for room that nothing makes)", time.Since(began).Round(time.Millisecond))
	}
}
