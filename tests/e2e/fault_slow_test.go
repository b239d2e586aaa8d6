package e2e

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// heapAfterGC is the live heap of the test process (proxy, driver and
// embedded upstream together) after a full collection.
func heapAfterGC() (uint64, int) {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc, runtime.NumGoroutine()
}

// TestFaultSlowUpstream: with the upstream made slow by
// a relay that holds every reply back, a client's timeout (context
// deadline, the driver's CSOT) ends its operation on time, reads and
// writes alike, and maxTimeMS reaches the upstream through the rewrite;
// many timed-out operations leave no connection, goroutine or memory
// behind once the clients go away.
//
// Not parallel: the heap is measured for the whole test process, and a
// parallel test (large events above all) would swamp the figure.
func TestFaultSlowUpstream(t *testing.T) {
	db := uniqueDB(t)
	r := newRelay(t, upstreamAddr(t))
	p := startProxy(t, proxyOptions{yaml: readingsRule(db, 1000), upstreamURI: r.URI()})
	ctx := ctxFor(t)
	c := connectNoTimeout(t, p.URI())
	coll := c.Database(db).Collection("readings")
	// Two series of 1,000 events in one window each: two complete buckets.
	base := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	sent := append(seriesEvents(1000, "sensor-00", base), seriesEvents(1000, "sensor-01", base)...)
	if _, err := coll.InsertMany(ctx, docsOf(sent)); err != nil {
		t.Fatal(err)
	}

	// maxTimeMS goes upstream with a rewritten read: 1 ms is not enough
	// for the upstream to unwind 2,000 events; a generous one is.
	res := c.Database(db).RunCommand(ctx, bson.D{{Key: "count", Value: "readings"}, {Key: "query", Value: bson.D{{Key: "value", Value: bson.D{{Key: "$gte", Value: 0}}}}}, {Key: "maxTimeMS", Value: 1}})
	var ce mongo.CommandError
	if err := res.Err(); errors.As(err, &ce) && ce.Code == 50 {
		t.Logf("count with maxTimeMS 1: %v", err)
	} else {
		// FerretDB checks maxTimeMS between batches; a count this small may
		// finish first. Then it must at least be right.
		var out struct{ N int64 }
		if err := res.Decode(&out); err != nil || out.N != int64(len(sent)) {
			t.Fatalf("count with maxTimeMS 1: %+v, %v; want MaxTimeMSExpired or %d", out, err, len(sent))
		}
		t.Logf("count with maxTimeMS 1 finished within it: n=%d", out.N)
	}
	var out struct{ N int64 }
	err := c.Database(db).RunCommand(ctx, bson.D{{Key: "count", Value: "readings"}, {Key: "maxTimeMS", Value: 30000}}).Decode(&out)
	if err != nil || out.N != int64(len(sent)) {
		t.Fatalf("count with maxTimeMS 30s: %d, %v", out.N, err)
	}

	heap0, gor0 := heapAfterGC()
	const delay = 2 * time.Second
	const budget = 300 * time.Millisecond
	// 16 clients, each 5 operations with a 300 ms budget: every one ends
	// within its budget (plus scheduling slack), none waits for the reply.
	// They connect before the upstream slows down, as running apps do.
	const clients, ops = 16, 5
	slowColls := make([]*mongo.Client, clients)
	for i := range slowColls {
		slowColls[i] = connectNoTimeout(t, p.URI())
		if err := slowColls[i].Ping(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
	r.SetDelay(delay)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var worst time.Duration
	var timedOut, succeeded int
	var ackedEvents []sentEvent
	errs := make(chan error, clients*ops)
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			cc := slowColls[i].Database(db).Collection("readings")
			for k := 0; k < ops; k++ {
				octx, cancel := context.WithTimeout(context.Background(), budget)
				start := time.Now()
				var err error
				var batch []sentEvent
				switch k % 3 {
				case 0:
					batch = seriesEvents(20, "slow", time.Date(2026, 12, 1, i, k, 0, 0, time.UTC))
					_, err = cc.InsertMany(octx, docsOf(batch))
				case 1:
					err = cc.FindOne(octx, bson.D{{Key: "sensorId", Value: "sensor-01"}}).Err()
				default:
					_, err = cc.CountDocuments(octx, bson.D{})
				}
				el := time.Since(start)
				cancel()
				mu.Lock()
				worst = max(worst, el)
				if err == nil {
					succeeded++
					ackedEvents = append(ackedEvents, batch...)
				} else if errors.Is(err, context.DeadlineExceeded) || mongo.IsTimeout(err) {
					if timedOut == 0 {
						t.Logf("first timeout after %v: %v", el, err)
					}
					timedOut++
				} else {
					errs <- err
				}
				mu.Unlock()
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("an operation failed other than by its timeout: %v", err)
	}
	t.Logf("slow upstream (+%v per reply): %d operations with a %v budget: %d timed out, %d succeeded, slowest returned after %v",
		delay, clients*ops, budget, timedOut, succeeded, worst.Round(time.Millisecond))
	if worst > budget+time.Second {
		t.Fatalf("an operation with a %v budget returned after %v", budget, worst)
	}
	if timedOut == 0 {
		t.Fatal("no operation timed out against a slow upstream")
	}

	// The upstream recovers: the clients go away; everything is released
	// once the held-back replies have drained.
	r.SetDelay(0)
	for _, cl := range slowColls {
		_ = cl.Disconnect(ctx)
	}
	_ = c.Disconnect(ctx)
	released := waitReleased(t, p, r, "after the slow period")
	heap1, gor1 := heapAfterGC()
	t.Logf("released %v after the delay ended; heap %d -> %d KiB, goroutines %d -> %d", released.Round(time.Millisecond), heap0>>10, heap1>>10, gor0, gor1)
	if heap1 > heap0+64<<20 {
		t.Fatalf("the heap grew by %d MiB over a slow period", (heap1-heap0)>>20)
	}
	if gor1 > gor0+10 {
		t.Fatalf("%d goroutines after the slow period, %d before", gor1, gor0)
	}

	// Nothing acknowledged is lost; timed-out inserts are whole or absent.
	got := storedIDs(t, ctx, db)
	for _, e := range append(sent, ackedEvents...) {
		if got[e.id] != 1 {
			t.Fatalf("acknowledged event %v stored %d times", e.id, got[e.id])
		}
	}
	for id, n := range got {
		if n != 1 {
			t.Fatalf("event %v stored %d times", id, n)
		}
	}
}
