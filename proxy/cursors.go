package proxy

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/expirable"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rules"
)

// cursorRegistry remembers the upstream cursors that rewritten reads
// opened, so that a getMore or killCursors for one, on whichever client
// connection the driver sends it, is mapped to the bucket collection and
// its batches reshaped. Upstream cursor ids are unique per upstream, so the
// proxy hands them to clients unchanged. It is bounded in size (least
// recently used cursors are forgotten first) and in time (cursors idle
// past the TTL are forgotten; the upstream times them out on its side too).
type cursorRegistry struct {
	lru  *expirable.LRU[int64, *cursorEntry]
	size int
}

type cursorEntry struct {
	rule *rules.Rule
	// cursor gives the plans of the cursor's getMores and of its release.
	cursor rewrite.Cursor
	// mu makes the getMores of one cursor take turns (a client may send
	// them on several connections at once).
	mu sync.Mutex
	// session is the lsid of the read that opened the cursor ("" for
	// none): endSessions of that session kills and forgets it, and
	// getMores in another session are refused.
	session string
	// users are the users authenticated on the connection that opened the
	// cursor ("user@db", sorted): only they may continue or kill it.
	users []string
	// owner is the id of the client connection that last used the
	// cursor; see releaseCursors.
	owner atomic.Uint64
}

func newCursorRegistry(size int, ttl time.Duration) *cursorRegistry {
	return &cursorRegistry{lru: expirable.NewLRU[int64, *cursorEntry](size, nil, ttl), size: size}
}

// add remembers a cursor; it returns false, remembering nothing, when the
// registry holds limits.maxCursors cursors already: the caller refuses the
// new cursor rather than have the LRU forget another client's live one.
func (r *cursorRegistry) add(id int64, e *cursorEntry) bool {
	if id == 0 {
		return true
	}
	if r.lru.Len() >= r.size && !r.lru.Contains(id) {
		return false
	}
	r.lru.Add(id, e)
	return true
}

func (r *cursorRegistry) get(id int64) *cursorEntry {
	e, _ := r.lru.Get(id)
	return e
}

func (r *cursorRegistry) rule(id int64) *rules.Rule {
	if e := r.get(id); e != nil {
		return e.rule
	}
	return nil
}

func (r *cursorRegistry) forget(id int64) { r.lru.Remove(id) }

// sessionCursor is a cursor of an ended session, to release.
type sessionCursor struct {
	id    int64
	entry *cursorEntry
}

// forgetSessions forgets the cursors opened in any of sessions and
// returns them: one pass over the registry, however many sessions end
// (drivers end up to 10,000 in one endSessions).
// Only cursors the ending client's users opened are touched: MongoDB's
// sessions belong to their users, and another user's endSessions of the
// same lsid ends nothing of theirs.
func (r *cursorRegistry) forgetSessions(sessions map[string]bool, users []string) []sessionCursor {
	if len(sessions) == 0 {
		return nil
	}
	var out []sessionCursor
	for _, id := range r.lru.Keys() {
		if e, ok := r.lru.Peek(id); ok && e.session != "" && sessions[e.session] && rewrite.Coauthorized(e.users, users) {
			r.lru.Remove(id)
			out = append(out, sessionCursor{id: id, entry: e})
		}
	}
	return out
}

// peek is get without making the cursor recently used.
func (r *cursorRegistry) peek(id int64) *cursorEntry {
	e, _ := r.lru.Peek(id)
	return e
}

// Len is the number of cursors remembered.
func (r *cursorRegistry) Len() int { return r.lru.Len() }
