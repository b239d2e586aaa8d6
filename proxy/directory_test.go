package proxy

import (
	"strings"
	"testing"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/stage"
)

func TestDirectories(t *testing.T) {
	const ns = "db.c.buckets"
	key := func(s string) bucket.Key { return bucket.Key{Meta: []byte(s)} }
	a, b := key("a"), key("b")
	setup := func() (*directories, *int64, *stage.Known) {
		d := newDirectories()
		term := int64(7)
		return d, &term, d.known(ns, func() int64 { return term })
	}
	loaded := func(k *stage.Known) {
		k.Load("u1", map[string]stage.KnownKey{a.String(): {Next: 3}}, true)
	}

	t.Run("a loaded directory is complete: a key it lacks has no bucket", func(t *testing.T) {
		_, _, k := setup()
		loaded(k)
		got, complete, read := k.Of("u1", []bucket.Key{a, b})
		if !complete || !read || got[a.String()].Next != 3 || got[b.String()].Next != 0 || len(got) != 2 {
			t.Fatalf("Of = %v, %v, %v; want a at 3, b at 0, complete, read", got, complete, read)
		}
	})
	t.Run("a read that could not be complete is remembered, and b is not known", func(t *testing.T) {
		_, _, k := setup()
		k.Load("u1", nil, false)
		got, complete, read := k.Of("u1", []bucket.Key{a, b})
		if complete || !read || len(got) != 0 {
			t.Fatalf("Of = %v, %v, %v; want nothing known, read", got, complete, read)
		}
	})
	for _, tc := range []struct {
		name   string
		change func(d *directories, term *int64) string // the collection the next merge finds
	}{
		{"another term of the lease", func(_ *directories, term *int64) string { *term = 8; return "u1" }},
		{"no term held", func(_ *directories, term *int64) string { *term = 0; return "u1" }},
		{"a write outside merges on this proxy", func(d *directories, _ *int64) string { d.wrote(ns); return "u1" }},
		{"another collection (a drop and create elsewhere)", func(*directories, *int64) string { return "u2" }},
		{"a merge that failed", func(d *directories, _ *int64) string { d.forget(ns); return "u1" }},
	} {
		t.Run("nothing is known after "+tc.name, func(t *testing.T) {
			d, term, k := setup()
			loaded(k)
			n := tc.change(d, term)
			if got, complete, read := k.Of(n, []bucket.Key{a, b}); len(got) != 0 || complete || read {
				t.Fatalf("Of = %v, %v, %v; want nothing", got, complete, read)
			}
			// And it stays so: the directory was dropped.
			if got, _, _ := k.Of("u1", []bucket.Key{a}); len(got) != 0 {
				t.Fatalf("Of again = %v; want nothing", got)
			}
		})
	}
	t.Run("learning keeps the directory; after a write elsewhere only what was learned", func(t *testing.T) {
		d, _, k := setup()
		loaded(k)
		k.Learn("u1", map[string]stage.KnownKey{b.String(): {Next: 1, Last: []byte{5, 0, 0, 0, 0}}})
		got, complete, _ := k.Of("u1", []bucket.Key{a, b})
		if !complete || got[a.String()].Next != 3 || got[b.String()].Next != 1 || got[b.String()].Last == nil {
			t.Fatalf("Of = %v, %v; want a at 3, b at 1 with its last bucket, complete", got, complete)
		}
		d.wrote("other.ns") // another rule's write changes nothing here
		if got, _, _ := k.Of("u1", []bucket.Key{a}); got[a.String()].Next != 3 {
			t.Fatalf("Of = %v after another rule's write", got)
		}
		d.wrote(ns)
		k.Learn("u1", map[string]stage.KnownKey{b.String(): {Next: 2}})
		got, complete, _ = k.Of("u1", []bucket.Key{a, b})
		if complete || len(got) != 1 || got[b.String()].Next != 2 {
			t.Fatalf("Of = %v, %v; want b only, not complete", got, complete)
		}
	})
	t.Run("a directory of no collection stays whole when a merge makes it", func(t *testing.T) {
		_, _, k := setup()
		k.Load("", nil, true)
		k.Learn("u1", map[string]stage.KnownKey{a.String(): {Next: 1}})
		got, complete, _ := k.Of("u1", []bucket.Key{a, b})
		if !complete || got[a.String()].Next != 1 || got[b.String()].Next != 0 {
			t.Fatalf("Of = %v, %v; want a at 1, b at 0, complete", got, complete)
		}
	})
	t.Run("last buckets past the bound keep their next seq only", func(t *testing.T) {
		_, _, k := setup()
		big := []byte(strings.Repeat("x", maxDirectoryBytes/2+1))
		k.Learn("u1", map[string]stage.KnownKey{a.String(): {Next: 1, Last: big}})
		k.Learn("u1", map[string]stage.KnownKey{b.String(): {Next: 1, Last: big}})
		got, _, _ := k.Of("u1", []bucket.Key{a, b})
		if got[a.String()].Last == nil || got[b.String()].Last != nil || got[b.String()].Next != 1 {
			t.Fatalf("a's last kept %v, b's %v (next %d): want a's only", got[a.String()].Last != nil, got[b.String()].Last != nil, got[b.String()].Next)
		}
		// Replacing a key's last bucket frees its bytes.
		k.Learn("u1", map[string]stage.KnownKey{a.String(): {Next: 2, Full: true}})
		k.Learn("u1", map[string]stage.KnownKey{b.String(): {Next: 2, Last: big}})
		if got, _, _ := k.Of("u1", []bucket.Key{b}); got[b.String()].Last == nil {
			t.Fatal("b's last bucket not kept once a's was replaced")
		}
	})
}
