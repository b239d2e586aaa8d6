package proxy

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/upstream"
)

// TestShutdownBeforeServe: a Shutdown that runs before Serve has set up
// its listener must still make Serve return (and not accept forever).
func TestShutdownBeforeServe(t *testing.T) {
	d, err := upstream.NewDialer(upstream.Options{URI: "mongodb://127.0.0.1:1/"})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{Dialer: d})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve after Shutdown: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after Shutdown")
	}
	if c, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second); err == nil {
		c.Close()
		t.Fatal("listener still accepts after Shutdown")
	}
}

// TestIDIndexCacheBound: the kept indexes stay within their bound, the
// oldest go first, and nil forgets.
func TestIDIndexCacheBound(t *testing.T) {
	c := newIDIndexCache()
	big := maxIDIndexCacheBytes / 3
	for _, ns := range []string{"a", "b", "c", "d"} {
		c.Put(ns, &bucket.IDIndexSnapshot{V: 1, Bytes: big})
	}
	if c.Get("a") != nil || c.Get("d") == nil || c.bytes > maxIDIndexCacheBytes {
		t.Fatalf("after 4 puts of a third: a=%v d=%v bytes=%d", c.Get("a"), c.Get("d"), c.bytes)
	}
	c.Put("d", nil)
	if c.Get("d") != nil || c.bytes != 2*big {
		t.Fatalf("after forgetting d: %v, %d bytes", c.Get("d"), c.bytes)
	}
	c.Put("huge", &bucket.IDIndexSnapshot{Bytes: maxIDIndexCacheBytes + 1})
	if c.Get("huge") != nil {
		t.Fatal("kept an index past the bound")
	}
}
