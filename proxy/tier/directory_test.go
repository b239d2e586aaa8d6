package tier

import (
	"strconv"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/stage"
)

func TestDirectories(t *testing.T) {
	const ns = "db.c.buckets"
	key := func(s string) bucket.Key { return bucket.Key{Meta: []byte(s)} }
	a, b := key("a"), key("b")
	setup := func() (*Directories, *int64, *stage.Known) {
		d := NewDirectories()
		term := int64(7)
		return d, &term, d.Known(ns, func() int64 { return term })
	}
	loaded := func(k *stage.Known) {
		k.Dir.Load("u1", map[string]stage.KnownKey{a.String(): {Next: 3}}, true)
	}

	t.Run("a loaded directory is complete: a key it lacks has no bucket", func(t *testing.T) {
		_, _, k := setup()
		loaded(k)
		got, complete, read := k.Dir.Of("u1", []bucket.Key{a, b})
		if !complete || !read || got[a.String()].Next != 3 || got[b.String()].Next != 0 || len(got) != 2 {
			t.Fatalf("Of = %v, %v, %v; want a at 3, b at 0, complete, read", got, complete, read)
		}
	})
	t.Run("a read that could not be complete is remembered, and b is not known", func(t *testing.T) {
		_, _, k := setup()
		k.Dir.Load("u1", nil, false)
		got, complete, read := k.Dir.Of("u1", []bucket.Key{a, b})
		if complete || !read || len(got) != 0 {
			t.Fatalf("Of = %v, %v, %v; want nothing known, read", got, complete, read)
		}
	})
	for _, tc := range []struct {
		name   string
		change func(d *Directories, term *int64) string // the collection the next merge finds
	}{
		{"another term of the lease", func(_ *Directories, term *int64) string { *term = 8; return "u1" }},
		{"no term held", func(_ *Directories, term *int64) string { *term = 0; return "u1" }},
		{"a write outside merges on this proxy", func(d *Directories, _ *int64) string { d.Wrote(ns); return "u1" }},
		{"another collection (a drop and create elsewhere)", func(*Directories, *int64) string { return "u2" }},
		{"a merge that failed", func(d *Directories, _ *int64) string { d.Forget(ns); return "u1" }},
	} {
		t.Run("nothing is known after "+tc.name, func(t *testing.T) {
			d, term, k := setup()
			loaded(k)
			n := tc.change(d, term)
			if got, complete, read := k.Dir.Of(n, []bucket.Key{a, b}); len(got) != 0 || complete || read {
				t.Fatalf("Of = %v, %v, %v; want nothing", got, complete, read)
			}
			// And it stays so: the directory was dropped.
			if got, _, _ := k.Dir.Of("u1", []bucket.Key{a}); len(got) != 0 {
				t.Fatalf("Of again = %v; want nothing", got)
			}
		})
	}
	t.Run("learning keeps the directory; after a write elsewhere only what was learned", func(t *testing.T) {
		d, _, k := setup()
		loaded(k)
		k.Dir.Learn("u1", map[string]stage.KnownKey{b.String(): {Next: 1, Last: []byte{5, 0, 0, 0, 0}}})
		got, complete, _ := k.Dir.Of("u1", []bucket.Key{a, b})
		if !complete || got[a.String()].Next != 3 || got[b.String()].Next != 1 || got[b.String()].Last == nil {
			t.Fatalf("Of = %v, %v; want a at 3, b at 1 with its last bucket, complete", got, complete)
		}
		d.Wrote("other.ns") // another rule's write changes nothing here
		if got, _, _ := k.Dir.Of("u1", []bucket.Key{a}); got[a.String()].Next != 3 {
			t.Fatalf("Of = %v after another rule's write", got)
		}
		d.Wrote(ns)
		k.Dir.Learn("u1", map[string]stage.KnownKey{b.String(): {Next: 2}})
		got, complete, _ = k.Dir.Of("u1", []bucket.Key{a, b})
		if complete || len(got) != 1 || got[b.String()].Next != 2 {
			t.Fatalf("Of = %v, %v; want b only, not complete", got, complete)
		}
	})
	t.Run("a directory of no collection stays whole when a merge makes it", func(t *testing.T) {
		_, _, k := setup()
		k.Dir.Load("", nil, true)
		k.Dir.Learn("u1", map[string]stage.KnownKey{a.String(): {Next: 1}})
		got, complete, _ := k.Dir.Of("u1", []bucket.Key{a, b})
		if !complete || got[a.String()].Next != 1 || got[b.String()].Next != 0 {
			t.Fatalf("Of = %v, %v; want a at 1, b at 0, complete", got, complete)
		}
	})
	t.Run("last buckets past the bound keep their next seq only", func(t *testing.T) {
		_, _, k := setup()
		big := []byte(strings.Repeat("x", maxDirectoryBytes/2+1))
		k.Dir.Learn("u1", map[string]stage.KnownKey{a.String(): {Next: 1, Last: big}})
		k.Dir.Learn("u1", map[string]stage.KnownKey{b.String(): {Next: 1, Last: big}})
		got, _, _ := k.Dir.Of("u1", []bucket.Key{a, b})
		if got[a.String()].Last == nil || got[b.String()].Last != nil || got[b.String()].Next != 1 {
			t.Fatalf("a's last kept %v, b's %v (next %d): want a's only", got[a.String()].Last != nil, got[b.String()].Last != nil, got[b.String()].Next)
		}
		// Replacing a key's last bucket frees its bytes.
		k.Dir.Learn("u1", map[string]stage.KnownKey{a.String(): {Next: 2, Full: true}})
		k.Dir.Learn("u1", map[string]stage.KnownKey{b.String(): {Next: 2, Last: big}})
		if got, _, _ := k.Dir.Of("u1", []bucket.Key{b}); got[b.String()].Last == nil {
			t.Fatal("b's last bucket not kept once a's was replaced")
		}
	})
}

func TestRecordCache(t *testing.T) {
	const ns = "db.c.buckets"
	setup := func() (*Directories, *int64, *stage.RecordCache) {
		d := NewDirectories()
		term := int64(7)
		return d, &term, d.RecordCache(ns, func() int64 { return term })
	}
	set := func(n int) *stage.RecordSet {
		s := stage.NewRecordSet()
		for i := range n {
			s.Add("1", 1000, []bson.ObjectID{{11: byte(i)}})
		}
		return s
	}
	t.Run("kept for the same term and collection", func(t *testing.T) {
		_, _, c := setup()
		s := set(2)
		c.Put("u1", s)
		if got := c.Get("u1"); got != s {
			t.Fatal("the records put are not kept")
		}
	})
	t.Run("records of no collection are the merge's that made it", func(t *testing.T) {
		_, _, c := setup()
		s := set(1)
		c.Put("", s)
		if got := c.Get("u1"); got != s {
			t.Fatal("the records of no collection were not kept for the one the merge made")
		}
		if got := c.Get("u2"); got != nil {
			t.Fatal("kept for a collection made after the one the merge made")
		}
	})
	for _, tc := range []struct {
		name   string
		change func(d *Directories, term *int64, c *stage.RecordCache) string
	}{
		{"another term", func(_ *Directories, term *int64, _ *stage.RecordCache) string { *term = 8; return "u1" }},
		{"no term", func(_ *Directories, term *int64, _ *stage.RecordCache) string { *term = 0; return "u1" }},
		{"another collection", func(*Directories, *int64, *stage.RecordCache) string { return "u2" }},
		{"a failed merge", func(d *Directories, _ *int64, _ *stage.RecordCache) string { d.Forget(ns); return "u1" }},
		{"past the bound, grown by the merges", func(d *Directories, _ *int64, c *stage.RecordCache) string {
			d.maxRecordIDs = 3
			c.Get("u1").Add("2", 2000, []bson.ObjectID{{11: 100}, {11: 101}})
			return "u1"
		}},
	} {
		t.Run("dropped: "+tc.name, func(t *testing.T) {
			d, term, c := setup()
			c.Put("u1", set(2))
			coll := tc.change(d, term, c)
			if got := c.Get(coll); got != nil {
				t.Fatal("records kept")
			}
			*term = 7
			if got := c.Get("u1"); got != nil {
				t.Fatal("records kept after they were dropped")
			}
		})
	}
	t.Run("not kept past the bound, nor without a term", func(t *testing.T) {
		d, term, c := setup()
		d.maxRecordIDs = 3
		c.Put("u1", set(4))
		if c.Get("u1") != nil {
			t.Fatal("kept past the bound")
		}
		*term = 0
		c.Put("u1", set(1))
		*term = 7
		if c.Get("u1") != nil {
			t.Fatal("kept without a term")
		}
	})
}

func TestRecordCacheBoundIsShared(t *testing.T) {
	d := NewDirectories()
	d.maxRecordIDs = 3
	term := func() int64 { return 7 }
	a, b, c := d.RecordCache("db.a.buckets", term), d.RecordCache("db.b.buckets", term), d.RecordCache("db.c.buckets", term)
	ids := func(from byte, n int) *stage.RecordSet {
		s := stage.NewRecordSet()
		for i := range n {
			s.Add("1", 1000, []bson.ObjectID{{11: from + byte(i)}})
		}
		return s
	}
	a.Put("u1", ids(0, 1))
	b.Put("u2", ids(10, 1))
	a.Get("u1") // a is used after b
	c.Put("u3", ids(20, 2))
	if a.Get("u1") == nil || b.Get("u2") != nil || c.Get("u3") == nil {
		t.Fatal("want b's records gone (least recently used) to make room for c's, a's and c's kept")
	}
	// The merges grow what is kept: at the next get, the least recently
	// used others go.
	a.Get("u1").Add("2", 2000, []bson.ObjectID{{11: 5}})
	if a.Get("u1") == nil || c.Get("u3") != nil {
		t.Fatal("want c's records gone once a's grew past the bound")
	}
}

// TestRecordCacheConcurrentRules: one rule's merge adds to its records
// while another rule's merge gets and puts (which counts every rule's
// ids for the shared bound); run with -race.
func TestRecordCacheConcurrentRules(t *testing.T) {
	d := NewDirectories()
	term := func() int64 { return 7 }
	a, b := d.RecordCache("db.a.buckets", term), d.RecordCache("db.b.buckets", term)
	a.Put("u1", stage.NewRecordSet())
	set := a.Get("u1")
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 200 {
			set.Add(strconv.Itoa(i), 1000, []bson.ObjectID{{10: byte(i >> 8), 11: byte(i)}})
		}
	}()
	for range 200 {
		b.Put("u2", stage.NewRecordSet())
		b.Get("u2")
	}
	<-done
	if set.Len() != 200 {
		t.Fatalf("%d ids, want 200", set.Len())
	}
}
