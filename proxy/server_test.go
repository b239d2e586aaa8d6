package proxy

import (
	"context"
	"net"
	"testing"
	"time"

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
