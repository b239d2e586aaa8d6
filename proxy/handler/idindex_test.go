package handler

import (
	"testing"

	"github.com/tsproxy/tsproxy/proxy/engine"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
)

// TestIDIndexCacheBound: the kept indexes stay within their bound, the
// oldest go first, and nil forgets.
func TestIDIndexCacheBound(t *testing.T) {
	c := engine.NewIDIndexCache()
	big := engine.MaxIDIndexCacheBytes / 3
	for _, ns := range []string{"a", "b", "c", "d"} {
		c.Put(ns, &bucket.IDIndexSnapshot{V: 1, Bytes: big})
	}
	if c.Get("a") != nil || c.Get("d") == nil || c.Bytes > engine.MaxIDIndexCacheBytes {
		t.Fatalf("after 4 puts of a third: a=%v d=%v bytes=%d", c.Get("a"), c.Get("d"), c.Bytes)
	}
	c.Put("d", nil)
	if c.Get("d") != nil || c.Bytes != 2*big {
		t.Fatalf("after forgetting d: %v, %d bytes", c.Get("d"), c.Bytes)
	}
	c.Put("huge", &bucket.IDIndexSnapshot{Bytes: engine.MaxIDIndexCacheBytes + 1})
	if c.Get("huge") != nil {
		t.Fatal("kept an index past the bound")
	}
}
