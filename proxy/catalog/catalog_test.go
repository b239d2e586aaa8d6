package catalog

import (
	"log/slog"
	"testing"
	"time"

	"github.com/tsproxy/tsproxy/rewrite/admin"
	"github.com/tsproxy/tsproxy/rules"
)

func TestSameReady(t *testing.T) {
	entry := func(coll, state, nonce string) admin.CatalogEntry {
		return admin.CatalogEntry{Created: rules.Created{DB: "db", Collection: coll, TimeField: "t", SpanSeconds: 3600}, State: state, Nonce: nonce}
	}
	set := func(es ...admin.CatalogEntry) map[string]admin.CatalogEntry {
		m := map[string]admin.CatalogEntry{}
		for _, e := range es {
			m[e.Namespace()] = e
		}
		return m
	}
	a := entry("a", admin.StateReady, "1")
	cases := []struct {
		name     string
		old, new map[string]admin.CatalogEntry
		same     bool
	}{
		{"both empty", nil, set(), true},
		{"unchanged", set(a), set(a), true},
		{"a create begins: no ready change", set(a), set(a, entry("b", admin.StateCreating, "2")), true},
		{"a create ends", set(a, entry("b", admin.StateCreating, "2")), set(a, entry("b", admin.StateReady, "3")), false},
		{"collMod: new nonce", set(a), set(entry("a", admin.StateReady, "9")), false},
		{"a drop begins", set(a), set(entry("a", admin.StateDropping, "1")), false},
		{"gone", set(a), set(), false},
	}
	for _, c := range cases {
		if got := sameReady(c.old, c.new); got != c.same {
			t.Errorf("%s: sameReady %v, want %v", c.name, got, c.same)
		}
	}
	if rs := readyRules(set(a, entry("b", admin.StateCreating, "2"))); len(rs) != 1 || rs[0].Namespace != "db.a" || rs[0].Declared == nil {
		t.Fatalf("readyRules: %+v", rs)
	}
}

// TestStuckDrop: a drop is stuck once one proxy has seen its entry
// unchanged for catalogStuckAfter, on the catalog's clock; a new nonce
// (the drop moved on) starts the wait again, and a create in progress is
// never a stuck drop.
func TestStuckDrop(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	cat := New(Config{Log: slog.New(slog.DiscardHandler), Now: func() time.Time { return now }})
	entry := func(state, nonce string) admin.CatalogEntry {
		return admin.CatalogEntry{Created: rules.Created{DB: "db", Collection: "w", TimeField: "t", SpanSeconds: 3600}, State: state, Nonce: nonce}
	}
	seen := func(e admin.CatalogEntry) {
		// Only a "creating" entry past the wait is written (deleted);
		// none here, so no upstream connection is needed.
		cat.abortStuck(nil, map[string]admin.CatalogEntry{e.Namespace(): e}, now)
	}
	drop := entry(admin.StateDropping, "1")
	seen(drop)
	if cat.StuckDrop(drop) {
		t.Fatal("a drop seen just now is stuck")
	}
	now = now.Add(catalogStuckAfter - time.Second)
	seen(drop)
	if cat.StuckDrop(drop) {
		t.Fatal("stuck before catalogStuckAfter")
	}
	now = now.Add(time.Second)
	if !cat.StuckDrop(drop) {
		t.Fatal("not stuck after catalogStuckAfter unchanged")
	}
	moved := entry(admin.StateDropping, "2")
	seen(moved)
	if cat.StuckDrop(moved) {
		t.Fatal("a drop whose entry changed is stuck at once")
	}
	now = now.Add(catalogStuckAfter)
	if !cat.StuckDrop(moved) {
		t.Fatal("the changed drop is not stuck after its own wait")
	}
	if cat.StuckDrop(entry(admin.StateCreating, "2")) {
		t.Fatal("a create in progress reported as a stuck drop")
	}
}
