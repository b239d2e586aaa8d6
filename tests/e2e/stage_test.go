package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/tests/backend"
)

// stagedRule is readingsRule with the staging tier on whatever the
// upstream (ingest: staged), merged in the background after mergeAfter.
func stagedRule(db string, maxEvents int, mergeAfter string) string {
	return readingsRule(db, maxEvents) + "    ingest: staged\n    mergeAfter: " + mergeAfter + "\n"
}

// stagingNames lists db's staging collections on the upstream, without
// settling anything first (direct would); not the spares, which hold no
// event (rewrite/stage's spare.go: spareNames).
func stagingNames(t *testing.T, ctx context.Context, db string) []string {
	t.Helper()
	return stagingNamesAt(t, ctx, env.upstreamURI, db)
}

// stagingNamesAt is stagingNames on the upstream at uri (a test's own).
func stagingNamesAt(t *testing.T, ctx context.Context, uri, db string) []string {
	t.Helper()
	names, err := connect(t, uri).Database(db).ListCollectionNames(ctx, bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, n := range names {
		if strings.HasPrefix(n, "tsproxy_stage_") && !strings.HasSuffix(n, "_txns") && !strings.HasSuffix(n, "_ids") && !strings.Contains(n, "_spare_") {
			out = append(out, n)
		}
	}
	return out
}

// flush runs tsproxyFlush through the proxy and returns its reply.
func flush(t *testing.T, ctx context.Context, c *mongo.Client, target any) bson.M {
	t.Helper()
	var out bson.M
	if err := c.Database("admin").RunCommand(ctx, bson.D{{Key: "tsproxyFlush", Value: target}}).Decode(&out); err != nil {
		t.Fatalf("tsproxyFlush: %v", err)
	}
	return out
}

// stepTime is one kind of step of a flush reply's upstreamMs.
type stepTime struct {
	Ms    float64 `bson:"ms"`
	Steps int64   `bson:"steps"`
}

// upstreamSteps reads a flush reply's upstreamMs: the time its merges
// waited on the upstream, by kind of step ("update buckets").
func upstreamSteps(t *testing.T, r bson.M) map[string]stepTime {
	t.Helper()
	raw, err := bson.Marshal(bson.D{{Key: "u", Value: r["upstreamMs"]}})
	if err != nil {
		t.Fatalf("flush reply %v: upstreamMs: %v", r, err)
	}
	var out struct {
		U map[string]stepTime `bson:"u"`
	}
	if err := bson.Unmarshal(raw, &out); err != nil {
		t.Fatalf("flush reply %v: upstreamMs: %v", r, err)
	}
	return out.U
}

func asInt(v any) int64 {
	switch n := v.(type) {
	case int32:
		return int64(n)
	case int64:
		return n
	case float64:
		return int64(n)
	}
	return -1
}

// TestStageReadYourWrites: events inserted one by one sit in the staging
// tier; the next find, count, distinct and aggregate through the proxy
// return each of them exactly once (the read merges first), and a flush
// afterwards has nothing left to merge.
func TestStageReadYourWrites(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: stagedRule(db, 100, "1h")})
	c := connect(t, p.URI())
	coll := c.Database(db).Collection("readings")
	base := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	var sent []sentEvent
	for i, s := range []string{"a", "b", "c"} {
		evs := seriesEvents(150, s, base.Add(time.Duration(i)*time.Minute))
		for _, e := range evs[:50] { // batch 1
			if _, err := coll.InsertOne(ctx, e.doc()); err != nil {
				t.Fatal(err)
			}
		}
		for j := 50; j < 150; j += 10 { // batch 10
			if _, err := coll.InsertMany(ctx, docsOf(evs[j:j+10])); err != nil {
				t.Fatal(err)
			}
		}
		sent = append(sent, evs...)
	}
	if n := len(stagingNames(t, ctx, db)); n == 0 {
		t.Fatal("no staging collection after inserts: the rule did not stage")
	}
	if n, err := coll.CountDocuments(ctx, bson.D{}); err != nil || n != int64(len(sent)) {
		t.Fatalf("count while staged: %d (%v), want %d", n, err, len(sent))
	}
	if left := stagingNames(t, ctx, db); len(left) != 0 {
		t.Fatalf("staging collections left after a read: %v", left)
	}
	cur, err := coll.Find(ctx, bson.D{}, options.Find().SetSort(bson.D{{Key: "ts", Value: 1}}))
	if err != nil {
		t.Fatal(err)
	}
	var got []bson.M
	if err := cur.All(ctx, &got); err != nil {
		t.Fatal(err)
	}
	seen := map[bson.ObjectID]int{}
	for _, d := range got {
		seen[d["_id"].(bson.ObjectID)]++
	}
	for _, e := range sent {
		if seen[e.id] != 1 {
			t.Fatalf("event %v found %d times, want once", e.id, seen[e.id])
		}
	}
	if len(got) != len(sent) {
		t.Fatalf("find returned %d events, want %d", len(got), len(sent))
	}
	// More staged events, then distinct and an aggregate.
	more := seriesEvents(20, "d", base.Add(time.Hour))
	if _, err := coll.InsertMany(ctx, docsOf(more)); err != nil {
		t.Fatal(err)
	}
	ds := coll.Distinct(ctx, "sensorId", bson.D{})
	var series []string
	if err := ds.Decode(&series); err != nil || len(series) != 4 {
		t.Fatalf("distinct: %v (%v), want 4 series", series, err)
	}
	agg, err := coll.Aggregate(ctx, mongo.Pipeline{{{Key: "$match", Value: bson.D{{Key: "sensorId", Value: "d"}}}}, {{Key: "$count", Value: "n"}}})
	if err != nil {
		t.Fatal(err)
	}
	var counted []bson.M
	if err := agg.All(ctx, &counted); err != nil || len(counted) != 1 || asInt(counted[0]["n"]) != 20 {
		t.Fatalf("aggregate count of d: %v (%v), want 20", counted, err)
	}
	if r := flush(t, ctx, c, 1); asInt(r["events"]) != 0 {
		t.Fatalf("flush after reads merged %v events, want 0", r["events"])
	}
}

// TestStageFlush: 1-second data inserted one event at a time ends, after
// tsproxyFlush, in complete buckets (as compact as a large batch), with
// no staging collection left, and the flush counts what it merged.
func TestStageFlush(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: stagedRule(db, 100, "1h")})
	c := connect(t, p.URI())
	coll := c.Database(db).Collection("readings")
	base := time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC)
	var sent []sentEvent
	for _, s := range []string{"a", "b"} {
		evs := seriesEvents(250, s, base)
		for _, e := range evs {
			if _, err := coll.InsertOne(ctx, e.doc()); err != nil {
				t.Fatal(err)
			}
		}
		sent = append(sent, evs...)
	}
	r := flush(t, ctx, c, db+".readings")
	if asInt(r["events"]) != int64(len(sent)) || asInt(r["rules"]) != 1 || asInt(r["collections"]) < 1 {
		t.Fatalf("flush reply %v, want events %d of 1 rule", r, len(sent))
	}
	// On FerretDB the proxy stages into collections of its own, and
	// merges them from what it kept of its inserts, reading none back.
	if !env.external && asInt(r["kept"]) != asInt(r["collections"]) {
		t.Fatalf("flush reply %v: %v of %v collections merged from what the proxy kept", r, r["kept"], r["collections"])
	}
	if !env.external {
		// The reply says where the merge's upstream time went.
		steps := upstreamSteps(t, r)
		if s := steps["insert buckets"]; s.Steps < 1 || s.Ms <= 0 {
			t.Fatalf("flush reply %v: upstreamMs has no time for inserting the buckets", r)
		}
		if s := steps["drop staging"]; s.Steps < 1 {
			t.Fatalf("flush reply %v: upstreamMs has no drop of the merged staging", r)
		}
	}
	if left := stagingNames(t, ctx, db); len(left) != 0 {
		t.Fatalf("staging collections left after the flush: %v", left)
	}
	buckets := readBuckets(t, ctx, db)
	// 250 events of each series in one 1-hour window, 100 per bucket.
	if len(buckets) != 6 || asInt(r["buckets"]) != 6 {
		t.Fatalf("%d buckets (flush says %v), want 6 (3 per series)", len(buckets), r["buckets"])
	}
	checkStored(t, buckets, sent, 100)
	if _, err := c.Database("admin").RunCommand(ctx, bson.D{{Key: "tsproxyFlush", Value: "nodb.norule"}}).Raw(); err == nil || !strings.Contains(err.Error(), "no rule") {
		t.Fatalf("flush of a namespace without a rule: %v, want an error naming it", err)
	}
}

// TestStageBackgroundMerge: a staging collection that takes nothing new
// for mergeAfter is merged without any read or flush.
func TestStageBackgroundMerge(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: stagedRule(db, 100, "300ms")})
	coll := connect(t, p.URI()).Database(db).Collection("readings")
	evs := seriesEvents(30, "a", time.Date(2026, 3, 3, 0, 0, 0, 0, time.UTC))
	for _, e := range evs {
		if _, err := coll.InsertOne(ctx, e.doc()); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(stagingNames(t, ctx, db)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("staging not merged in the background after 30s: %v", stagingNames(t, ctx, db))
		}
		time.Sleep(100 * time.Millisecond)
	}
	checkStored(t, readBuckets(t, ctx, db), evs, 100)
}

// TestStageMergeBatch: small inserts are merged in the background as they
// come, a batch of staged documents at a time (proxy mergeBatch), while
// inserts go on and long before the rule's mergeAfter: what a flush (or
// a read) must merge first stays one batch. Every event is stored once,
// and on FerretDB each merge fills up the key's last bucket first
// (rewrite/stage topup.go), so the buckets are as full as one merge of
// everything would make them; a read in the middle does not fragment
// them either.
func TestStageMergeBatch(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: stagedRule(db, 100, "1h")})
	c := connect(t, p.URI())
	coll := c.Database(db).Collection("readings")
	base := time.Date(2026, 3, 4, 0, 0, 0, 0, time.UTC)
	// Two series of 1-second data, one event an insert: 2,400 staged
	// documents, more than two batches of 1,000.
	var sent []sentEvent
	a, b := seriesEvents(1200, "a", base), seriesEvents(1200, "b", base)
	for i := range a {
		for _, e := range []sentEvent{a[i], b[i]} {
			if _, err := coll.InsertOne(ctx, e.doc()); err != nil {
				t.Fatal(err)
			}
			sent = append(sent, e)
		}
	}
	// A read halfway through merges what is staged then.
	if n, err := coll.CountDocuments(ctx, bson.D{}); err != nil || n != int64(len(sent)) {
		t.Fatalf("count after %d inserts: %d, %v", len(sent), n, err)
	}
	for _, e := range seriesEvents(1400, "a", base)[1200:] {
		if _, err := coll.InsertOne(ctx, e.doc()); err != nil {
			t.Fatal(err)
		}
		sent = append(sent, e)
	}
	// Merged in the background already (mergeAfter is an hour away).
	deadline := time.Now().Add(30 * time.Second)
	for len(readBuckets(t, ctx, db)) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("nothing merged in the background after 2,400 staged documents: staging %v", stagingNames(t, ctx, db))
		}
		time.Sleep(100 * time.Millisecond)
	}
	r := flush(t, ctx, c, db+".readings")
	if n := asInt(r["events"]); n < 0 || n > 1200 {
		t.Fatalf("the flush merged %d events, want at most one batch (1,000 documents and what a merge in flight held)", n)
	}
	if left := stagingNames(t, ctx, db); len(left) != 0 {
		t.Fatalf("staging collections left after the flush: %v", left)
	}
	buckets := readBuckets(t, ctx, db)
	checkStored(t, buckets, sent, 100)
	// 1,400 and 1,200 events of the two series in one window: 14 and 12
	// full buckets. Without topping up (MongoDB), at most one partial
	// bucket a series for each merge.
	want := 26
	if env.external {
		want = 40
	}
	if len(buckets) > want {
		t.Fatalf("%d buckets for 2,600 events at maxEvents 100, want at most %d", len(buckets), want)
	}
	t.Logf("%d buckets; the flush merged %v events", len(buckets), r["events"])
}

// TestStageRetryAcrossRestartAndMerge is issue 11's deterministic case on
// the staging tier: a retryable insert (lsid L, txnNumber 1) is stored,
// its reply is lost (the proxy restarts, so its reply cache is gone),
// another client writes to the same series and window, and the driver's
// retry of (L, 1) arrives: before the staged events are merged, and
// again after a merge. Every event is stored once.
func TestStageRetryAcrossRestartAndMerge(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	yaml := stagedRule(db, 100, "1h")
	base := time.Date(2026, 3, 4, 0, 0, 0, 0, time.UTC)
	first := seriesEvents(10, "a", base)
	other := seriesEvents(1, "a", base.Add(time.Minute))
	lsid := newLsid(t)
	insert := retryableInsert(db, "readings", lsid, 1)

	p1 := startProxy(t, proxyOptions{yaml: yaml})
	if r, err := dialRawClient(t, p1.addr).run(insert, docsOf(first)); err != nil || asInt(r.Lookup("n").Int32()) != 10 {
		t.Fatalf("first attempt: %v %v", r, err)
	}
	// The proxy restarts: a new one, whose reply cache lacks the write
	// (and which needs the rule's writer lease, so the old one is gone).
	stopProxy(t, p1)
	p2 := startProxy(t, proxyOptions{yaml: yaml})
	if _, err := connect(t, p2.URI()).Database(db).Collection("readings").InsertMany(ctx, docsOf(other)); err != nil {
		t.Fatal(err)
	}
	r, err := dialRawClient(t, p2.addr).run(insert, docsOf(first))
	if err != nil || r.Lookup("ok").Double() != 1 || r.Lookup("n").Int32() != 10 {
		t.Fatalf("retry while staged: %v %v, want n: 10", r, err)
	}
	flush(t, ctx, connect(t, p2.URI()), 1)
	// And once more after the merge, through a third proxy.
	stopProxy(t, p2)
	p3 := startProxy(t, proxyOptions{yaml: yaml})
	r, err = dialRawClient(t, p3.addr).run(insert, docsOf(first))
	if err != nil || r.Lookup("ok").Double() != 1 || r.Lookup("n").Int32() != 10 {
		t.Fatalf("retry after the merge: %v %v, want n: 10", r, err)
	}
	out := flush(t, ctx, connect(t, p3.URI()), 1)
	if asInt(out["retries"]) != 1 {
		t.Fatalf("flush after the late retry: %v, want 1 staged document left out as a retry", out)
	}
	got := storedIDs(t, ctx, db)
	for _, e := range append(first, other...) {
		if got[e.id] != 1 {
			t.Fatalf("event %v stored %d times, want once", e.id, got[e.id])
		}
	}
	if len(got) != 11 {
		t.Fatalf("%d distinct events stored, want 11", len(got))
	}
}

// TestStageConcurrentInsertsAndFlushes: clients insert while flushes
// freeze and merge the staging collections they write to: every
// acknowledged event is stored exactly once.
func TestStageConcurrentInsertsAndFlushes(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: stagedRule(db, 50, "1h")})
	admin := connect(t, p.URI())
	stop := make(chan struct{})
	flushed := make(chan int)
	go func() {
		n := 0
		defer func() { flushed <- n }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := admin.Database("admin").RunCommand(context.Background(), bson.D{{Key: "tsproxyFlush", Value: 1}}).Err(); err == nil {
				n++
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	sent := insertConcurrently(t, ctx, p.URI(), db, "s", 8, 200, 5, time.Date(2026, 3, 5, 0, 0, 0, 0, time.UTC))
	close(stop)
	if n := <-flushed; n == 0 {
		t.Fatal("no flush ran during the inserts")
	}
	got := storedIDs(t, ctx, db)
	for _, e := range sent {
		if got[e.id] != 1 {
			t.Fatalf("event %v stored %d times, want once", e.id, got[e.id])
		}
	}
	if len(got) != len(sent) {
		t.Fatalf("%d distinct events stored, want %d", len(got), len(sent))
	}
}

// TestStageThreeProxies: 16 clients ingest one staged rule through three
// proxies at once, reading through two of them now and then (a proxy
// without the rule's writer lease asks the holder to merge); one proxy is
// killed with SIGKILL mid-run, and its staging collections taken over
// once its announcement lapsed. Every proxy takes inserts: each stages
// into collections of its own (see proxy.stagedInsert: when they shared
// staging collections, 51 of 22,926 events were lost here on the stock
// ferretdb command, so only the lease holder took inserts then). Every
// acknowledged event is stored exactly once, an unacknowledged
// batch whole or not at all, and the living proxies answer reads.
func TestStageThreeProxies(t *testing.T) {
	t.Parallel()
	db := uniqueDB(t)
	pps := startProxyProcesses(t, 3, stagedRule(db, 100, "200ms"))
	ctx := ctxFor(t)
	const clients = 16
	colls := loadCollections(t, db, clients, 5*time.Second, func(i int) string { return pps[i%3].URI() })
	stop := make(chan struct{})
	done := make(chan [][]batchOutcome)
	base := time.Date(2026, 10, 2, 0, 0, 0, 0, time.UTC)
	go func() { done <- loadClients(ctx, colls, []int{1, 10, 1, 50, 5}, base, stop) }()
	// Reads on the two proxies that live, during the load: one may wait
	// for the killed proxy's writer lease to lapse (10 s) and merge.
	readers := make([]*mongo.Collection, 2)
	for i := range readers {
		c, err := mongo.Connect(options.Client().ApplyURI(pps[1+i].URI()).SetTimeout(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Disconnect(context.Background()) })
		readers[i] = c.Database(db).Collection("readings")
	}
	reads := make(chan error, 1)
	go func() {
		var firstErr error
		for k := 0; ; k++ {
			select {
			case <-stop:
				reads <- firstErr
				return
			default:
			}
			_, err := readers[k%2].CountDocuments(ctx, bson.D{})
			if err != nil && firstErr == nil {
				firstErr = err
			}
			time.Sleep(200 * time.Millisecond)
		}
	}()
	time.Sleep(2 * time.Second)
	pps[0].kill()
	time.Sleep(3 * time.Second)
	close(stop)
	outcomes := <-done
	if err := <-reads; err != nil {
		for i, pp := range pps {
			t.Logf("proxy %d log:\n%s", i, pp.log.String())
		}
		t.Fatalf("a read through a living proxy during the load: %v", err)
	}
	stored := settleAndCheck(t, ctx, db, "3 proxies, 16 clients, one proxy killed", pps[1:], outcomes)
	// Every proxy ingests: staged inserts take no writer lease.
	checkLivingProxiesAcked(t, outcomes)
	n, err := colls[1].CountDocuments(ctx, bson.D{})
	if err != nil || n != int64(len(stored)) {
		t.Fatalf("count through a living proxy: %d (%v), want %d", n, err, len(stored))
	}
}

// checkLivingProxiesAcked checks that proxies 1 and 2 of three (client i
// went through proxy i%3; proxy 0 was killed) each acknowledged inserts.
func checkLivingProxiesAcked(t *testing.T, outcomes [][]batchOutcome) {
	t.Helper()
	perProxy := make([]int, 3)
	for i, cl := range outcomes {
		for _, b := range cl {
			if b.acked {
				perProxy[i%3] += len(b.events)
			}
		}
	}
	t.Logf("acknowledged events by proxy: %v", perProxy)
	if perProxy[1] == 0 || perProxy[2] == 0 {
		t.Fatalf("a living proxy acknowledged no insert: %v", perProxy)
	}
}

// settleAndCheck flushes each of pps (what they staged merged) and checks
// a load's outcomes against what is stored: every acknowledged event
// once, every unacknowledged batch whole or not at all.
func settleAndCheck(t *testing.T, ctx context.Context, db, what string, pps []*proxyProcess, outcomes [][]batchOutcome) map[bson.ObjectID]int {
	t.Helper()
	for _, pp := range pps {
		if err := flushAt(pp.addr); err != nil {
			for i, pp := range pps {
				t.Logf("proxy %d log:\n%s", i, pp.log.String())
			}
			t.Fatalf("final flush on %s: %v", pp.addr, err)
		}
	}
	stored := storedIDs(t, ctx, db)
	f := checkOutcomes(t, stored, outcomes)
	t.Logf("%s: acknowledged %d, found %d; unacknowledged %d, found %d (partial batches %d); duplicates %d",
		what, f.acked, f.ackedFound, f.unacked, f.unackedFound, f.partial, f.dups)
	if f.dups != 0 || f.ackedFound != f.acked || f.partial != 0 || f.acked == 0 {
		t.Fatalf("%s: %+v", what, f)
	}
	return stored
}

// stopProxy shuts a test proxy down (releasing its writer leases) before
// the test ends.
func stopProxy(t *testing.T, p *testProxy) {
	t.Helper()
	live.Lock()
	delete(live.proxies, p) // nothing left to settle
	live.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = p.srv.Shutdown(ctx)
}

// TestStageSharedInserts: 16 clients insert one event at a time (retryable
// writes, the drivers' default), two of them with another write concern;
// on FerretDB the proxy sends concurrent staged inserts as one upstream
// insert and answers each client its part. Every acknowledged event is
// stored exactly once, and inserts were shared.
func TestStageSharedInserts(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: stagedRule(db, 1000, "1h")})
	const clients, perClient = 16, 150
	base := time.Date(2026, 3, 6, 0, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	var sent []sentEvent
	colls := make([]*mongo.Collection, clients)
	for c := range colls {
		coll := connect(t, p.URI()).Database(db).Collection("readings")
		if c < 2 {
			coll = coll.Database().Collection("readings", options.Collection().SetWriteConcern(writeconcern.Journaled()))
		}
		colls[c] = coll
	}
	runClients(t, clients, func(c int) error {
		for i := 0; i < perClient; i++ {
			ev := seriesBatch(fmt.Sprintf("s%d", c%4), base, c*perClient+i, 1)
			if _, err := colls[c].InsertOne(ctx, ev[0].doc()); err != nil {
				return err
			}
			mu.Lock()
			sent = append(sent, ev...)
			mu.Unlock()
		}
		return nil
	})
	got := storedIDs(t, ctx, db)
	for _, e := range sent {
		if got[e.id] != 1 {
			t.Fatalf("event %v stored %d times, want once", e.id, got[e.id])
		}
	}
	if len(got) != len(sent) || len(sent) != clients*perClient {
		t.Fatalf("%d distinct events stored, %d sent, want %d", len(got), len(sent), clients*perClient)
	}
	shared, riders := p.srv.SharedInserts()
	t.Logf("%d upstream inserts carried %d more clients' inserts", shared, riders)
	if !env.external && shared == 0 {
		t.Fatal("16 concurrent clients on FerretDB: no staged insert was shared")
	}
}

// TestStageThreeProxiesCounter: 16 clients count hits into one counter
// rule through three proxies, one of them killed mid-run. On FerretDB
// the hits stage (no writer lease: every proxy takes inserts) and the
// holder of the rule's lease merges them into the counters; elsewhere
// they are $inc upserts. Each client's hit falls in a second of its own,
// so every counter slot is 0 or 1: every acknowledged hit is counted
// once, an unacknowledged batch wholly or not at all, nothing twice.
// Not parallel: beside TestStageThreeProxies' load it would double what
// one FerretDB/PostgreSQL takes at once (its pool of 50 connections).
func TestStageThreeProxiesCounter(t *testing.T) {
	db := uniqueDB(t)
	rule := fmt.Sprintf(`rules:
  - namespace: %s.hits
    timeField: ts
    metaField: sensorId
    layout: counter
    window: hour
    slot: second
    mergeAfter: 200ms
`, db)
	pps := startProxyProcesses(t, 3, rule)
	ctx := ctxFor(t)
	const clients = 16
	colls := loadCollections(t, db, clients, 5*time.Second, func(i int) string { return pps[i%3].URI() })
	for i, c := range colls {
		colls[i] = c.Database().Collection("hits")
	}
	stop := make(chan struct{})
	done := make(chan [][]batchOutcome)
	base := time.Date(2026, 10, 2, 0, 0, 0, 0, time.UTC)
	go func() { done <- loadClients(ctx, colls, []int{1, 10, 1, 50, 5}, base, stop) }()
	time.Sleep(2 * time.Second)
	pps[0].kill()
	time.Sleep(3 * time.Second)
	close(stop)
	outcomes := <-done
	for _, pp := range pps[1:] {
		t0 := time.Now()
		if err := flushAt(pp.addr); err != nil {
			t.Fatalf("final flush on %s: %v\n%s", pp.addr, err, pp.log.String())
		}
		t.Logf("flush on %s: %v", pp.addr, time.Since(t0))
	}
	counted, total := counterBuckets(t, ctx, db)
	stored := map[bson.ObjectID]int{}
	for _, cl := range outcomes {
		for _, b := range cl {
			for _, e := range b.events {
				stored[e.id] = counted[slotKey{e.sensor, e.ts.Unix()}]
			}
		}
	}
	f := checkOutcomes(t, stored, outcomes)
	t.Logf("counter, 3 proxies, 16 clients, one proxy killed: acknowledged %d, counted %d; unacknowledged %d, counted %d (partial batches %d); counted twice %d; total %d",
		f.acked, f.ackedFound, f.unacked, f.unackedFound, f.partial, f.dups, total)
	if f.dups != 0 || f.ackedFound != f.acked || f.partial != 0 || f.acked == 0 || total != int64(f.ackedFound+f.unackedFound) {
		t.Fatalf("counter: %+v, total %d", f, total)
	}
	checkLivingProxiesAcked(t, outcomes)
	n, err := colls[1].CountDocuments(ctx, bson.D{})
	if err != nil || n != int64(len(counted)) {
		t.Fatalf("countDocuments through a living proxy: %d (%v), want %d (one document per counted second)", n, err, len(counted))
	}
}

// keepsDirectory says whether the proxy that merges a rule reads a
// directory of its buckets (proxy/directory.go): where lookups by _id
// scan, FerretDB's stock command and PostgreSQL (on the embedded
// upstream it knows only what its merges wrote); the counts of the
// flush's reply are checked only against the FerretDB the tests start.
func keepsDirectory() bool {
	return !env.external && env.kind != backend.KindEmbedded
}

// TestStageDirectory: the proxy that merges a rule knows its buckets from
// its own merges and from one read of their keys (proxy/directory.go),
// and what it knows never makes it write a wrong bucket: rounds of
// inserts and flushes, with a delete that empties a series' last bucket
// and a drop through another proxy between them, each event stored once.
func TestStageDirectory(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	yaml := stagedRule(db, 100, "1h")
	p := startProxy(t, proxyOptions{yaml: yaml})
	c := connect(t, p.URI())
	coll := c.Database(db).Collection("readings")
	base := time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC)
	scans := keepsDirectory()
	var sent []sentEvent
	round := func(name string, from, n int, wantReads int64) bson.M {
		t.Helper()
		for _, s := range []string{"a", "b"} {
			evs := seriesEvents(from+n, s, base)[from:]
			if _, err := coll.InsertMany(ctx, docsOf(evs)); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			sent = append(sent, evs...)
		}
		r := flush(t, ctx, c, db+".readings")
		if !env.external && asInt(r["directoryReads"]) != wantReads {
			t.Fatalf("%s: flush %v, want %d reads of the buckets' keys", name, r, wantReads)
		}
		checkStored(t, readBuckets(t, ctx, db), sent, 100)
		return r
	}
	read := func(b bool) int64 {
		if b {
			return 1
		}
		return 0
	}
	// The first merge reads the keys of an empty bucket collection (the
	// proxy made it with its index); every bucket the second one finds
	// is the first's.
	round("first round", 0, 150, read(scans))
	round("second round", 150, 20, 0)
	// Topping up runs on FerretDB (its deletes take the writer lease).
	if r := round("third round", 170, 10, 0); !env.external && (asInt(r["toppedUp"]) != 2 || asInt(r["buckets"]) != 0 ||
		upstreamSteps(t, r)["update buckets"].Steps < 1) {
		t.Fatalf("third round: flush %v, want both series' last buckets topped up from what the proxy knew (rewrites of buckets, upstreamMs)", r)
	}
	// A delete on this proxy rewrites a's last bucket (100..179 keeps
	// 100..119), and the count of buckets stays: what the proxy knew of
	// it is stale all the same.
	cut := base.Add(120 * time.Second)
	if _, err := coll.DeleteMany(ctx, bson.D{{Key: "sensorId", Value: "a"}, {Key: "ts", Value: bson.D{{Key: "$gte", Value: cut}}}}); err != nil {
		t.Fatal(err)
	}
	sent = slices.DeleteFunc(sent, func(e sentEvent) bool { return e.sensor == "a" && !e.ts.Before(cut) })
	round("after a delete", 180, 30, read(scans))
	// And one that empties a's last bucket, which goes.
	cut = base.Add(100 * time.Second)
	if _, err := coll.DeleteMany(ctx, bson.D{{Key: "sensorId", Value: "a"}, {Key: "ts", Value: bson.D{{Key: "$gte", Value: cut}}}}); err != nil {
		t.Fatal(err)
	}
	sent = slices.DeleteFunc(sent, func(e sentEvent) bool { return e.sensor == "a" && !e.ts.Before(cut) })
	round("after a delete that removes a bucket", 210, 30, read(scans))
	// A drop through another proxy: this one learns of it from the
	// bucket collection's uuid (none now: nothing to read, and its
	// directory starts over empty).
	p2 := startProxy(t, proxyOptions{yaml: yaml})
	if err := connect(t, p2.URI()).Database(db).Collection("readings").Drop(ctx); err != nil {
		t.Fatal(err)
	}
	sent = nil
	round("after a drop elsewhere", 300, 120, 0)
	round("and after that", 420, 30, 0)
	if n, err := coll.CountDocuments(ctx, bson.D{}); err != nil || n != 300 {
		t.Fatalf("count %d, %v; want 300 (the last two rounds')", n, err)
	}
}

// TestStageParallelInserts: a merge whose buckets hold a megabyte or more
// (20,000 events) inserts them over two upstream connections at once
// (the second one the proxy's own); every event is stored once, with
// right summaries, and the proxy reads them all back.
func TestStageParallelInserts(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	// Raw: compressed, these buckets would be far under a megabyte.
	yaml := strings.Replace(stagedRule(db, 1000, "1h"), "maxEvents: 1000\n", "maxEvents: 1000\n      compression: none\n", 1)
	p := startProxy(t, proxyOptions{yaml: yaml})
	c := connect(t, p.URI())
	coll := c.Database(db).Collection("readings")
	base := time.Date(2026, 3, 3, 0, 0, 0, 0, time.UTC)
	var sent []sentEvent
	for s := range 8 {
		evs := seriesEvents(2500, fmt.Sprintf("s%d", s), base) // buckets of 1,000, 1,000 and 500
		if _, err := coll.InsertMany(ctx, docsOf(evs)); err != nil {
			t.Fatal(err)
		}
		sent = append(sent, evs...)
	}
	r := flush(t, ctx, c, db+".readings")
	if asInt(r["events"]) != int64(len(sent)) || asInt(r["buckets"]) != 24 {
		t.Fatalf("flush %v, want %d events merged into 24 buckets", r, len(sent))
	}
	if asInt(r["parallelInserts"]) != 2 {
		t.Fatalf("flush %v, want the buckets (over a megabyte) inserted in 2 commands at once", r)
	}
	checkStored(t, readBuckets(t, ctx, db), sent, 1000)
	n, err := coll.CountDocuments(ctx, bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(len(sent)) {
		t.Fatalf("the proxy counts %d events, want %d", n, len(sent))
	}
}

// TestStageCompressedEvents: with the default bucket.compression, the
// events a merge packs are stored compressed on FerretDB (packed values
// of subtype 0x80, a fraction of the raw size); a rule whose buckets were
// written raw by a proxy with compression: none and is then written by
// one with compression reads back every event once, with right
// summaries, whatever mix of raw and compressed buckets it holds.
func TestStageCompressedEvents(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	zstdRule := stagedRule(db, 1000, "1h")
	rawRule := strings.Replace(zstdRule, "maxEvents: 1000\n", "maxEvents: 1000\n      compression: none\n", 1)
	base := time.Date(2026, 3, 4, 0, 0, 0, 0, time.UTC)
	var sent []sentEvent
	write := func(yaml string, from, n int) {
		p := startProxy(t, proxyOptions{yaml: yaml})
		c := connect(t, p.URI())
		for s := range 3 {
			evs := seriesEvents(from+n, fmt.Sprintf("s%d", s), base)[from:]
			if _, err := c.Database(db).Collection("readings").InsertMany(ctx, docsOf(evs)); err != nil {
				t.Fatal(err)
			}
			sent = append(sent, evs...)
		}
		flush(t, ctx, c, db+".readings")
		_ = c.Disconnect(ctx)
		stopProxy(t, p) // with its writer lease: the next proxy merges itself
	}
	write(rawRule, 0, 1500)    // per series: 1,000 and 500, raw
	write(zstdRule, 1500, 700) // tops up the 500 and starts a third bucket, compressed
	subtypes := map[byte]int{}
	var rawBytes, packedBytes int
	docs := rawDocs(t, ctx, connect(t, env.upstreamURI).Database(db).Collection("readings.buckets"))
	for _, d := range docs {
		v, err := d.LookupErr("packed")
		if err != nil {
			continue // an events array (MongoDB)
		}
		subtype, data := v.Binary()
		subtypes[subtype]++
		if subtype != bucket.SubtypeZstdArray {
			continue
		}
		packedBytes += len(data)
		var b bucketDoc
		if err := bson.Unmarshal(d, &b); err != nil {
			t.Fatal(err)
		}
		for _, ev := range b.Events {
			raw, _ := bson.Marshal(ev)
			rawBytes += len(raw)
		}
	}
	if !env.external {
		// Per series: the first 1,000 raw; the 500 topped up with 500
		// more and the last 200, compressed.
		if len(docs) != 9 || subtypes[bucket.SubtypeArray] != 3 || subtypes[bucket.SubtypeZstdArray] != 6 {
			t.Fatalf("%d buckets, packed subtypes %v; want 3 raw (0x0) and 6 compressed (0x80)", len(docs), subtypes)
		}
		if packedBytes*2 > rawBytes {
			t.Errorf("compressed packed values hold %d bytes for %d bytes of events", packedBytes, rawBytes)
		}
	}
	checkStored(t, readBuckets(t, ctx, db), sent, 1000)
	c := connect(t, startProxy(t, proxyOptions{yaml: zstdRule}).URI())
	coll := c.Database(db).Collection("readings")
	n, err := coll.CountDocuments(ctx, bson.D{})
	if err != nil || n != int64(len(sent)) {
		t.Fatalf("the proxy counts %d events (%v), want %d", n, err, len(sent))
	}
	var got []bson.M
	cur, err := coll.Find(ctx, bson.D{{Key: "sensorId", Value: "s1"}}, options.Find().SetSort(bson.D{{Key: "ts", Value: 1}}))
	if err != nil {
		t.Fatal(err)
	}
	if err := cur.All(ctx, &got); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2200 {
		t.Fatalf("find of s1 returned %d events, want 2200", len(got))
	}
	for i, e := range got {
		if ts := e["ts"].(bson.DateTime).Time(); !ts.Equal(base.Add(time.Duration(i) * time.Second)) {
			t.Fatalf("event %d of s1 at %v, want %v", i, ts, base.Add(time.Duration(i)*time.Second))
		}
	}
}

// TestStageRecordsKept: the records of merged retryable writes (every
// derived id merged within the retry horizon) are read once a lease
// term, not at every merge; a retry of a write merged before is still
// stored once.
func TestStageRecordsKept(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: stagedRule(db, 100, "1h")})
	c := connect(t, p.URI()) // retryable writes: each insertOne has a txnNumber
	coll := c.Database(db).Collection("readings")
	base := time.Date(2026, 3, 4, 0, 0, 0, 0, time.UTC)
	evs := seriesEvents(60, "a", base)
	for round := range 3 {
		for _, e := range evs[round*20 : round*20+20] {
			if _, err := coll.InsertOne(ctx, e.doc()); err != nil {
				t.Fatal(err)
			}
		}
		r := flush(t, ctx, c, db+".readings")
		want := int64(0)
		if round == 0 {
			want = 1
		}
		if !env.external && asInt(r["recordReads"]) != want {
			t.Fatalf("round %d: flush %v, want %d reads of the records", round, r, want)
		}
	}
	checkStored(t, readBuckets(t, ctx, db), evs, 100)
}

// TestStageNothingStagedWritesNothing: a flush, a find and a count of a
// staged rule that holds nothing staged write nothing upstream (no
// writer lease, whose renewal is a write): the rule's database is not
// created by them.
func TestStageNothingStagedWritesNothing(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: stagedRule(db, 1000, "1h")})
	c := connect(t, p.URI())
	r := flush(t, ctx, c, db+".readings")
	if asInt(r["events"]) != 0 || asInt(r["collections"]) != 0 {
		t.Fatalf("flush of an empty rule: %v", r)
	}
	coll := c.Database(db).Collection("readings")
	if n, err := coll.CountDocuments(ctx, bson.D{}); err != nil || n != 0 {
		t.Fatalf("count %d, %v; want 0", n, err)
	}
	cur, err := coll.Find(ctx, bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	if cur.Next(ctx) {
		t.Fatalf("find returned %v", cur.Current)
	}
	_ = cur.Close(ctx)
	names, err := connect(t, env.upstreamURI).ListDatabaseNames(ctx, bson.D{{Key: "name", Value: db}})
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != 0 {
		cs, _ := connect(t, env.upstreamURI).Database(db).ListCollectionNames(ctx, bson.D{})
		t.Fatalf("database %s exists upstream after a flush, a count and a find of nothing: collections %v", db, cs)
	}
}
