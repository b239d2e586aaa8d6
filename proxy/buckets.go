package proxy

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/tsproxy/tsproxy/rewrite/bucket"

	lru "github.com/hashicorp/golang-lru/v2"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rules"
)

// bucketCacheSize bounds the (series, window) fills the proxy remembers.
// A forgotten fill costs one or two point reads to load again.
const bucketCacheSize = 100_000

// maxProbeSeq bounds the point reads that look for a key's open bucket.
const maxProbeSeq = 1 << 16

// bucketCache remembers, per (bucket namespace, meta, window start), the
// fill of the open bucket: its seq and how full it is. With the embedded
// upstream one proxy owns the data and serializes the writers of a key, so
// its fills are exact; with several proxies in front of one MongoDB they
// are hints, and the upserts' {count, bytes} guard keeps buckets bounded.
//
// Each entry has its own mutex, held by one insert from loading the fill
// to storing the new one. Entries in use are pinned in active, so the LRU
// evicting one cannot give two inserts two mutexes for the same key.
type bucketCache struct {
	mu     sync.Mutex
	lru    *lru.Cache[string, *bucketEntry]
	active map[string]*bucketEntry
}

type bucketEntry struct {
	mu      sync.Mutex // held by the insert writing the key
	fill    bucket.Fill
	refs    int  // inserts holding or waiting for mu; guarded by bucketCache.mu
	dropped bool // the collection was dropped while in use; guarded by bucketCache.mu
}

func newBucketCache(size int) *bucketCache {
	c, _ := lru.New[string, *bucketEntry](max(size, 1)) // fails only for size < 1
	return &bucketCache{lru: c, active: make(map[string]*bucketEntry)}
}

func cacheKey(bucketNS string, k bucket.Key) string {
	return bucketNS + "\x00" + k.String()
}

// lockedKeys are the entries of one insert, locked.
type lockedKeys struct {
	c       *bucketCache
	names   []string
	entries []*bucketEntry
	byKey   map[string]*bucketEntry // BucketKey.String() -> entry
	keys    []bucket.Key
}

// lock takes the entries of keys in sorted order (so two inserts never
// wait for each other in a cycle) and returns them locked.
func (c *bucketCache) lock(bucketNS string, keys []bucket.Key) *lockedKeys {
	type item struct {
		name string
		key  bucket.Key
	}
	items := make([]item, len(keys))
	for i, k := range keys {
		items[i] = item{cacheKey(bucketNS, k), k}
	}
	slices.SortFunc(items, func(a, b item) int { return strings.Compare(a.name, b.name) })
	l := &lockedKeys{c: c, byKey: make(map[string]*bucketEntry, len(keys))}
	c.mu.Lock()
	for i, it := range items {
		if i > 0 && it.name == items[i-1].name {
			continue
		}
		e := c.active[it.name]
		if e == nil {
			var ok bool
			if e, ok = c.lru.Get(it.name); !ok {
				e = &bucketEntry{fill: bucket.Fill{Seq: -1}}
			}
			c.active[it.name] = e
		}
		e.refs++
		c.lru.Add(it.name, e)
		l.names = append(l.names, it.name)
		l.entries = append(l.entries, e)
		l.byKey[it.key.String()] = e
		l.keys = append(l.keys, it.key)
	}
	c.mu.Unlock()
	for _, e := range l.entries {
		e.mu.Lock()
	}
	return l
}

// unlock releases the entries in reverse order and unpins them.
func (l *lockedKeys) unlock() {
	for i := len(l.entries) - 1; i >= 0; i-- {
		l.entries[i].mu.Unlock()
	}
	c := l.c
	c.mu.Lock()
	for i, e := range l.entries {
		e.refs--
		if e.refs == 0 {
			delete(c.active, l.names[i])
			if e.dropped {
				if cur, ok := c.lru.Peek(l.names[i]); ok && cur == e {
					c.lru.Remove(l.names[i])
				}
			}
		}
	}
	c.mu.Unlock()
}

// fill is the Buckets function of insert.InsertOptions over the locked
// entries.
func (l *lockedKeys) fill(k bucket.Key) bucket.Fill {
	if e := l.byKey[k.String()]; e != nil {
		return e.fill
	}
	return bucket.Fill{Seq: -1}
}

// store records the fills a round reported (unknown ones included, so
// that they are loaded again).
func (l *lockedKeys) store(fills []bucket.KeyFill) {
	for _, f := range fills {
		if e := l.byKey[f.Key.String()]; e != nil {
			e.fill = f.Fill
		}
	}
}

// forgetAll marks every locked key unknown (after a failure whose effect
// is not known).
func (l *lockedKeys) forgetAll() {
	for _, e := range l.entries {
		e.fill = bucket.Fill{Seq: -1}
	}
}

// forget drops the fills of one bucket namespace (its collection was
// dropped): the next insert loads them again.
func (c *bucketCache) forget(bucketNS string) {
	prefix := bucketNS + "\x00"
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, name := range c.lru.Keys() {
		if strings.HasPrefix(name, prefix) {
			c.lru.Remove(name)
		}
	}
	for name, e := range c.active {
		if strings.HasPrefix(name, prefix) {
			e.dropped = true
		}
	}
}

// forgetBuckets forgets what the proxy knows of the buckets in bucketNS
// ("db.collection" of a rule's bucket collection). Call it when that
// collection is dropped (or renamed, or emptied outside the proxy), so the
// next insert finds the buckets again by point reads.
func (u *upstreamState) forgetBuckets(bucketNS string) {
	u.bucketCache().forget(bucketNS)
}

func (u *upstreamState) bucketCache() *bucketCache {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.buckets == nil {
		u.buckets = newBucketCache(bucketCacheSize)
	}
	return u.buckets
}

// loadFills finds the open bucket of every locked key whose fill is
// unknown, by point reads on the deterministic bucket ids: seq 0, 1, ...
// until a miss; the last hit is the open bucket. Each read is a find on
// {_id: X}, which every upstream answers from its _id index.
func (c *conn) loadFills(rule *rules.Rule, l *lockedKeys) error {
	ns := rule.BucketNamespace()
	for i, e := range l.entries {
		if e.fill.Known {
			continue
		}
		fill := bucket.Fill{Seq: -1, Known: true}
		for seq := 0; ; seq++ {
			if seq >= maxProbeSeq {
				return fmt.Errorf("tsproxy rule %s: more than %d buckets for one series and window", rule.Namespace, maxProbeSeq)
			}
			doc, found, err := c.probeBucket(rule, l.keys[i].ID(ns, seq))
			if err != nil {
				return fmt.Errorf("tsproxy rule %s: load bucket fill: %w", rule.Namespace, err)
			}
			if !found {
				break
			}
			fill.Seq = seq
			fill.Count = int(rawInt(doc, bucket.FieldCount))
			fill.Bytes = rawInt(doc, bucket.FieldBytes)
		}
		e.fill = fill
	}
	return nil
}

// probeBucket reads count and bytes of the bucket with _id id.
func (c *conn) probeBucket(rule *rules.Rule, id bson.ObjectID) (bson.Raw, bool, error) {
	reply, err := c.up.Command(bson.D{
		{Key: "find", Value: rule.BucketCollection},
		{Key: "filter", Value: bson.D{{Key: bucket.FieldID, Value: id}}},
		{Key: "projection", Value: bson.D{{Key: bucket.FieldCount, Value: 1}, {Key: bucket.FieldBytes, Value: 1}}},
		{Key: "limit", Value: 1},
		{Key: "singleBatch", Value: true},
		{Key: "$db", Value: rule.DB},
	})
	if err != nil {
		return nil, false, err
	}
	if r := refusalOf(reply); r != nil {
		return nil, false, fmt.Errorf("find bucket %s: %w", id.Hex(), r)
	}
	batch, ok := reply.Lookup("cursor", "firstBatch").ArrayOK()
	if !ok {
		return nil, false, fmt.Errorf("find bucket %s: reply without cursor.firstBatch", id.Hex())
	}
	vals, err := batch.Values()
	if err != nil || len(vals) == 0 {
		return nil, false, err
	}
	doc, ok := vals[0].DocumentOK()
	if !ok {
		return nil, false, fmt.Errorf("find bucket %s: batch entry is not a document", id.Hex())
	}
	return doc, true, nil
}

// rawInt reads a numeric field as an int64 (0 when absent or not a number).
func rawInt(doc bson.Raw, key string) int64 {
	v, err := doc.LookupErr(key)
	if err != nil {
		return 0
	}
	if n, ok := v.AsInt64OK(); ok {
		return n
	}
	return 0
}
