package tier

import (
	"testing"
	"time"

	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rules"
)

// TestSpareCollections: one spare a rule; a merge reserves its name,
// the rename makes it, and only a cleaned spare goes to an insert, once;
// a flush takes one being cleaned too; a reservation that never settles
// is given up after spareReserveFor; a failed rename or cleaning forgets
// it.
func TestSpareCollections(t *testing.T) {
	rule := &rules.Rule{DB: "iot", Collection: "readings", BucketCollection: "readings.buckets"}
	key := stage.RuleSpareKey(rule)
	t0 := time.Unix(1_800_000_000, 0)
	s := newSpareCollections()
	cleaning := make(chan string, 10)
	clean := func(name, marker string) { cleaning <- name + "|" + marker }
	wait := func() string { // the cleaning runs on its own goroutine
		t.Helper()
		select {
		case got := <-cleaning:
			return got
		case <-time.After(5 * time.Second):
			t.Fatal("the spare was not cleaned")
			return ""
		}
	}

	// reserve reserves a spare as a merge does; renamed settles it as the
	// merge's rename does, and cleans it when it is to be cleaned.
	reserve := func(now time.Time) (string, func(ok bool, marker string), bool) {
		name, ok := s.reserve(rule, "0123abcd", now)
		return name, func(ok bool, marker string) {
			if s.renamed(rule, name, ok, marker) {
				go clean(name, marker)
			}
		}, ok
	}
	name, renamed, ok := reserve(t0)
	if !ok || !s.kept(rule, name) {
		t.Fatalf("reserve: %q %v", name, ok)
	}
	if _, _, again := reserve(t0.Add(time.Second)); again {
		t.Fatal("a second spare reserved while one is on its way")
	}
	if _, ok := s.take(key); ok {
		t.Fatal("a reserved spare went to an insert")
	}
	renamed(true, "m1")
	if got := wait(); got != name+"|m1" {
		t.Fatalf("cleaning %q, want %s with its marker", got, name)
	}
	if _, ok := s.take(key); ok || s.ready() != 0 {
		t.Fatalf("a spare not cleaned went to an insert, or counted ready (%d)", s.ready())
	}
	s.cleaned(rule, name, true)
	if n := s.ready(); n != 1 {
		t.Fatalf("%d spares ready once cleaned, want 1", n)
	}
	if sp, ok := s.take(key); !ok || sp.name != name || sp.marker != "m1" || s.ready() != 0 {
		t.Fatalf("take: %+v %v (%d ready after)", sp, ok, s.ready())
	}
	if _, ok := s.take(key); ok {
		t.Fatal("a spare went to two inserts")
	}

	// A reservation never settled (its merge was cut) is given up.
	name2, _, ok := reserve(t0)
	if !ok || name2 == name {
		t.Fatalf("second reserve %q %v (first %q)", name2, ok, name)
	}
	if _, _, ok := reserve(t0.Add(spareReserveFor + time.Second)); !ok {
		t.Fatal("a reservation older than spareReserveFor still held")
	}

	// A flush takes a spare being cleaned; its cleaning then finds it gone.
	s = newSpareCollections()
	name, renamed, _ = reserve(t0)
	renamed(true, "m2")
	if sp, ok := s.takeRenamed(rule); !ok || sp.name != name {
		t.Fatalf("takeRenamed: %+v %v", sp, ok)
	}
	s.cleaned(rule, name, true)
	if _, ok := s.take(key); ok {
		t.Fatal("a spare a flush took went to an insert")
	}

	// Failures forget it; an idle one goes to the background.
	s = newSpareCollections()
	_, renamed, _ = reserve(t0)
	renamed(false, "")
	if _, _, ok := reserve(t0); !ok {
		t.Fatal("a failed rename kept its reservation")
	}
	s = newSpareCollections()
	name, renamed, _ = reserve(t0)
	renamed(true, "m3")
	s.cleaned(rule, name, false)
	if s.kept(rule, name) {
		t.Fatal("a spare whose cleaning failed is still kept")
	}
	name, renamed, _ = reserve(t0)
	renamed(true, "m4")
	s.cleaned(rule, name, true)
	if _, ok := s.takeIdle(rule, time.Now().Add(-time.Minute)); ok {
		t.Fatal("a spare cleaned just now taken as idle")
	}
	if _, ok := s.takeIdle(rule, time.Now().Add(time.Minute)); !ok {
		t.Fatal("an idle spare not taken")
	}
}
