package lease

import (
	"fmt"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite/stage"
)

// Presence is what a proxy says of itself to the others on one upstream:
// that it still stages a rule's events into staging collections of its
// own (rewrite/stage.Stager). Only a running proxy freezes its own
// staging collections; once its announcement lapsed, the holder of the
// rule's writer lease takes them over. An announcement is a document
// {_id: "Stager:<coll>:<tag>", ns: "Stager:<coll>", owner, expires} in
// the rule database's lease collection, renewed once half of it is used,
// before an insert into a collection it announces.
type Presence struct {
	ttl time.Duration

	mu        sync.Mutex
	announced map[string]time.Time // by db.coll: this proxy's last announcement
}

// NewPresence returns the announcements of a proxy, each lasting ttl (0:
// DefaultTTL).
func NewPresence(ttl time.Duration) *Presence {
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	return &Presence{ttl: ttl, announced: map[string]time.Time{}}
}

func presenceNS(coll string) string { return stage.PresenceNS(coll) }

func presenceID(coll, tag string) string { return stage.PresenceID(coll, tag) }

// Announce says that the proxy tagged tag (named owner) stages db.coll's
// events, unless it said so less than half a lifetime ago.
func (p *Presence) Announce(up Commander, db, coll, tag, owner string) error {
	ns := db + "." + coll
	now := time.Now()
	p.mu.Lock()
	last := p.announced[ns]
	p.mu.Unlock()
	if now.Sub(last) < p.ttl/2 {
		return nil
	}
	c := Client{Up: up, DB: db}
	set := bson.D{
		{Key: "ns", Value: presenceNS(coll)},
		{Key: "owner", Value: owner},
		{Key: "expires", Value: now.Add(p.ttl)},
	}
	if err := c.upsertByID(presenceID(coll, tag), set); err != nil {
		return fmt.Errorf("announce staging of %s: %w", ns, err)
	}
	p.mu.Lock()
	p.announced[ns] = now
	p.mu.Unlock()
	return nil
}

// Forget makes the next Announce of db.coll write (its announcement may
// have been taken for a lapse: written anew at once).
func (p *Presence) Forget(db, coll string) {
	p.mu.Lock()
	delete(p.announced, db+"."+coll)
	p.mu.Unlock()
}
