package catalog

import (
	"testing"

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
