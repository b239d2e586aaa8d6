package lease

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// DefaultTTL is how long a writer lease lasts without renewal: how long
// a rule's merges (and direct writes) wait when the proxy holding it dies.
const DefaultTTL = 10 * time.Second

// recheck is how long a proxy that found the lease held by another
// answers from what it found before asking the upstream again.
const recheck = time.Second

// Set is the leases of one proxy, by namespace. It is safe for concurrent
// use.
type Set struct {
	ttl time.Duration

	mu     sync.Mutex
	id     string // identity; set when the proxy starts listening
	byName map[string]*lease
}

// lease is this proxy's view of one namespace's lease. mu serializes
// taking and renewing it; the fast path reads validUntil under it too
// (uncontended but for the rare renewal round trip).
type lease struct {
	db, coll string

	mu         sync.Mutex
	term       int64     // held term; 0 when not held
	validUntil time.Time // local clock: the lease is ours until then
	// since is when this proxy took its current term (local clock);
	// prevEnd when the term before it ran out or was released (zero if
	// there was none): no write of another term began later.
	since, prevEnd time.Time
	// When another proxy holds it: who, until when (its stored expiry),
	// and when to ask again.
	other        string
	otherExpires time.Time
	recheckAt    time.Time
}

// NewSet returns the leases of a proxy named id ("" until SetIdentity:
// the host name), each lasting ttl (0: DefaultTTL) without renewal.
func NewSet(ttl time.Duration, id string) *Set {
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	if id == "" {
		host, _ := os.Hostname()
		id = host + "/tsproxy" // until Serve knows the listen address
	}
	return &Set{ttl: ttl, id: id, byName: map[string]*lease{}}
}

// SetIdentity names this proxy by host and listen address.
func (s *Set) SetIdentity(listen string) {
	host, _ := os.Hostname()
	s.mu.Lock()
	s.id = host + "/" + listen
	s.mu.Unlock()
}

// Identity is the owner name this proxy writes into its leases.
func (s *Set) Identity() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.id
}

func (s *Set) lease(db, coll string) *lease {
	s.mu.Lock()
	defer s.mu.Unlock()
	name := db + "." + coll
	l := s.byName[name]
	if l == nil {
		l = &lease{db: db, coll: coll}
		s.byName[name] = l
	}
	return l
}

// HeldError says another proxy holds a namespace's writer lease.
type HeldError struct {
	Namespace string
	Owner     string
	Expires   time.Time
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("tsproxy rule %s: another tsproxy (%s) is writing this namespace (its writer lease runs until %s unless renewed); "+
		"this upstream's updates are not isolated, so only one proxy at a time may write a bucketed namespace: send these writes to that proxy, or stop it and retry",
		e.Namespace, e.Owner, e.Expires.UTC().Format(time.RFC3339))
}

// ErrLost: the holder found a later term when renewing.
var ErrLost = errors.New("writer lease taken by another proxy")

// Ensure returns nil when this proxy holds the lease of db.coll with at
// least half of it left, taking or renewing it on up; a *HeldError when
// another proxy holds it; any other error when the upstream could not be
// asked.
func (s *Set) Ensure(up Commander, db, coll string, log *slog.Logger) error {
	l := s.lease(db, coll)
	ns := db + "." + coll
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if l.term > 0 && now.Before(l.validUntil.Add(-s.ttl/2)) {
		return nil
	}
	if l.term == 0 && l.other != "" && now.Before(l.recheckAt) {
		return &HeldError{Namespace: ns, Owner: l.other, Expires: l.otherExpires}
	}
	c := Client{Up: up, DB: db, Coll: coll, Owner: s.Identity(), TTL: s.ttl}
	if l.term > 0 {
		err := c.Renew(l.term, now)
		if err == nil {
			l.validUntil = now.Add(s.ttl - s.ttl/6)
			return nil
		}
		if !errors.Is(err, ErrLost) {
			return fmt.Errorf("tsproxy rule %s: renew the writer lease: %w", ns, err)
		}
		log.Warn("writer lease lost to another proxy", "rule", ns, "term", l.term)
		l.term = 0
	}
	taken, held, err := c.Take(now)
	if err != nil {
		return fmt.Errorf("tsproxy rule %s: take the writer lease: %w", ns, err)
	}
	if held != nil {
		l.other, l.otherExpires, l.recheckAt = held.Owner, held.Expires, now.Add(recheck)
		held.Namespace = ns
		return held
	}
	l.term, l.validUntil, l.since, l.prevEnd, l.other = taken.Term, now.Add(s.ttl-s.ttl/6), now, taken.PreviousEnd, ""
	log.Info("writer lease taken", "rule", ns, "term", taken.Term, "owner", c.Owner)
	return nil
}

// Term is this proxy's current term of a lease.
type Term struct {
	// Number is the term's number: a later term of the lease, this
	// proxy's or another's, has a greater one.
	Number int64
	// Since is when this proxy took it.
	Since time.Time
	// EarlierWritesBefore is when the writes of the terms before it began
	// at the latest: when the previous term ran out or was released (its
	// holder, this proxy before a restart included, began none later).
	// Zero: there was no earlier term.
	EarlierWritesBefore time.Time
}

// Current returns this proxy's term of db.coll's lease; held is false
// when it holds none.
func (s *Set) Current(db, coll string) (t Term, held bool) {
	l := s.lease(db, coll)
	l.mu.Lock()
	defer l.mu.Unlock()
	return Term{Number: l.term, Since: l.since, EarlierWritesBefore: l.prevEnd}, l.term > 0
}

// TTL is how long the set's leases last without renewal.
func (s *Set) TTL() time.Duration { return s.ttl }

// Held is one lease this proxy holds.
type Held struct {
	DB, Coll string
	Term     int64
}

// TakeHeld forgets every lease this proxy holds and returns them, for
// Release (at shutdown).
func (s *Set) TakeHeld() []Held {
	var hs []Held
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range s.byName {
		l.mu.Lock()
		if l.term > 0 {
			hs = append(hs, Held{l.db, l.coll, l.term})
			l.term = 0
		}
		l.mu.Unlock()
	}
	return hs
}

// Client returns the lease commands of db.coll on up, as this proxy.
func (s *Set) Client(up Commander, db, coll string) Client {
	return Client{Up: up, DB: db, Coll: coll, Owner: s.Identity(), TTL: s.ttl}
}
