package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/tsproxy/tsproxy/proxy"
)

// Several proxies in front of one upstream share no locks and no fill
// cache. On MongoDB each update of a bucket is atomic, so they may write
// the same series at once: a proxy whose idea of a bucket is stale meets a
// full bucket or a taken _id and re-plans. FerretDB's updates are not
// isolated (read, change in Go, write back), and two proxies updating one
// bucket lost acknowledged events; there a proxy writes a bucketed
// namespace only while it holds its writer lease (proxy/writer_lease.go),
// and another proxy's writes get ConflictingOperationInProgress (117).
// These tests write through two proxies at once and count every event in
// and out.

const codeConflictingOperation = 117

// leaseRefusal reports whether err is a refusal because another proxy
// holds the writer lease.
func leaseRefusal(err error) bool {
	var se mongo.ServerError
	return errors.As(err, &se) && se.HasErrorCode(codeConflictingOperation) && strings.Contains(err.Error(), "another tsproxy")
}

// insertThroughBoth has clients insert events of one series, client c
// through uris[c%2], and returns the acknowledged events and how many
// batches were refused for the writer lease (each either fully refused or
// fully acknowledged: the refusal comes before any write).
func insertThroughBoth(t *testing.T, ctx context.Context, uris []string, db string, clients, perClient int, base time.Time) ([]sentEvent, int) {
	t.Helper()
	var mu sync.Mutex
	var sent []sentEvent
	refused := 0
	colls := make([]*mongo.Collection, clients)
	for c := range colls {
		colls[c] = connect(t, uris[c%len(uris)]).Database(db).Collection("readings")
	}
	runClients(t, clients, func(c int) error {
		for i := 0; i < perClient; {
			batch := seriesBatch("shared", base, c*perClient+i, min(1+(i+c)%7, perClient-i))
			i += len(batch)
			_, err := colls[c].InsertMany(ctx, eventDocs(batch))
			mu.Lock()
			switch {
			case err == nil:
				sent = append(sent, batch...)
			case leaseRefusal(err):
				refused++
			}
			mu.Unlock()
			if err != nil && !leaseRefusal(err) {
				return err
			}
		}
		return nil
	})
	return sent, refused
}

// TestTwoProxiesOneSeries: 16 clients, half through each of two proxies,
// insert into the same series at once. Every acknowledged event is stored
// exactly once and no bucket passes maxEvents; on FerretDB the proxy
// without the lease refuses its writes clearly (and serves reads), and
// takes over once the holder shuts down.
func TestTwoProxiesOneSeries(t *testing.T) {
	t.Parallel()
	db := uniqueDB(t)
	// The direct path's writer lease (staged inserts take none:
	// TestStageThreeProxies).
	a := startProxy(t, proxyOptions{yaml: readingsRule(db, 100) + "    ingest: direct\n"})
	b := startProxy(t, proxyOptions{yaml: readingsRule(db, 100) + "    ingest: direct\n"})
	ctx := ctxFor(t)
	base := time.Date(2026, 6, 2, 0, 0, 0, 0, time.UTC)

	// a writes first, so on FerretDB a holds the lease.
	first := []sentEvent{{id: bson.NewObjectID(), sensor: "shared", ts: base.Add(-time.Hour), value: 1}}
	if _, err := connect(t, a.URI()).Database(db).Collection("readings").InsertOne(ctx, first[0].doc()); err != nil {
		t.Fatal(err)
	}
	sent, refused := insertThroughBoth(t, ctx, []string{a.URI(), b.URI()}, db, 16, 150, base)
	sent = append(first, sent...)
	checkStored(t, readBuckets(t, ctx, db), sent, 100)
	t.Logf("acknowledged %d events, %d batches refused for the writer lease", len(sent), refused)
	if !leasedWrites(t) {
		if refused != 0 {
			t.Fatalf("%d batches refused on an upstream with isolated updates and retryable writes", refused)
		}
		return
	}
	if refused == 0 || len(sent) != 1+8*150 {
		t.Fatalf("FerretDB: want every batch through b refused and all of a's acknowledged; got %d acknowledged, %d refused", len(sent), refused)
	}
	// Reads through b are served.
	n, err := connect(t, b.URI()).Database(db).Collection("readings").CountDocuments(ctx, bson.D{})
	if err != nil || n != int64(len(sent)) {
		t.Fatalf("count through the proxy without the lease: %d, %v; want %d", n, err, len(sent))
	}
	// a shuts down and gives its lease up. b, having just been refused,
	// answers from what it found for up to a second (leaseRecheck in
	// proxy/writer_lease.go) before it asks the upstream again, then takes
	// the lease: its clients are refused for at most that second.
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := a.srv.Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
	cb := connect(t, b.URI()).Database(db).Collection("readings")
	released := time.Now()
	for k := 0; ; k++ {
		e := sentEvent{id: bson.NewObjectID(), sensor: "shared", ts: base.Add(-time.Hour + time.Duration(k+1)*time.Millisecond), value: 2}
		_, err := cb.InsertOne(ctx, e.doc())
		if err == nil {
			sent = append(sent, e)
			break
		}
		if !leaseRefusal(err) {
			t.Fatalf("insert through b after a shut down: %v", err)
		}
		if time.Since(released) > 5*time.Second {
			t.Fatalf("b still refused %v after a released its lease: %v", time.Since(released), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("b took the lease %v after a released it", time.Since(released).Round(time.Millisecond))
	more, refused := insertThroughBoth(t, ctx, []string{b.URI()}, db, 4, 100, base.Add(16*150*time.Second))
	if refused != 0 {
		t.Fatalf("%d batches refused after the holder shut down", refused)
	}
	checkStored(t, readBuckets(t, ctx, db), append(sent, more...), 100)
}

// TestWriterLeaseLapses: on FerretDB an idle holder's lease lapses and
// another proxy takes it; the old holder, writing again, finds it lost and
// is refused rather than writing beside the new one.
func TestWriterLeaseLapses(t *testing.T) {
	if !leasedWrites(t) {
		t.Skip("writer leases are taken only on upstreams whose updates are not isolated or that keep no retryable writes")
	}
	t.Parallel()
	db := uniqueDB(t)
	short := func(o *proxy.Options) { o.WriterLease = 2 * time.Second }
	a := startProxy(t, proxyOptions{yaml: readingsRule(db, 100) + "    ingest: direct\n", edit: short})
	b := startProxy(t, proxyOptions{yaml: readingsRule(db, 100) + "    ingest: direct\n", edit: short})
	ctx := ctxFor(t)
	ca := connect(t, a.URI()).Database(db).Collection("readings")
	cb := connect(t, b.URI()).Database(db).Collection("readings")
	base := time.Date(2026, 6, 3, 0, 0, 0, 0, time.UTC)
	var sent []sentEvent
	insert := func(coll *mongo.Collection, k int) error {
		e := sentEvent{id: bson.NewObjectID(), sensor: "s", ts: base.Add(time.Duration(k) * time.Second), value: float64(k)}
		_, err := coll.InsertOne(ctx, e.doc())
		if err == nil {
			sent = append(sent, e)
		}
		return err
	}
	if err := insert(ca, 0); err != nil {
		t.Fatal(err)
	}
	if err := insert(cb, 1); !leaseRefusal(err) {
		t.Fatalf("b while a holds the lease: want ConflictingOperationInProgress, got %v", err)
	}
	// 2 s lease + 2/6 s of allowed clock skew.
	time.Sleep(2500 * time.Millisecond)
	if err := insert(cb, 2); err != nil {
		t.Fatalf("b after a's lease lapsed: %v", err)
	}
	if err := insert(ca, 3); !leaseRefusal(err) {
		t.Fatalf("a after b took the lease: want ConflictingOperationInProgress, got %v", err)
	}
	for k := 4; k < 40; k++ {
		if err := insert(cb, k); err != nil {
			t.Fatal(err)
		}
	}
	checkStored(t, readBuckets(t, ctx, db), sent, 100)
	if len(sent) != 38 {
		t.Fatalf("%d events acknowledged, want 38", len(sent))
	}
	// One lease document remains, b's.
	cur, err := direct(t).Database(db).Collection("tsproxy_leases").Find(ctx, bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	var leases []bson.M
	if err := cur.All(ctx, &leases); err != nil {
		t.Fatal(err)
	}
	if len(leases) != 1 || leases[0]["owner"] != fmt.Sprint(hostname(t), "/", b.addr) {
		t.Fatalf("leases: %v, want one of %s", leases, b.addr)
	}
}

// TestTwoProxiesOneCounter: page hits counted through two proxies at once
// add up exactly, slot by slot, and neither proxy refuses any (on
// FerretDB they stage, with no writer lease).
func TestTwoProxiesOneCounter(t *testing.T) {
	t.Parallel()
	db := uniqueDB(t)
	a := startProxy(t, proxyOptions{yaml: counterRule(db)})
	b := startProxy(t, proxyOptions{yaml: counterRule(db)})
	ctx := ctxFor(t)
	const n, clients, batch = 4000, 8, 50
	docs, _ := genHits(n, 11)
	if _, err := connect(t, a.URI()).Database(db).Collection("hits").InsertMany(ctx, docs[:batch]); err != nil {
		t.Fatal(err)
	}
	acked := append([]any{}, docs[:batch]...)
	var mu sync.Mutex
	refused := 0
	per := (n - batch) / clients
	colls := make([]*mongo.Collection, clients)
	for c := range colls {
		colls[c] = connect(t, []string{a.URI(), b.URI()}[c%2]).Database(db).Collection("hits")
	}
	runClients(t, clients, func(c int) error {
		part := docs[batch+c*per : batch+(c+1)*per]
		for lo := 0; lo < len(part); lo += batch {
			chunk := part[lo:min(lo+batch, len(part))]
			_, err := colls[c].InsertMany(ctx, chunk)
			mu.Lock()
			switch {
			case err == nil:
				acked = append(acked, chunk...)
			case leaseRefusal(err) && leasedWrites(t):
				refused++
			}
			mu.Unlock()
			if err != nil && (!leasedWrites(t) || !leaseRefusal(err)) {
				return err
			}
		}
		return nil
	})
	want := map[slotKey]int{}
	for _, d := range acked {
		m := dmap(d.(bson.D))
		want[slotKey{m["page"].(string), m["ts"].(bson.DateTime).Time().Unix()}]++
	}
	t.Logf("%d hits acknowledged, %d batches refused for the writer lease", len(acked), refused)

	got, total := counterBuckets(t, ctx, db)
	if total != int64(len(acked)) {
		t.Fatalf("buckets count %d hits, %d acknowledged", total, len(acked))
	}
	for k, w := range want {
		if got[k] != w {
			t.Fatalf("page %s second %d: counted %d, want %d", k.page, k.sec, got[k], w)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("%d slots counted, want %d", len(got), len(want))
	}
	// Counter inserts stage on FerretDB (no writer lease) and count as
	// $inc upserts on MongoDB: both proxies take every batch.
	if refused != 0 || len(acked) != batch+clients*per {
		t.Fatalf("want every batch acknowledged through both proxies; %d acknowledged, %d refused", len(acked), refused)
	}
	// Either proxy's countDocuments is the number counted.
	for _, p := range []*testProxy{a, b} {
		c, err := connect(t, p.URI()).Database(db).Collection("hits").CountDocuments(ctx, bson.D{})
		if err != nil {
			t.Fatal(err)
		}
		if c != int64(len(acked)) {
			t.Fatalf("countDocuments through %s: %d, want %d", p.addr, c, len(acked))
		}
	}
}

func hostname(t *testing.T) string {
	h, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	return h
}
