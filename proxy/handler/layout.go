package handler

import (
	"strings"
	"sync"
	"time"

	"github.com/tsproxy/tsproxy/rewrite/insert"
	"github.com/tsproxy/tsproxy/rewrite/layout"

	"github.com/tsproxy/tsproxy/rewrite/bucket"

	"github.com/tsproxy/tsproxy/rules"
)

// layoutInsert counts (counter) or stores (slots) the events of an insert
// (rewrite/layout), through the staging tier where the rule stages
// (FerretDB: stagedInsert, no lease), else under the proxy's locks of
// their keys: on an upstream
// whose updates are not isolated (FerretDB), two $inc upserts of one
// bucket at once lose an increment, or both try to create it and one
// fails on its _id; and slots writes read the buckets they touch first.
func (c *Conn) layoutInsert(req *request, rule *rules.Rule) error {
	if staged, _, err := c.stagedRule(rule); err != nil {
		return err
	} else if staged {
		return c.stagedInsert(req, rule)
	}
	caps, err := c.startWrite(rule)
	if err != nil {
		return err
	}
	c.ensureBucketIndex(rule)
	cmd := commandOf(req)
	keys, err := insert.Keys(cmd, rule)
	if err != nil {
		return c.refuseBeforeWrite(req, rule, err, c.replyRewriteError)
	}
	locked := c.s.fills.Lock(rule.BucketNamespace(), keys)
	c.s.tier.Directories().Wrote(rule.BucketNamespace())
	defer locked.Unlock()
	// A write id this proxy has not seen may also be a retry of a write
	// that went through an earlier term of the rule's writer lease.
	attempt := func(id string, now time.Time) (bool, time.Duration) {
		check, late := c.s.writes.attempt(id, now)
		return check || c.s.earlierTermRetryPossible(rule, caps, time.Time{}), late
	}
	env := layout.WriteEnv{Caps: caps, Now: time.Now(), Attempt: attempt,
		Shells: func(ks []bucket.Key) []bucket.Key { return c.s.shells.claim(rule.BucketNamespace(), ks) }}
	return c.servePlan(req, rule, routeRewrite, layout.InsertPlan(cmd, rule, keys, env))
}

// shellMemory remembers the (bucket namespace, series, window) shells a
// proxy inserted, so that each is tried once. It is bounded: past
// maxPreallocated it starts over (a shell tried again only meets a
// duplicate key).
type shellMemory struct {
	mu   sync.Mutex
	seen map[string]bool
}

const maxPreallocated = 100_000

func newShellMemory() *shellMemory { return &shellMemory{seen: map[string]bool{}} }

// claim returns the keys of keys not tried yet, and marks them tried.
func (m *shellMemory) claim(ns string, keys []bucket.Key) []bucket.Key {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.seen) > maxPreallocated {
		m.seen = map[string]bool{}
	}
	var out []bucket.Key
	for _, k := range keys {
		name := ns + "\x00" + k.String()
		if !m.seen[name] {
			m.seen[name] = true
			out = append(out, k)
		}
	}
	return out
}

// forget forgets the shells of a dropped bucket collection, so the windows
// written after the drop get theirs again.
func (m *shellMemory) forget(ns string) {
	prefix := ns + "\x00"
	m.mu.Lock()
	defer m.mu.Unlock()
	for k := range m.seen {
		if strings.HasPrefix(k, prefix) {
			delete(m.seen, k)
		}
	}
}

// writeIDs remembers the write ids of the retryable counter inserts this
// proxy saw, to recognise a
// driver's retry: a write id seen before is checked against its buckets'
// marks. Until checkAllUntil (the proxy's start, or forgetting ids under
// load) an unseen id may be a retry of a write sent to a proxy that is
// gone, so every write is checked.
type writeIDs struct {
	mu            sync.Mutex
	seen          map[string]time.Time
	checkAllUntil time.Time
}

func newWriteIDs(start time.Time) *writeIDs {
	return &writeIDs{seen: map[string]time.Time{}, checkAllUntil: start.Add(layout.MarkerLife)}
}

// maxCounterWrites bounds that memory; past it, ids older than
// layout.MarkerLife are forgotten, then all if need be.
const maxCounterWrites = 200_000

// attempt says whether a write id must be checked for an earlier attempt,
// or is a retry too late to be checked (its marks may be gone).
func (w *writeIDs) attempt(id string, now time.Time) (check bool, late time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if first, ok := w.seen[id]; ok {
		// Some margin: the mark's period was picked when the first
		// attempt was planned, and it reached the upstream later.
		if age := now.Sub(first); age > layout.MarkerLife-time.Second {
			return false, age
		}
		return true, 0
	}
	if len(w.seen) >= maxCounterWrites {
		for k, t := range w.seen {
			if now.Sub(t) > layout.MarkerLife {
				delete(w.seen, k)
			}
		}
		if len(w.seen) >= maxCounterWrites {
			w.seen = map[string]time.Time{}
			w.checkAllUntil = now.Add(layout.MarkerLife)
		}
	}
	w.seen[id] = now
	return now.Before(w.checkAllUntil), 0
}
