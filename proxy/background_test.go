package proxy

import (
	"bufio"
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/proxy/exec"
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/upstream"
	"github.com/tsproxy/tsproxy/wire"
)

// okServer is a wire server that answers every command {ok: 1},
// counting the connections it accepted.
func okServer(t *testing.T) (addr string, accepted *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted = new(atomic.Int64)
	ok, err := bson.Marshal(bson.D{{Key: "ok", Value: 1.0}})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			go func() {
				defer nc.Close()
				r := bufio.NewReader(nc)
				for {
					h, _, err := wire.ReadMessage(r, nil, 0)
					if err != nil {
						return
					}
					if _, err := nc.Write(wire.AppendMsg(nil, h.RequestID+1, h.RequestID, 0, ok)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), accepted
}

// TestBackgroundConnsPooled: the background loops' rounds take their
// connection from the proxy's pool and give it back, so rounds after the
// first dial nothing; a failed round closes its connection and the idle
// ones, and the next round dials; a connection whose loop ended is not
// pooled.
func TestBackgroundConnsPooled(t *testing.T) {
	addr, accepted := okServer(t)
	d, err := upstream.NewDialer(upstream.Options{URI: "mongodb://" + addr})
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{background: exec.NewPool(d.Dial, backgroundMaxIdle)}
	defer s.background.Close()
	ctx, cancel := context.WithCancel(context.Background())
	b := exec.NewBackground(ctx, s.background)
	round := func() *upstream.Conn {
		t.Helper()
		up, err := b.Get()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := up.Command(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}}); err != nil {
			t.Fatal(err)
		}
		return up
	}
	first := round()
	b.Release()
	for range 5 {
		if up := round(); up != first {
			t.Fatal("a round after a released one dialled a connection of its own")
		}
		b.Release()
	}
	if n := accepted.Load(); n != 1 {
		t.Fatalf("%d connections for 6 rounds, want 1", n)
	}
	if n := s.BackgroundConns(); n != 1 {
		t.Fatalf("BackgroundConns %d, want the 1 pooled", n)
	}
	// Two loops at once: a second connection, both pooled after.
	other := exec.NewBackground(ctx, s.background)
	round()
	if _, err := other.Get(); err != nil {
		t.Fatal(err)
	}
	b.Release()
	other.Release()
	if n := accepted.Load(); n != 2 {
		t.Fatalf("%d connections for two loops, want 2", n)
	}
	if n := s.BackgroundConns(); n != 2 {
		t.Fatalf("BackgroundConns %d, want 2", n)
	}
	round()
	b.Fail()
	if got, n := s.background.Idle(), s.BackgroundConns(); got != 0 || n != 0 {
		t.Fatalf("%d idle connections and %d open after a failed round, want none", got, n)
	}
	round()
	if n := accepted.Load(); n != 3 {
		t.Fatalf("%d connections after a failed round, want a third", n)
	}
	cancel() // the loop ends: its connection closes, and is not pooled
	b.Release()
	if got := s.background.Idle(); got != 0 {
		t.Fatalf("%d idle connections after the loop ended, want none", got)
	}
	for deadline := time.Now().Add(5 * time.Second); s.BackgroundConns() != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) { // the close runs in a goroutine of its own
			t.Fatalf("BackgroundConns %d after the loop ended, want 0", s.BackgroundConns())
		}
	}
}

// listRunner answers listCollections with collections named, counting
// the listings; fail, when set, fails the next one.
type listRunner struct {
	t     *testing.T
	names []string
	n     int
	fail  error
}

func (l *listRunner) RunStep(step rewrite.Step) ([][]byte, error) {
	l.n++
	if l.fail != nil {
		err := l.fail
		l.fail = nil
		return nil, err
	}
	return [][]byte{listReply(l.t, "iot", l.names...)}, nil
}

// listReply is a one-batch listCollections reply of db naming names.
func listReply(t *testing.T, db string, names ...string) []byte {
	var batch bson.A
	for _, n := range names {
		batch = append(batch, bson.D{{Key: "name", Value: n}, {Key: "type", Value: "collection"}})
	}
	return doc(t, bson.D{{Key: "cursor", Value: bson.D{{Key: "id", Value: int64(0)}, {Key: "ns", Value: db + ".$cmd.listCollections"}, {Key: "firstBatch", Value: batch}}}, {Key: "ok", Value: 1.0}})
}

// TestDBListingsShared: the rules of one database share a listing for
// listingShared, each reading its own work from it; another database, a
// later round and a failed listing list again.
func TestDBListingsShared(t *testing.T) {
	rule := func(coll string) *rules.Rule {
		return &rules.Rule{Namespace: "iot." + coll, DB: "iot", Collection: coll, TimeField: "ts", Span: time.Hour,
			BucketCollection: coll + ".buckets", Layout: rules.LayoutEvents}
	}
	a, b := rule("a"), rule("b")
	other := rule("c")
	other.DB, other.Namespace = "farm", "farm.c"
	r := &listRunner{t: t, names: []string{"a.buckets", stage.OpenCollection(a, 0, stage.Stager{})}}
	l := newDBListings()
	t0 := time.Unix(1000, 0)
	check := func(rule *rules.Rule, at time.Duration, wantWork bool, wantListings int) {
		t.Helper()
		_, work, err := l.stagedWork(r, rule, t0.Add(at))
		if err != nil {
			t.Fatal(err)
		}
		if work != wantWork || r.n != wantListings {
			t.Fatalf("%s at %v: work %v after %d listings, want %v after %d", rule.Namespace, at, work, r.n, wantWork, wantListings)
		}
	}
	check(a, 0, true, 1)
	check(b, 100*time.Millisecond, false, 1) // a's listing: b has nothing staged
	check(a, 200*time.Millisecond, true, 1)
	check(other, 200*time.Millisecond, false, 2) // another database lists its own
	check(b, listingShared, false, 3)            // too old: listed again
	r.fail = errors.New("connection reset")
	if _, _, err := l.stagedWork(r, a, t0.Add(2*listingShared)); err == nil {
		t.Fatal("a failed listing answered")
	}
	check(a, 2*listingShared+time.Millisecond, true, 5) // the failure was not kept
}

func doc(t *testing.T, d bson.D) []byte {
	t.Helper()
	b, err := bson.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
