package proxy

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// TestConcurrentStagedInsertsReadsFlushes: clients insert one event
// at a time (combined upstream), each reads its own series back now and
// then (read-your-writes), another flushes; every acknowledged event is
// counted once.
func TestConcurrentStagedInsertsReadsFlushes(t *testing.T) {
	s, addr := startWireProxy(t, `rules:
  - namespace: db.readings
    timeField: ts
    metaField: sensor
    bucket:
      span: 1h
      maxEvents: 50
    mergeAfter: 200ms
`, "", nil)
	const clients, per = 8, 150
	t0 := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	var wg sync.WaitGroup
	var stop atomic.Bool
	errs := make(chan string, clients+1)
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := dialWire(t, addr)
			series := fmt.Sprintf("s%d", i)
			for j := 0; j < per; j++ {
				r := c.cmd(bson.D{{Key: "insert", Value: "readings"}, {Key: "documents", Value: bson.A{bson.D{{Key: "ts", Value: t0.Add(time.Duration(j) * time.Second)}, {Key: "sensor", Value: series}}}}, {Key: "$db", Value: "db"}})
				if n, _ := r.Lookup("n").AsInt64OK(); n != 1 {
					errs <- fmt.Sprintf("%s insert %d: %s", series, j, r)
					return
				}
				if j%7 == 6 {
					r := c.cmd(bson.D{{Key: "count", Value: "readings"}, {Key: "query", Value: bson.D{{Key: "sensor", Value: series}}}, {Key: "$db", Value: "db"}})
					if n, _ := r.Lookup("n").AsInt64OK(); n != int64(j+1) {
						errs <- fmt.Sprintf("%s read after %d acknowledged inserts counted %d: %s", series, j+1, n, r)
						return
					}
				}
			}
		}()
	}
	var fwg sync.WaitGroup
	fwg.Add(1)
	go func() {
		defer fwg.Done()
		c := dialWire(t, addr)
		for !stop.Load() {
			if r := c.cmd(bson.D{{Key: "tsproxyFlush", Value: 1}, {Key: "$db", Value: "admin"}}); !bsonOK(r) {
				errs <- fmt.Sprintf("flush: %s", r)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	wg.Wait()
	stop.Store(true)
	fwg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	c := dialWire(t, addr)
	if r := c.cmd(bson.D{{Key: "tsproxyFlush", Value: 1}, {Key: "$db", Value: "admin"}}); !bsonOK(r) {
		t.Fatalf("flush: %s", r)
	}
	if n := wireCount(t, c); n != clients*per {
		t.Fatalf("count %d, want %d", n, clients*per)
	}
	sh, riders := s.SharedInserts()
	t.Logf("shared inserts: %d, riders %d", sh, riders)
}
