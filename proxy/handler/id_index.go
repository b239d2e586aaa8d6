package handler

import (
	"slices"
	"sync"
	"time"

	"github.com/tsproxy/tsproxy/proxy/exec"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/upstream"
)

// stopIDIndex deletes the marker of rule's event-id index (see
// rewrite/bucket's IDIndexEntry) before this proxy writes the rule's
// buckets directly: those buckets get no index entries, so from then on
// a find by event _id reads every bucket. It runs once per writer-lease
// term, so a staged merge of another proxy that started the index again
// in between (after a drop) is undone before the next direct write; on
// upstreams without leases, once per process and drop.
func (c *Conn) stopIDIndex(rule *rules.Rule) error {
	if rule.Layout != rules.LayoutEvents || rule.Partitioned() {
		return nil
	}
	ns := rule.BucketNamespace()
	term, _ := c.s.leases.Current(rule.DB, rule.Collection)
	if v, ok := c.s.idIndexOff.Load(ns); ok && v.(time.Time).Equal(term.Since) {
		return nil
	}
	reply, err := exec.CommandDoc(c.up, bucket.IDIndexStopCommand(rule))
	if err != nil {
		return err
	}
	if r := upstream.RefusalOf(reply); r != nil {
		return mongoerr.Errorf(r.Code, "tsproxy rule %s: stop the event-id index before a direct write: %s", rule.Namespace, r.Error())
	}
	c.s.idIndexOff.Store(ns, term.Since)
	return nil
}

// sweepIDIndex deletes the event-id index entries of the buckets the
// sweeper deleted (those whose window starts before cutoff). A failure
// only leaves stale entries, which cost a lookup and never an answer.
func (s *Engine) sweepIDIndex(up *upstream.Conn, rule *rules.Rule, cutoff time.Time) {
	reply, err := exec.CommandDoc(up, bucket.IDIndexSweepCommand(rule, cutoff))
	if err == nil {
		err = upstream.CommandError(reply)
	}
	if err != nil {
		s.log.Warn("retention: stale event-id index entries left", "rule", rule.Namespace, "err", err.Error())
	}
}

// idIndexCache keeps the event-id indexes reads by event _id read
// (bucket.IDIndexCache), within maxIDIndexCacheBytes: a read whose
// index's marker still shows the version kept reads the marker alone.
type idIndexCache struct {
	mu    sync.Mutex
	snaps map[string]*bucket.IDIndexSnapshot
	order []string // insertion order, oldest first, for eviction
	bytes int
}

// maxIDIndexCacheBytes bounds the indexes kept: about 2 KB per 1,000
// events, so 64 MB covers 30M events' worth of buckets.
const maxIDIndexCacheBytes = 64 << 20

func newIDIndexCache() *idIndexCache {
	return &idIndexCache{snaps: map[string]*bucket.IDIndexSnapshot{}}
}

func (c *idIndexCache) Get(ns string) *bucket.IDIndexSnapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.snaps[ns]
}

// Put keeps s as ns's index (nil forgets it), evicting the oldest kept
// indexes past the bound.
func (c *idIndexCache) Put(ns string, s *bucket.IDIndexSnapshot) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.snaps[ns]; old != nil {
		c.bytes -= old.Bytes
		delete(c.snaps, ns)
		c.order = slices.DeleteFunc(c.order, func(n string) bool { return n == ns })
	}
	if s == nil || s.Bytes > maxIDIndexCacheBytes {
		return
	}
	for c.bytes+s.Bytes > maxIDIndexCacheBytes && len(c.order) > 0 {
		oldest := c.order[0]
		c.order = c.order[1:]
		c.bytes -= c.snaps[oldest].Bytes
		delete(c.snaps, oldest)
	}
	c.snaps[ns] = s
	c.order = append(c.order, ns)
	c.bytes += s.Bytes
}
