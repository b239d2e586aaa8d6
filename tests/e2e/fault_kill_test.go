package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

var proxyBinary struct {
	sync.Once
	path string
	err  error
}

// tsproxyBinary builds ./cmd/tsproxy once per run.
func tsproxyBinary(t testing.TB) string {
	t.Helper()
	proxyBinary.Do(func() {
		dir, err := os.MkdirTemp("", "tsproxy-bin-*")
		if err != nil {
			proxyBinary.err = err
			return
		}
		bin := filepath.Join(dir, "tsproxy")
		cmd := exec.Command("go", "build", "-o", bin, "github.com/tsproxy/tsproxy/cmd/tsproxy")
		if out, err := cmd.CombinedOutput(); err != nil {
			proxyBinary.err = fmt.Errorf("go build ./cmd/tsproxy: %v\n%s", err, out)
			return
		}
		proxyBinary.path = bin
	})
	if proxyBinary.err != nil {
		t.Fatal(proxyBinary.err)
	}
	return proxyBinary.path
}

// proxyProcess is tsproxy run as its own OS process, so it can be killed.
type proxyProcess struct {
	t      testing.TB
	bin    string
	config string
	addr   string
	cmd    *exec.Cmd
	log    *syncBuffer
	logs   []string      // the logs of earlier runs
	cpu    time.Duration // CPU time of the runs that ended
}

func newProxyProcess(t testing.TB, yaml string) *proxyProcess {
	t.Helper()
	p := &proxyProcess{t: t, bin: tsproxyBinary(t), addr: freeAddr(t)}
	p.config = filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(p.config, []byte("telemetry:\n  metricsListen: \"\"\n"+yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if p.cmd != nil {
			p.kill()
		}
	})
	return p
}

// startProxyProcesses starts n proxy processes with the config yaml.
func startProxyProcesses(t testing.TB, n int, yaml string) []*proxyProcess {
	t.Helper()
	pps := make([]*proxyProcess, n)
	for i := range pps {
		pps[i] = newProxyProcess(t, yaml)
		pps[i].start()
	}
	return pps
}

// start runs the proxy and waits until it accepts connections.
func (p *proxyProcess) start() {
	p.t.Helper()
	if p.log != nil {
		p.logs = append(p.logs, p.log.String())
	}
	p.log = &syncBuffer{}
	p.cmd = exec.Command(p.bin, "--config", p.config, "--listen", p.addr, "--upstream", env.upstreamURI, "--log-level", "info")
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		nc, err := net.DialTimeout("tcp", p.addr, time.Second)
		if err == nil {
			nc.Close()
			return
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("tsproxy did not listen on %s within 30s:\n%s", p.addr, p.log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill sends SIGKILL and reaps the process.
func (p *proxyProcess) kill() {
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
	if st := p.cmd.ProcessState; st != nil {
		p.cpu += st.UserTime() + st.SystemTime()
	}
	p.cmd = nil
}

// cpuTime is the CPU time of every run so far, the running one's read
// from /proc (Linux; elsewhere only the runs that ended count).
func (p *proxyProcess) cpuTime() time.Duration {
	total := p.cpu
	if p.cmd == nil || p.cmd.Process == nil {
		return total
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		return total
	}
	// Fields 14 and 15 (utime, stime, in clock ticks of 1/100 s) follow
	// the command name in parentheses.
	fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(fields) > 12 {
		var ut, st int64
		fmt.Sscan(fields[11], &ut)
		fmt.Sscan(fields[12], &st)
		total += time.Duration(ut+st) * 10 * time.Millisecond
	}
	return total
}

func (p *proxyProcess) URI() string { return "mongodb://" + p.addr + "/" }

// batchOutcome is one insertMany of a load client.
type batchOutcome struct {
	events []sentEvent
	acked  bool
	err    error
	at     time.Time // when it returned
	took   time.Duration
}

// loadCollections connects n load clients, client i to uri(i), each to
// db.readings. Half of them (the odd ones) do not retry: their writes in
// flight at a kill stay unacknowledged, stored whole or not at all.
func loadCollections(t *testing.T, db string, n int, selection time.Duration, uri func(i int) string) []*mongo.Collection {
	t.Helper()
	colls := make([]*mongo.Collection, n)
	for i := range colls {
		c, err := mongo.Connect(options.Client().ApplyURI(uri(i)).SetServerSelectionTimeout(selection).SetTimeout(20 * time.Second).SetRetryWrites(i%2 == 0))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Disconnect(context.Background()) })
		colls[i] = c.Database(db).Collection("readings")
	}
	return colls
}

// loadClients runs clients, each inserting batches of its own series into
// coll until stop is closed; batch sizes cycle through sizes.
func loadClients(ctx context.Context, colls []*mongo.Collection, sizes []int, base time.Time, stop <-chan struct{}) [][]batchOutcome {
	return runLoad(ctx, colls, loadOptions{sizes: sizes, base: base, stop: stop})
}

// loadOptions shape runLoad's clients.
type loadOptions struct {
	sizes []int     // batch sizes, cycled through
	base  time.Time // time of each client's first event (one per second after)
	stop  <-chan struct{}
	// timeout, when > 0, is a deadline on each insert (within ctx).
	timeout time.Duration
	// took, when set, is told each insert's duration.
	took func(time.Duration)
	// pause is each client's wait after a successful insert.
	pause time.Duration
}

// runLoad is loadClients with more options.
func runLoad(ctx context.Context, colls []*mongo.Collection, o loadOptions) [][]batchOutcome {
	sizes, base, stop, timeout, took := o.sizes, o.base, o.stop, o.timeout, o.took
	out := make([][]batchOutcome, len(colls))
	var wg sync.WaitGroup
	for c, coll := range colls {
		wg.Add(1)
		go func(c int, coll *mongo.Collection) {
			defer wg.Done()
			sensor := fmt.Sprintf("client-%02d", c)
			next := 0
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				n := sizes[k%len(sizes)]
				evs := make([]sentEvent, n)
				for i := range evs {
					evs[i] = sentEvent{id: bson.NewObjectID(), sensor: sensor, ts: base.Add(time.Duration(next) * time.Second), value: float64(next % 100)}
					next++
				}
				opCtx, cancel := ctx, context.CancelFunc(func() {})
				if timeout > 0 {
					opCtx, cancel = context.WithTimeout(ctx, timeout)
				}
				start := time.Now()
				_, err := coll.InsertMany(opCtx, docsOf(evs))
				el := time.Since(start)
				cancel()
				if took != nil {
					took(el)
				}
				out[c] = append(out[c], batchOutcome{events: evs, acked: err == nil, err: err, at: time.Now(), took: el})
				if err != nil {
					time.Sleep(50 * time.Millisecond) // the proxy or upstream is down: do not spin
				} else if o.pause > 0 {
					time.Sleep(o.pause)
				}
			}
		}(c, coll)
	}
	wg.Wait()
	return out
}

// faultFigures checks the outcome of a load run against what is stored,
// and returns the figures of the Reliability table.
type faultFigures struct {
	acked, ackedFound, unacked, unackedFound, partial, dups int
}

func checkOutcomes(t *testing.T, stored map[bson.ObjectID]int, outcomes [][]batchOutcome) faultFigures {
	t.Helper()
	var f faultFigures
	for _, cl := range outcomes {
		for _, b := range cl {
			present := 0
			for _, e := range b.events {
				if n := stored[e.id]; n > 0 {
					present++
					f.dups += n - 1
				}
			}
			if b.acked {
				f.acked += len(b.events)
				f.ackedFound += present
			} else {
				f.unacked += len(b.events)
				f.unackedFound += present
				if present != 0 && present != len(b.events) {
					f.partial++
				}
			}
		}
	}
	return f
}

// idChecksum is the count and a SHA-256 of the sorted event _ids.
func idChecksum(ids []bson.ObjectID) (int, string) {
	s := slices.Clone(ids)
	slices.SortFunc(s, func(a, b bson.ObjectID) int { return bytes.Compare(a[:], b[:]) })
	h := sha256.New()
	for _, id := range s {
		h.Write(id[:])
	}
	return len(s), fmt.Sprintf("%x", h.Sum(nil))[:16]
}

// TestFaultKillProxy: the proxy, a separate process, is
// killed with SIGKILL while 16 clients insert, then restarted on the same
// address. Every acknowledged event is stored exactly once, through the
// restarted proxy and in the buckets alike; an unacknowledged batch (one
// bucket write each here) is stored whole or not at all.
func TestFaultKillProxy(t *testing.T) {
	t.Parallel()
	// Direct bucket writes: a retry after a restart is recognised by
	// reading what its keys' buckets hold.
	t.Run("direct", func(t *testing.T) { killProxyRun(t, "    ingest: direct\n", 10, false) })
	// The staging tier (rewrite/stage): 10 kills in one run, while a client
	// flushes all along, so kills land during staged inserts and during
	// merges (freeze, plan, bucket inserts, drop) alike.
	t.Run("staged", func(t *testing.T) { killProxyRun(t, "    ingest: staged\n    mergeAfter: 200ms\n", 10, true) })
}

// killProxyRun is the kill test: rule options extra, kills kill -9s with
// restarts, and with flusher a client running tsproxyFlush throughout.
func killProxyRun(t *testing.T, extra string, kills int, flusher bool) {
	t.Parallel()
	db := uniqueDB(t)
	// maxEvents a multiple of every batch size, and the windows of one
	// client never shared: each batch is exactly one bucket write, a $push
	// upsert (10 events, below the threshold) or a complete bucket (50).
	rule := fmt.Sprintf(`rules:
  - namespace: %s.readings
    timeField: ts
    metaField: sensorId
    bucket:
      span: 1h
      maxEvents: 100
      insertThreshold: 50
    aggregates: [value]
`, db) + extra
	pp := newProxyProcess(t, rule)
	pp.start()
	ctx := ctxFor(t)
	const clients = 16
	colls := loadCollections(t, db, clients, 10*time.Second, func(int) string { return pp.URI() })
	stop := make(chan struct{})
	done := make(chan [][]batchOutcome)
	base := time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC)
	go func() { done <- loadClients(ctx, colls, []int{10, 10, 50, 10, 10}, base, stop) }()
	flushes := make(chan int, 1)
	go func() {
		n := 0
		defer func() { flushes <- n }()
		for flusher {
			select {
			case <-stop:
				return
			default:
			}
			if flushAt(pp.addr) == nil {
				n++
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()

	time.Sleep(2 * time.Second)
	var killedAt, restartAt time.Time
	var listening time.Duration
	for range kills {
		killedAt = time.Now()
		pp.kill()
		time.Sleep(500 * time.Millisecond)
		restartAt = time.Now()
		pp.start()
		listening = time.Since(restartAt)
		time.Sleep(1500 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	close(stop)
	outcomes := <-done
	if n := <-flushes; flusher && n == 0 {
		t.Fatal("no flush succeeded during the run")
	}

	// Time to recover: from the last kill to the first insert acknowledged
	// after the last restart.
	var firstAfter time.Time
	for _, cl := range outcomes {
		for _, b := range cl {
			if b.acked && b.at.After(restartAt) && (firstAfter.IsZero() || b.at.Before(firstAfter)) {
				firstAfter = b.at
			}
		}
	}
	retried := strings.Count(strings.Join(pp.logs, "")+pp.log.String(), "retried insert") // every run of the proxy
	if firstAfter.IsZero() {
		t.Fatal("no insert was acknowledged after the restart")
	}
	if err := flushAt(pp.addr); err != nil {
		t.Fatalf("final flush: %v", err)
	}
	stored := storedIDs(t, ctx, db)
	f := checkOutcomes(t, stored, outcomes)
	t.Logf("%d × kill -9 under 16 clients: acknowledged %d, found %d; unacknowledged %d, found %d (partial batches %d); duplicates %d; retries recognised by the restarted proxy %d; restarted proxy listening after %v, first ack %v after the last kill",
		kills, f.acked, f.ackedFound, f.unacked, f.unackedFound, f.partial, f.dups, retried, listening.Round(time.Millisecond), firstAfter.Sub(killedAt).Round(time.Millisecond))
	if f.dups != 0 || f.ackedFound != f.acked || f.partial != 0 {
		t.Fatalf("after kill -9: %+v", f)
	}
	if f.acked == 0 {
		t.Fatal("no insert was acknowledged at all")
	}

	// Read back through the restarted proxy: the same events as the
	// buckets hold, each once.
	var viaProxy, inBuckets []bson.ObjectID
	for id, n := range stored {
		for i := 0; i < n; i++ {
			inBuckets = append(inBuckets, id)
		}
	}
	cur, err := connect(t, pp.URI()).Database(db).Collection("readings").Find(ctx, bson.D{}, options.Find().SetProjection(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		t.Fatal(err)
	}
	var rows []struct {
		ID bson.ObjectID `bson:"_id"`
	}
	if err := cur.All(ctx, &rows); err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		viaProxy = append(viaProxy, r.ID)
	}
	np, sp := idChecksum(viaProxy)
	nb, sb := idChecksum(inBuckets)
	t.Logf("read back: %d events (sha256 %s) through the proxy, %d (%s) in the buckets", np, sp, nb, sb)
	if np != nb || sp != sb {
		t.Fatalf("through the restarted proxy %d events (%s), in the buckets %d (%s)", np, sp, nb, sb)
	}
}
