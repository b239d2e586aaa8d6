package e2e

import (
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tsproxy/tsproxy/tests/backend"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// thousandConns is how many client connections TestThousandConnections
// holds open at once; every writerEvery-th of them also writes and reads
// an event (FerretDB takes tens of milliseconds for each on a busy
// machine; the rest do hello and ping).
const (
	thousandConns = 1000
	writerEvery   = 10
)

// TestThousandConnections holds 1,000 client connections open through one
// proxy, each used (hello and ping, and on every tenth a bucketed insert of
// one event and a find of it), then idle; it measures what the proxy holds per idle connection
// (goroutines, Go heap, RSS), checks every connection still answers, that
// every event is stored, and that closing them all gives the goroutines
// and the proxy's connection count back.
//
// The proxy runs in the test process, with the ferretdb command as its
// upstream in a process of its own, so the deltas are the proxy's plus
// the test's raw client sockets (no goroutine, a few hundred bytes each).
// Not parallel: the deltas must not include other tests' work.
func TestThousandConnections(t *testing.T) {
	if testing.Short() {
		t.Skip("1,000 connections: not in -short")
	}
	fdb := startFerretDB(t, backend.FerretDBOptions{})
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: readingsRule(db, 1000), upstreamURI: "mongodb://" + fdb.Addr + "/"})
	warm := dialRaw(t, p.addr)
	useConn(t, warm, db, -1)

	before := measure(t)
	conns := make([]*rawConn, thousandConns)
	start := time.Now()
	for i := range conns {
		conns[i] = dialRaw(t, p.addr)
		useConn(t, conns[i], db, i)
	}
	used := time.Since(start)
	waitConnections(t, p, thousandConns+1)
	after := measure(t)

	// Every connection still answers after the others were opened.
	for _, c := range conns {
		c.ping()
	}
	counter := connect(t, p.URI())
	n, err := counter.Database(db).Collection("readings").CountDocuments(ctxFor(t), bson.D{})
	if want := int64(thousandConns/writerEvery + 1); err != nil || n != want {
		t.Fatalf("events stored: %d %v, want %d", n, err, want)
	}
	_ = counter.Disconnect(ctxFor(t))

	per := func(a, b int64) float64 { return float64(a-b) / thousandConns }
	g := per(int64(after.goroutines), int64(before.goroutines))
	heap := per(int64(after.heapInuse), int64(before.heapInuse))
	rss := per(after.rssKiB*1024, before.rssKiB*1024)
	t.Logf("%d connections opened and used in %v (%.1f ms each)", thousandConns, used.Round(time.Millisecond), float64(used.Milliseconds())/thousandConns)
	t.Logf("per idle connection: %.2f goroutines, %.1f KiB Go heap in use, %.1f KiB RSS (process RSS %d -> %d MiB, goroutines %d -> %d)",
		g, heap/1024, rss/1024, before.rssKiB/1024, after.rssKiB/1024, before.goroutines, after.goroutines)
	// One goroutine per connection is the design. The buffers are 4 KiB
	// of read-ahead per side plus the last small frames (proxy/conn.go):
	// about 12 KiB measured; the bounds leave room for noise.
	if g > 3 {
		t.Errorf("%.2f goroutines per idle connection, want at most 3", g)
	}
	if heap > 32*1024 {
		t.Errorf("%.0f KiB of Go heap per idle connection, want at most 32", heap/1024)
	}
	if rss > 128*1024 {
		t.Errorf("%.0f KiB RSS per idle connection, want at most 128", rss/1024)
	}

	for _, c := range conns {
		c.nc.Close()
	}
	waitConnections(t, p, 1)
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before.goroutines+10 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if left := runtime.NumGoroutine(); left > before.goroutines+10 {
		t.Fatalf("goroutines after the connections closed: %d, were %d before", left, before.goroutines)
	}
}

// useConn runs a hello and a ping over a raw connection; every
// writerEvery-th one (and the warm-up, i < 0) also inserts one event of its
// own series into the bucketed namespace and finds it.
func useConn(t *testing.T, c *rawConn, db string, i int) {
	t.Helper()
	hello := c.command(bson.D{{Key: "hello", Value: 1}, {Key: "$db", Value: "admin"}})
	if ok, _ := hello.Lookup("ok").AsFloat64OK(); ok != 1 {
		t.Fatalf("hello on connection %d: %v", i, hello)
	}
	c.ping()
	if i >= 0 && i%writerEvery != 0 {
		return
	}
	sensor := fmt.Sprintf("conn-%04d", i)
	ev := bson.D{{Key: "_id", Value: bson.NewObjectID()}, {Key: "ts", Value: bson.DateTime(1_772_000_000_000 + int64(i))}, {Key: "sensorId", Value: sensor}, {Key: "value", Value: float64(i)}}
	r := c.command(bson.D{{Key: "insert", Value: "readings"}, {Key: "documents", Value: bson.A{ev}}, {Key: "$db", Value: db}})
	if n, _ := r.Lookup("n").AsInt64OK(); n != 1 {
		t.Fatalf("insert on connection %d: %v", i, r)
	}
	r = c.command(bson.D{{Key: "find", Value: "readings"}, {Key: "filter", Value: bson.D{{Key: "sensorId", Value: sensor}}}, {Key: "$db", Value: db}})
	batch, _ := r.Lookup("cursor", "firstBatch").Array().Values()
	if len(batch) != 1 {
		t.Fatalf("find on connection %d: %v", i, r)
	}
}

type usage struct {
	goroutines int
	heapInuse  uint64
	rssKiB     int64
}

// measure settles the heap and reads goroutines, heap in use and RSS.
func measure(t *testing.T) usage {
	t.Helper()
	time.Sleep(200 * time.Millisecond) // let replies and goroutines settle
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return usage{goroutines: runtime.NumGoroutine(), heapInuse: ms.HeapInuse, rssKiB: vmRSS(t)}
}

// vmRSS reads the process's resident set from /proc/self/status (0 where
// there is no /proc).
func vmRSS(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n
		}
	}
	return 0
}
