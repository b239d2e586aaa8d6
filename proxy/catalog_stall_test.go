package proxy

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/wire"
)

// catalogStallServer is a fake upstream answering {ok: 1}, and the
// catalog's find with an empty cursor, except the first catalog find: half
// a reply, then nothing (a connection broken mid-reply). unstall closes
// every connection it accepted.
func catalogStallServer(t *testing.T) (addr string, catalogReads *atomic.Int64, unstall func()) {
	t.Helper()
	catalogReads = new(atomic.Int64)
	ok, _ := bson.Marshal(bson.D{{Key: "ok", Value: 1.0}})
	emptyCursor, _ := bson.Marshal(bson.D{{Key: "cursor", Value: bson.D{{Key: "id", Value: int64(0)}, {Key: "ns", Value: "tsproxy.catalog"}, {Key: "firstBatch", Value: bson.A{}}}}, {Key: "ok", Value: 1.0}})
	addr, _, unstall = scriptedUpstream(t, func(m *wire.Msg) ([]byte, bool) {
		if m.CommandName() == "find" && m.DB() == rules.CatalogDB {
			return emptyCursor, catalogReads.Add(1) == 1
		}
		return ok, false
	})
	return addr, catalogReads, unstall
}

// TestStalledCatalogReadBlocksAllClients: the catalog read holds cat.mu,
// and every client's command on any namespace may wait on it. The first
// catalog read stalls; every later one, on a new connection, would be
// answered. Its deadline (Options.CatalogTimeout) ends it, and the
// others go on.
func TestStalledCatalogReadBlocksAllClients(t *testing.T) {
	upAddr, catalogReads, unstall := catalogStallServer(t)
	_, addr := startRawProxy(t, upAddr, func(o *Options) { o.CreateTimeseries, o.CatalogTimeout = "", time.Second }) // auto: the catalog is read
	t.Cleanup(unstall)                                                                                               // runs before the proxy's Shutdown, which would hang otherwise
	a := dialWire(t, addr)
	a.send(0, bson.D{{Key: "find", Value: "x"}, {Key: "$db", Value: "db"}}) // its catalog read stalls
	time.Sleep(300 * time.Millisecond)
	b := dialWire(t, addr)
	b.send(0, bson.D{{Key: "find", Value: "y"}, {Key: "$db", Value: "other"}})
	if _, _, err := b.read(5 * time.Second); err != nil {
		t.Fatalf("another client's find got no reply within 5s (catalog reads sent: %d): %v", catalogReads.Load(), err)
	}
}

// TestShutdownHangsOnStalledCatalogRead: Shutdown(ctx) promises to
// close the rest when ctx ends; a connection waiting on the catalog read
// is not unblocked by forceClose alone (cat.close is deferred until every
// connection is gone): Shutdown ends the catalog's context too. The
// catalog's own deadline is far off here.
func TestShutdownHangsOnStalledCatalogRead(t *testing.T) {
	upAddr, _, unstall := catalogStallServer(t)
	s, addr := startRawProxy(t, upAddr, func(o *Options) { o.CreateTimeseries = "" })
	t.Cleanup(unstall)
	a := dialWire(t, addr)
	a.send(0, bson.D{{Key: "find", Value: "x"}, {Key: "$db", Value: "db"}})
	time.Sleep(300 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Shutdown(ctx) }()
	select {
	case err := <-done:
		t.Logf("Shutdown returned %v", err)
	case <-time.After(5 * time.Second):
		unstall() // let it finish
		<-done
		t.Fatal("Shutdown with a 1s deadline had not returned after 5s")
	}
}
