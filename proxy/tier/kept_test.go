package tier

import (
	"testing"
	"time"

	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rules"
)

// TestKeptStore: what the store holds is bounded by its budget (a
// collection that would pass it keeps nothing, and later inserts add
// nothing to it), handed over once, and forgotten once a freeze moved
// the rule to a later generation.
func TestKeptStore(t *testing.T) {
	rule := &rules.Rule{Namespace: "db.events", DB: "db", Collection: "events", BucketCollection: "events.buckets", Span: time.Hour}
	tag := stage.StagerTag("host/a")
	name := func(gen int64) string {
		return "db." + stage.OpenCollection(rule, 0, stage.Stager{Tag: tag, Gen: gen})
	}
	k := newKeptStore(100)
	if newKeptStore(0) != nil || newKeptStore(-1) != nil {
		t.Fatal("a store without a budget keeps something")
	}

	a, first := k.open(name(1))
	if !first {
		t.Fatal("first open not first")
	}
	if _, again := k.open(name(1)); again {
		t.Fatal("second open first")
	}
	k.marked(a, "m1")
	k.add(a, [][]byte{make([]byte, 30), make([]byte, 30)})
	b, _ := k.open(name(2))
	k.marked(b, "m2")
	k.add(b, [][]byte{make([]byte, 30)})
	if k.used != 90 {
		t.Fatalf("used %d, want 90", k.used)
	}
	k.add(b, [][]byte{make([]byte, 20)}) // past the budget: b keeps nothing
	k.add(b, [][]byte{make([]byte, 1)})
	if k.used != 60 || !b.spoiled {
		t.Fatalf("used %d, spoiled %v; want 60, true", k.used, b.spoiled)
	}
	if _, _, ok := k.take(name(2)); ok {
		t.Fatal("a spoiled collection handed over")
	}
	docs, marker, ok := k.take(name(1))
	if !ok || marker != "m1" || len(docs) != 2 || k.used != 0 {
		t.Fatalf("take: %d docs, marker %q, %v, used %d", len(docs), marker, ok, k.used)
	}
	if _, _, ok := k.take(name(1)); ok {
		t.Fatal("handed over twice")
	}

	// Without a marker nothing is handed over.
	c, _ := k.open(name(3))
	k.add(c, [][]byte{make([]byte, 10)})
	if _, _, ok := k.take(name(3)); ok {
		t.Fatal("a collection without its marker handed over")
	}

	// A freeze moved the rule to generation 5: 4's is forgotten, 5's
	// kept.
	d, _ := k.open(name(4))
	k.marked(d, "m4")
	k.add(d, [][]byte{make([]byte, 10)})
	e, _ := k.open(name(5))
	k.marked(e, "m5")
	k.add(e, [][]byte{make([]byte, 10)})
	k.forgetFrozen(rule, 5)
	if _, _, ok := k.take(name(4)); ok {
		t.Fatal("an older generation kept after forgetFrozen")
	}
	if _, _, ok := k.take(name(5)); !ok {
		t.Fatal("the current generation forgotten")
	}
	if k.used != 0 || len(k.colls) != 0 {
		t.Fatalf("used %d, %d collections left", k.used, len(k.colls))
	}
}
