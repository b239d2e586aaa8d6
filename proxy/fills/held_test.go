package fills

import (
	"testing"
	"time"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
)

// TestHeldReleases: a Locker's release forgets the fills it held (the
// plan changed their buckets), ReleaseAll frees every key still held
// and keeps their fills, and wrote hears each namespace locked.
func TestHeldReleases(t *testing.T) {
	c := New(10)
	a := bucket.Key{Meta: []byte{0x0A}, Start: 0}
	b := bucket.Key{Meta: []byte{0x0A}, Start: 3_600_000}
	var wrote []string
	h := NewHeld(c, func(ns string) { wrote = append(wrote, ns) })

	h.Lock("db.b", []bucket.Key{a}).Set(a, bucket.Fill{Seq: 2, Known: true})
	release := h.Locker("db.b")([]bucket.Key{b})
	h.held[1].Set(b, bucket.Fill{Seq: 1, Known: true})
	release()
	h.ReleaseAll()
	if len(h.held) != 0 || len(wrote) != 2 {
		t.Fatalf("held %d, wrote %v", len(h.held), wrote)
	}

	locked := make(chan *Locked)
	go func() { locked <- c.Lock("db.b", []bucket.Key{a, b}) }()
	select {
	case l := <-locked:
		defer l.Unlock()
		if f := l.Fill(a); !f.Known || f.Seq != 2 {
			t.Errorf("fill of a after ReleaseAll: %+v, want seq 2 kept", f)
		}
		if f := l.Fill(b); f.Known {
			t.Errorf("fill of b after its release: %+v, want forgotten", f)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("keys still locked after ReleaseAll")
	}
}
