package tier

import (
	"crypto/rand"
	"encoding/hex"
	"strings"
	"sync"

	"github.com/tsproxy/tsproxy/proxy/exec"
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rules"
)

// keptStore holds what this proxy stored in its own staging collections,
// so that a merge of one it froze need not read it back
// (package rewrite/stage says why, and when that is exact). It holds at
// most budget bytes of staged documents (limits.stagedMemory): a
// collection whose documents would pass that keeps nothing, and its
// merge reads it back as before.
type keptStore struct {
	budget int64
	mu     sync.Mutex
	used   int64
	colls  map[string]*keptColl // by "db.collection": an open staging collection
}

// keptColl is what the store holds of one staging collection.
type keptColl struct {
	// ready is closed once the collection and its marker are written,
	// or failed to be: the first insert writes them while the others
	// into the collection wait.
	ready  chan struct{}
	marker string // the marker's _id; "" when it was not written
	docs   [][]byte
	bytes  int64
	// spoiled: something went into the collection whose outcome is not
	// known, or the budget ran out; nothing more is kept.
	spoiled bool
}

// newKeptStore keeps up to budget bytes; nil (keep nothing) for 0.
func newKeptStore(budget int64) *keptStore {
	if budget <= 0 {
		return nil
	}
	return &keptStore{budget: budget, colls: map[string]*keptColl{}}
}

// open is the entry of a staging collection; first says the caller made
// it, and writes the collection and its marker (markKept) before it
// inserts.
func (k *keptStore) open(key string) (kc *keptColl, first bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if kc = k.colls[key]; kc != nil {
		return kc, false
	}
	kc = &keptColl{ready: make(chan struct{})}
	k.colls[key] = kc
	return kc, true
}

// spoil makes kc keep nothing from now on.
func (k *keptStore) spoil(kc *keptColl) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.spoilLocked(kc)
}

func (k *keptStore) spoilLocked(kc *keptColl) {
	k.used -= kc.bytes
	kc.docs, kc.bytes, kc.spoiled = nil, 0, true
}

// marked records kc's marker.
func (k *keptStore) marked(kc *keptColl, marker string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	kc.marker = marker
}

// add keeps copies of docs (the insert's buffers are not the store's).
func (k *keptStore) add(kc *keptColl, docs [][]byte) {
	size := 0
	for _, d := range docs {
		size += len(d)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if kc.spoiled {
		return
	}
	if k.used+int64(size) > k.budget {
		k.spoilLocked(kc)
		return
	}
	arena := make([]byte, 0, size)
	for _, d := range docs {
		start := len(arena)
		arena = append(arena, d...)
		kc.docs = append(kc.docs, arena[start:len(arena):len(arena)])
	}
	kc.bytes += int64(size)
	k.used += int64(size)
}

// take hands what the store holds of staging collection key over to its
// merge, once; ok is false when it holds nothing whole.
func (k *keptStore) take(key string) (docs [][]byte, marker string, ok bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	kc := k.colls[key]
	if kc == nil {
		return nil, "", false
	}
	delete(k.colls, key)
	k.used -= kc.bytes
	if kc.spoiled || kc.marker == "" {
		return nil, "", false
	}
	return kc.docs, kc.marker, true
}

// forgetFrozen drops what the store holds of rule's staging collections
// of a generation before gen: a freeze took them, and the merge that
// followed it took what it merges (a guest's freeze merges nothing).
func (k *keptStore) forgetFrozen(rule *rules.Rule, gen int64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for key, kc := range k.colls {
		name, ok := strings.CutPrefix(key, rule.DB+".")
		if !ok {
			continue
		}
		if c, ok := stage.Parse(rule, name); ok && c.Gen < gen {
			k.used -= kc.bytes
			delete(k.colls, key)
		}
	}
}

// RunKept runs u, an insert into one of this proxy's own staging
// collections, and keeps what it stored there; asIs runs steps without keeping.
func (t *Tier) RunKept(asIs exec.Runner, u rewrite.Upstream) ([][]byte, error) {
	k := t.kept
	db, coll := stage.KeptTarget(u)
	kc, first := k.open(db + "." + coll)
	if first {
		t.markKept(asIs, kc, db, coll)
	} else {
		<-kc.ready
	}
	replies, err := asIs.RunStep(rewrite.Step{u})
	if err != nil || len(replies) != 1 {
		k.spoil(kc)
		return replies, err
	}
	if docs, ok := stage.KeptDocs(u, replies[0]); ok {
		k.add(kc, docs)
	} else {
		k.spoil(kc)
	}
	return replies, nil
}

// markKept creates staging collection db.coll and inserts its marker, so
// that what the proxy keeps of it is known to be all it holds; on any
// failure (the name is taken, the upstream fails) it keeps nothing. The
// inserts waiting on kc.ready go on either way.
func (t *Tier) markKept(asIs exec.Runner, kc *keptColl, db, coll string) {
	defer close(kc.ready)
	if t.useSpare(asIs, kc, db, coll) { // a rename, not a create
		return
	}
	var token [8]byte
	_, _ = rand.Read(token[:])
	id := stage.MarkerID(hex.EncodeToString(token[:]))
	create, marker := stage.MarkerCommands(db, coll, id)
	replies, err := asIs.RunStep(rewrite.Step{{Body: create}})
	if err != nil || len(replies) != 1 || !mongoerr.IsOK(replies[0]) {
		t.kept.spoil(kc)
		return
	}
	replies, err = asIs.RunStep(rewrite.Step{marker})
	if err != nil || len(replies) != 1 {
		t.kept.spoil(kc)
		return
	}
	if docs, ok := stage.KeptDocs(marker, replies[0]); !ok || len(docs) != 1 {
		t.kept.spoil(kc)
		return
	}
	t.kept.marked(kc, id)
}
