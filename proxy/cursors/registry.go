package cursors

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/expirable"
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rules"
)

// Registry remembers the upstream cursors that rewritten reads
// opened, so that a getMore or killCursors for one, on whichever client
// connection the driver sends it, is mapped to the bucket collection and
// its batches reshaped. Upstream cursor ids are unique per upstream, so the
// proxy hands them to clients unchanged. It is bounded in size (least
// recently used cursors are forgotten first) and in time (cursors idle
// past the TTL are forgotten; the upstream times them out on its side too).
type Registry struct {
	// adding makes Add's check of the bound and its add one step: two
	// Adds at the bound would otherwise both pass the check, and the LRU
	// would forget a live cursor it had accepted.
	adding sync.Mutex
	lru    *expirable.LRU[int64, *Entry]
	size   int
}

// Entry is one remembered cursor.
type Entry struct {
	Rule *rules.Rule
	// Cursor gives the plans of the cursor's getMores and of its release.
	Cursor rewrite.Cursor
	// Mu makes the getMores of one cursor take turns (a client may send
	// them on several connections at once).
	Mu sync.Mutex
	// CursorSession is the session fields of the read that opened the
	// cursor, which its release's killCursors carries: the upstream binds
	// the cursor to that session.
	CursorSession rewrite.CursorSession
	// Session is the lsid of the read that opened the cursor ("" for
	// none): endSessions of that session kills and forgets it, and
	// getMores in another session are refused.
	Session string
	// Users are the users authenticated on the connection that opened the
	// cursor ("user@db", sorted): only they may continue or kill it.
	Users []string
	// Owner is the id of the client connection that last used the
	// cursor: the proxy releases a connection's cursors when it closes.
	Owner atomic.Uint64
}

// New returns a registry of at most size cursors, each forgotten after
// ttl without use.
func New(size int, ttl time.Duration) *Registry {
	return &Registry{lru: expirable.NewLRU[int64, *Entry](size, nil, ttl), size: size}
}

// Add remembers a cursor; it returns false, remembering nothing, when the
// registry holds limits.maxCursors cursors already: the caller refuses the
// new cursor rather than have the LRU forget another client's live one.
func (r *Registry) Add(id int64, e *Entry) bool {
	if id == 0 {
		return true
	}
	r.adding.Lock()
	defer r.adding.Unlock()
	if r.lru.Len() >= r.size && !r.lru.Contains(id) {
		return false
	}
	r.lru.Add(id, e)
	return true
}

// Get returns the cursor id, or nil, and makes it recently used.
func (r *Registry) Get(id int64) *Entry {
	e, _ := r.lru.Get(id)
	return e
}

// Rule is the rule of cursor id, or nil when the proxy does not know it.
func (r *Registry) Rule(id int64) *rules.Rule {
	if e := r.Get(id); e != nil {
		return e.Rule
	}
	return nil
}

// Forget forgets cursor id.
func (r *Registry) Forget(id int64) { r.lru.Remove(id) }

// Ended is a cursor of an ended session, to release.
type Ended struct {
	ID    int64
	Entry *Entry
}

// ForgetSessions forgets the cursors opened in any of sessions and
// returns them: one pass over the registry, however many sessions end
// (drivers end up to 10,000 in one endSessions).
// Only cursors the ending client's users opened are touched: MongoDB's
// sessions belong to their users, and another user's endSessions of the
// same lsid ends nothing of theirs.
// may, when set, says whether the client may end a cursor of that rule
// (the server authorizes it on the rule's namespace): the cursors of a
// rule it may not are left.
func (r *Registry) ForgetSessions(sessions map[string]bool, users []string, may func(*rules.Rule) bool) []Ended {
	if len(sessions) == 0 {
		return nil
	}
	var out []Ended
	allowed := map[*rules.Rule]bool{}
	for _, id := range r.lru.Keys() {
		e, ok := r.lru.Peek(id)
		if !ok || e.Session == "" || !sessions[e.Session] || !rewrite.Coauthorized(e.Users, users) {
			continue
		}
		if may != nil {
			ok, asked := allowed[e.Rule]
			if !asked {
				ok = may(e.Rule)
				allowed[e.Rule] = ok
			}
			if !ok {
				continue
			}
		}
		r.lru.Remove(id)
		out = append(out, Ended{ID: id, Entry: e})
	}
	return out
}

// Peek is Get without making the cursor recently used.
func (r *Registry) Peek(id int64) *Entry {
	e, _ := r.lru.Peek(id)
	return e
}

// Len is the number of cursors remembered.
func (r *Registry) Len() int { return r.lru.Len() }
