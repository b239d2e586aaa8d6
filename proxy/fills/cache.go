package fills

import (
	"slices"
	"strings"
	"sync"

	"github.com/tsproxy/tsproxy/rewrite/bucket"

	lru "github.com/hashicorp/golang-lru/v2"
)

// DefaultSize bounds the (series, window) fills the proxy remembers.
// A forgotten fill costs one or two point reads to load again.
const DefaultSize = 100_000

// Cache remembers, per (bucket namespace, meta, window start), the
// fill of the open bucket: its seq and how full it is. With the embedded
// upstream one proxy owns the data and serializes the writers of a key, so
// its fills are exact; with several proxies in front of one MongoDB they
// are hints, and the upserts' {count, bytes} guard keeps buckets bounded.
//
// Each entry has its own mutex, held by one insert from loading the fill
// to storing the new one. Entries in use are pinned in active, so the LRU
// evicting one cannot give two inserts two mutexes for the same key.
type Cache struct {
	mu     sync.Mutex
	lru    *lru.Cache[string, *entry]
	active map[string]*entry
}

type entry struct {
	mu      sync.Mutex // held by the insert writing the key
	fill    bucket.Fill
	refs    int  // inserts holding or waiting for mu; guarded by Cache.mu
	dropped bool // the collection was dropped while in use; guarded by Cache.mu
}

func New(size int) *Cache {
	c, _ := lru.New[string, *entry](max(size, 1)) // fails only for size < 1
	return &Cache{lru: c, active: make(map[string]*entry)}
}

func cacheKey(bucketNS string, k bucket.Key) string {
	return bucketNS + "\x00" + k.String()
}

// Locked are the entries of one insert, locked.
type Locked struct {
	c       *Cache
	names   []string
	entries []*entry
	byKey   map[string]*entry // BucketKey.String() -> entry
	keys    []bucket.Key
}

// Lock takes the entries of keys in sorted order (so two inserts never
// wait for each other in a cycle) and returns them locked.
func (c *Cache) Lock(bucketNS string, keys []bucket.Key) *Locked {
	type item struct {
		name string
		key  bucket.Key
	}
	items := make([]item, len(keys))
	for i, k := range keys {
		items[i] = item{cacheKey(bucketNS, k), k}
	}
	slices.SortFunc(items, func(a, b item) int { return strings.Compare(a.name, b.name) })
	l := &Locked{c: c, byKey: make(map[string]*entry, len(keys))}
	c.mu.Lock()
	for i, it := range items {
		if i > 0 && it.name == items[i-1].name {
			continue
		}
		e := c.active[it.name]
		if e == nil {
			var ok bool
			if e, ok = c.lru.Get(it.name); !ok {
				e = &entry{fill: bucket.Fill{Seq: -1}}
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

// Unlock releases the entries in reverse order and unpins them.
func (l *Locked) Unlock() {
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

// Fill is the fill of a locked key (insert.Fills).
func (l *Locked) Fill(k bucket.Key) bucket.Fill {
	if e := l.byKey[k.String()]; e != nil {
		return e.fill
	}
	return bucket.Fill{Seq: -1}
}

// Set records the fill of a locked key (insert.Fills); an unknown one is
// loaded again by the next insert.
func (l *Locked) Set(k bucket.Key, f bucket.Fill) {
	if e := l.byKey[k.String()]; e != nil {
		e.fill = f
	}
}

// ForgetAll marks every locked key unknown (after a failure whose effect
// is not known).
func (l *Locked) ForgetAll() {
	for _, e := range l.entries {
		e.fill = bucket.Fill{Seq: -1}
	}
}

// Forget drops the fills of one bucket namespace (its collection was
// dropped): the next insert loads them again.
func (c *Cache) Forget(bucketNS string) {
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

// Keys are the locked keys.
func (l *Locked) Keys() []bucket.Key { return l.keys }

// Unknown are the locked keys whose fill is unknown.
func (l *Locked) Unknown() []bucket.Key {
	var out []bucket.Key
	for i, e := range l.entries {
		if !e.fill.Known {
			out = append(out, l.keys[i])
		}
	}
	return out
}
