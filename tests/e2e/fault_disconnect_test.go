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

	"github.com/tsproxy/tsproxy/proxy"
	"github.com/tsproxy/tsproxy/wire"
)

// waitReleased waits until the proxy holds no client connection, no
// upstream connection and no cursor, and the relay in front of the
// upstream carries no connection: what the proxy says and what the
// upstream sees agree. It returns how long that took.
func waitReleased(t *testing.T, p *testProxy, r *relay, what string) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(10 * time.Second)
	for {
		st := p.srv.Stats()
		// The proxy's background rounds keep a few connections of their
		// own open (proxy/background.go): not the clients'.
		if st == (proxy.Stats{}) && r.Open() <= p.srv.BackgroundConns() {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: 10s later the proxy still holds %+v, the relay %d upstream connections (%d of them the background's)", what, st, r.Open(), p.srv.BackgroundConns())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestFaultClientDisconnects: a client that goes away
// mid-message, mid-reply or with open cursors leaves nothing behind: its
// client and upstream connections close, its cursors leave the registry
// and are killed upstream; a cursor of a client still connected stays.
func TestFaultClientDisconnects(t *testing.T) {
	t.Parallel()
	db := uniqueDB(t)
	r := newRelay(t, upstreamAddr(t))
	yaml := readingsRule(db, 1000) + fmt.Sprintf(`  - namespace: %s.small
    timeField: ts
    metaField: sensorId
`, db)
	p := startProxy(t, proxyOptions{yaml: yaml, upstreamURI: r.URI()})
	ctx := ctxFor(t)
	base := time.Date(2026, 9, 1, 0, 0, 0, 0, time.UTC)
	// 500 events of ~4 KiB: a first batch of all of them is ~2 MB, more
	// than socket buffers hold, so a reply can be cut midway.
	evs := seriesEvents(500, "s1", base)
	// Not NUL bytes: FerretDB's postgresql handler stores documents as
	// jsonb, which refuses \u0000 in strings.
	pad := strings.Repeat("x", 4000)
	docs := make([]any, len(evs))
	for i, e := range evs {
		docs[i] = append(e.doc(), bson.E{Key: "pad", Value: pad})
	}
	setup := connectNoTimeout(t, p.URI())
	if _, err := setup.Database(db).Collection("readings").InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}
	// Small events for the cursors a driver keeps open.
	if _, err := setup.Database(db).Collection("small").InsertMany(ctx, docsOf(seriesEvents(200, "s2", base))); err != nil {
		t.Fatal(err)
	}
	if err := setup.Disconnect(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("setup client gone: released after %v", waitReleased(t, p, r, "setup client"))

	findCmd := func(batch int) []byte {
		return marshal(t, bson.D{{Key: "find", Value: "readings"}, {Key: "filter", Value: bson.D{}}, {Key: "batchSize", Value: batch}, {Key: "$db", Value: db}})
	}

	t.Run("midMessage", func(t *testing.T) {
		raw := dialRaw(t, p.addr)
		raw.ping() // the upstream connection is open now
		frame := wire.AppendMsg(nil, raw.nextID(), 0, 0, findCmd(10))
		raw.write(frame[:len(frame)/2])
		// Exactly the client's connection, besides those the proxy's
		// background work (merges, lease renewals) keeps through the
		// relay (proxy/background.go); one being dialled or closed is
		// given until it settles.
		deadline := time.Now().Add(10 * time.Second)
		settled := false
		for !settled && time.Now().Before(deadline) {
			settled = p.srv.Stats().UpstreamConns == 1 && r.Open() == 1+p.srv.BackgroundConns()
			if !settled {
				time.Sleep(10 * time.Millisecond)
			}
		}
		if !settled {
			t.Fatalf("before the disconnect: %+v, relay %d, the background's %d", p.srv.Stats(), r.Open(), p.srv.BackgroundConns())
		}
		raw.nc.Close()
		t.Logf("released after %v", waitReleased(t, p, r, "mid-message"))
	})

	t.Run("midReply", func(t *testing.T) {
		raw := dialRaw(t, p.addr)
		// 499 of the 500: a cursor stays open whatever the plan (a read
		// the proxy serves itself knows when its batch took the last).
		raw.sendMsg(findCmd(499), 0)
		// Read a little of the reply, then go away.
		_ = raw.nc.SetReadDeadline(time.Now().Add(20 * time.Second))
		var buf [256]byte
		if _, err := raw.nc.Read(buf[:]); err != nil {
			t.Fatalf("first bytes of the reply: %v", err)
		}
		if p.srv.Stats().Cursors != 1 {
			t.Fatalf("the find opened no cursor: %+v", p.srv.Stats())
		}
		raw.nc.Close()
		t.Logf("released after %v", waitReleased(t, p, r, "mid-reply"))
	})

	t.Run("openCursors", func(t *testing.T) {
		keep := connectNoTimeout(t, p.URI())
		kept, err := keep.Database(db).Collection("small").Find(ctx, bson.D{}, options.Find().SetBatchSize(10))
		if err != nil {
			t.Fatal(err)
		}
		gone := connectNoTimeout(t, p.URI())
		var ids []int64
		for i := 0; i < 3; i++ {
			cur, err := gone.Database(db).Collection("small").Find(ctx, bson.D{}, options.Find().SetBatchSize(10))
			if err != nil {
				t.Fatal(err)
			}
			if !cur.Next(ctx) {
				t.Fatalf("cursor %d: %v", i, cur.Err())
			}
			ids = append(ids, cur.ID())
		}
		if st := p.srv.Stats(); st.Cursors != 4 {
			t.Fatalf("4 cursors open, the registry holds %d", st.Cursors)
		}
		// Disconnect without closing the cursors, as a client that exits.
		if err := gone.Disconnect(ctx); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for p.srv.Stats().Cursors != 1 {
			if time.Now().After(deadline) {
				t.Fatalf("after the disconnect the registry holds %d cursors, want 1", p.srv.Stats().Cursors)
			}
			time.Sleep(10 * time.Millisecond)
		}
		// Upstream, the gone client's cursors are killed; the other lives.
		up := direct(t).Database(db)
		for _, id := range ids {
			err := up.RunCommand(ctx, bson.D{{Key: "getMore", Value: id}, {Key: "collection", Value: "small.buckets"}}).Err()
			var ce mongo.CommandError
			if !errors.As(err, &ce) || ce.Code != 43 {
				t.Fatalf("upstream getMore of a released cursor %d: want CursorNotFound, got %v", id, err)
			}
		}
		n := 0
		for n < 25 && kept.Next(ctx) {
			n++
		}
		if kept.Err() != nil || n != 25 {
			t.Fatalf("the connected client's cursor read %d of 25 events: %v", n, kept.Err())
		}
		_ = kept.Close(ctx)
		if err := keep.Disconnect(ctx); err != nil {
			t.Fatal(err)
		}
		t.Logf("released after %v", waitReleased(t, p, r, "open cursors"))
	})

	// The proxy still serves.
	c := connectNoTimeout(t, p.URI())
	n, err := c.Database(db).Collection("readings").CountDocuments(context.Background(), bson.D{})
	if err != nil || n != int64(len(evs)) {
		t.Fatalf("after the disconnects: count %d, %v; want %d", n, err, len(evs))
	}
}
