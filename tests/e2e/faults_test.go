package e2e

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// upstreamDownError asserts err is the proxy's prompt answer for an
// unreachable upstream.
func upstreamDownError(t testing.TB, what string, err error, elapsed time.Duration) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s succeeded with the upstream down", what)
	}
	if elapsed > 10*time.Second {
		t.Fatalf("%s took %v to fail with the upstream down: %v", what, elapsed, err)
	}
	var ce mongo.CommandError
	if errors.As(err, &ce) {
		if ce.Code != 6 || ce.Name != "HostUnreachable" || !strings.Contains(ce.Message, "upstream") {
			t.Fatalf("%s: want HostUnreachable naming the upstream, got %+v", what, ce)
		}
	} else if !strings.Contains(err.Error(), "HostUnreachable") && !strings.Contains(err.Error(), "upstream") {
		t.Fatalf("%s: error does not say the upstream is unreachable: %v", what, err)
	}
	t.Logf("%s failed after %v: %v", what, elapsed.Round(time.Millisecond), err)
}

// TestFaultUpstreamDownAndBack: the upstream goes away under a working
// client (a relay stops); operations fail promptly with an error naming the
// upstream; when it returns, the same client, through the same proxy,
// works again.
func TestFaultUpstreamDownAndBack(t *testing.T) {
	t.Parallel()
	r := newRelay(t, upstreamAddr(t))
	p := startProxy(t, proxyOptions{upstreamURI: r.URI()})
	// The driver's default configuration: no client-wide timeout. (With
	// one, the driver retries a read refused with HostUnreachable until
	// the timeout: see TestFaultUpstreamBackWithinTimeout.)
	c := connectNoTimeout(t, p.URI())
	coll := c.Database(uniqueDB(t)).Collection("down")
	ctx := ctxFor(t)
	if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 1}}); err != nil {
		t.Fatalf("insert with the upstream up: %v", err)
	}

	r.Stop()
	// Operations without a deadline: with one, the driver retries a read
	// refused with HostUnreachable until the deadline (see
	// TestFaultUpstreamBackWithinTimeout). A watchdog catches a hang.
	within := func(what string, op func() error) {
		t.Helper()
		done := make(chan error, 1)
		start := time.Now()
		go func() { done <- op() }()
		select {
		case err := <-done:
			upstreamDownError(t, what, err, time.Since(start))
		case <-time.After(20 * time.Second):
			t.Fatalf("%s hangs with the upstream down", what)
		}
	}
	bg := context.Background()
	within("insert", func() error {
		_, err := coll.InsertOne(bg, bson.D{{Key: "_id", Value: 2}})
		return err
	})
	within("find", func() error { return coll.FindOne(bg, bson.D{{Key: "_id", Value: 1}}).Err() })
	within("ping", func() error { return c.Ping(bg, nil) })
	within("aggregate", func() error {
		_, err := coll.Aggregate(bg, bson.A{})
		return err
	})

	// A client that connects while the upstream is down gets the same
	// prompt error rather than a server selection timeout.
	late := connectNoTimeout(t, p.URI())
	within("ping of a new client", func() error {
		return late.Database("admin").RunCommand(bg, bson.D{{Key: "ping", Value: 1}}).Err()
	})

	r.Start()
	if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 3}}); err != nil {
		t.Fatalf("insert after the upstream came back: %v", err)
	}
	n, err := coll.CountDocuments(ctx, bson.D{})
	if err != nil || n != 2 {
		t.Fatalf("after recovery the collection counts %d, %v; want 2 (_id 1 and 3)", n, err)
	}
	if err := late.Ping(ctx, nil); err != nil {
		t.Fatalf("new client after recovery: %v", err)
	}
	// What failed while the upstream was down was not written.
	if err := direct(t).Database(coll.Database().Name()).Collection("down").FindOne(ctx, bson.D{{Key: "_id", Value: 2}}).Err(); !errors.Is(err, mongo.ErrNoDocuments) {
		t.Fatalf("_id 2, refused while the upstream was down, reads as %v", err)
	}
}

// TestFaultUpstreamDownAtStart: a proxy whose upstream has never been
// reachable still answers the handshake, so drivers fail each operation at
// once with the upstream error; the proxy serves as soon as it appears.
func TestFaultUpstreamDownAtStart(t *testing.T) {
	t.Parallel()
	r := newRelay(t, upstreamAddr(t))
	r.Stop()
	p := startProxy(t, proxyOptions{upstreamURI: r.URI()})
	c := connectNoTimeout(t, p.URI())
	ctx := ctxFor(t)
	start := time.Now()
	err := c.Ping(ctx, nil)
	upstreamDownError(t, "ping", err, time.Since(start))
	r.Start()
	if err := c.Ping(ctx, nil); err != nil {
		t.Fatalf("ping after the upstream appeared: %v", err)
	}
}

// TestFaultUpstreamBackWithinTimeout: with a client-wide timeout (CSOT),
// the driver retries a read refused with HostUnreachable for as long as the
// timeout allows; if the upstream returns meanwhile, the read succeeds; if
// not, it fails when the timeout ends, not later.
func TestFaultUpstreamBackWithinTimeout(t *testing.T) {
	t.Parallel()
	r := newRelay(t, upstreamAddr(t))
	p := startProxy(t, proxyOptions{upstreamURI: r.URI()})
	c := connect(t, p.URI())
	coll := c.Database(uniqueDB(t)).Collection("back")
	if _, err := coll.InsertOne(ctxFor(t), bson.D{{Key: "_id", Value: 1}}); err != nil {
		t.Fatal(err)
	}
	r.Stop()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: 1}}).Err()
	el := time.Since(start)
	if err == nil {
		t.Fatal("find succeeded with the upstream down")
	}
	if el > 5*time.Second {
		t.Fatalf("find with a 2s timeout failed only after %v: %v", el, err)
	}

	restarted := make(chan struct{})
	time.AfterFunc(time.Second, func() { r.Start(); close(restarted) })
	ctx2, cancel2 := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel2()
	var got struct {
		ID int32 `bson:"_id"`
	}
	err = coll.FindOne(ctx2, bson.D{{Key: "_id", Value: 1}}).Decode(&got)
	<-restarted
	if err != nil || got.ID != 1 {
		t.Fatalf("find across the upstream's return: %+v, %v", got, err)
	}
}

// TestShutdownIdleClient: Shutdown closes an idle client connection at
// once, returns promptly, and the proxy accepts no new connection.
func TestShutdownIdleClient(t *testing.T) {
	t.Parallel()
	p := startProxy(t, proxyOptions{})
	idle := dialRaw(t, p.addr)
	idle.ping()
	cl := connect(t, p.URI())
	if err := cl.Ping(ctxFor(t), nil); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	if err := p.srv.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("Shutdown with only idle clients took %v", el)
	}
	idle.expectClosed(2 * time.Second)
	if p.srv.Connections() != 0 {
		t.Fatalf("%d connections after Shutdown", p.srv.Connections())
	}
	if nc, err := net.DialTimeout("tcp", p.addr, time.Second); err == nil {
		nc.Close()
		t.Fatal("the proxy accepted a connection after Shutdown")
	}
	start = time.Now()
	err := cl.Ping(ctxFor(t), nil)
	if err == nil {
		t.Fatal("a driver ping succeeded after Shutdown")
	}
	if el := time.Since(start); el > 15*time.Second {
		t.Fatalf("driver ping after Shutdown took %v to fail", el)
	}
}

// TestShutdownInFlight: a request the proxy is serving when Shutdown comes
// (the upstream made slow by a relay) is answered in full; the connection
// closes after the reply; Shutdown waits for it.
func TestShutdownInFlight(t *testing.T) {
	t.Parallel()
	r := newRelay(t, upstreamAddr(t))
	p := startProxy(t, proxyOptions{upstreamURI: r.URI()})
	db := uniqueDB(t)

	// A raw client: exactly one request in flight.
	raw := dialRaw(t, p.addr)
	raw.ping()
	// A driver client writing when Shutdown comes.
	cl := connect(t, p.URI())
	coll := cl.Database(db).Collection("inflight")
	if err := cl.Ping(ctxFor(t), nil); err != nil {
		t.Fatal(err)
	}

	const delay = 1500 * time.Millisecond
	r.SetDelay(delay)
	rawID := raw.sendMsg(marshal(t, bson.D{{Key: "insert", Value: "inflight"}, {Key: "documents", Value: bson.A{bson.D{{Key: "_id", Value: "raw"}}}}, {Key: "$db", Value: db}}), 0)
	insErr := make(chan error, 1)
	go func() {
		_, err := coll.InsertOne(context.Background(), bson.D{{Key: "_id", Value: "driver"}})
		insErr <- err
	}()
	time.Sleep(300 * time.Millisecond) // both requests are with the upstream now

	shutErr := make(chan error, 1)
	start := time.Now()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		shutErr <- p.srv.Shutdown(ctx)
	}()
	// New connections are refused as soon as Shutdown begins.
	deadline := time.Now().Add(time.Second)
	for {
		nc, err := net.DialTimeout("tcp", p.addr, time.Second)
		if err != nil {
			break
		}
		nc.Close()
		if time.Now().After(deadline) {
			t.Fatal("the proxy still accepts connections during Shutdown")
		}
		time.Sleep(10 * time.Millisecond)
	}

	reply := raw.readMsgReply(rawID)
	t.Logf("in-flight reply after %v", time.Since(start))
	if ok, _ := reply.Lookup("ok").AsFloat64OK(); ok != 1 {
		t.Fatalf("in-flight insert: %v", reply)
	}
	if n, _ := reply.Lookup("n").AsInt64OK(); n != 1 {
		t.Fatalf("in-flight insert wrote n=%v", reply.Lookup("n"))
	}
	raw.expectClosed(5 * time.Second)
	t.Logf("raw closed after %v", time.Since(start))
	if err := <-insErr; err != nil {
		t.Fatalf("driver insert in flight at Shutdown: %v", err)
	}
	t.Logf("driver insert done after %v", time.Since(start))
	if err := <-shutErr; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	t.Logf("Shutdown done after %v", time.Since(start))
	if el := time.Since(start); el > delay+5*time.Second {
		t.Fatalf("Shutdown took %v", el)
	}
	// The proxy is gone: a bounded Disconnect (its endSessions would wait
	// out server selection).
	dctx, dcancel := context.WithTimeout(context.Background(), time.Second)
	defer dcancel()
	_ = cl.Disconnect(dctx)
	r.SetDelay(0)
	n, err := direct(t).Database(db).Collection("inflight").CountDocuments(ctxFor(t), bson.D{})
	if err != nil || n != 2 {
		t.Fatalf("the upstream holds %d in-flight documents, %v; want 2", n, err)
	}
}

// TestShutdownDeadline: a request still in flight when Shutdown's context
// ends is cut off: Shutdown returns the context's error promptly and the
// connection is closed.
func TestShutdownDeadline(t *testing.T) {
	t.Parallel()
	r := newRelay(t, upstreamAddr(t))
	p := startProxy(t, proxyOptions{upstreamURI: r.URI()})
	raw := dialRaw(t, p.addr)
	raw.ping()
	r.SetDelay(20 * time.Second)
	raw.sendMsg(marshal(t, bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}}), 0)
	time.Sleep(200 * time.Millisecond)

	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := p.srv.Shutdown(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown = %v, want context.DeadlineExceeded", err)
	}
	if el := time.Since(start); el > 3*time.Second {
		t.Fatalf("Shutdown past its deadline took %v", el)
	}
	raw.expectClosed(3 * time.Second)
	if p.srv.Connections() != 0 {
		t.Fatalf("%d connections after a forced Shutdown", p.srv.Connections())
	}
	r.Stop() // release the relay's sleeping copy
}
