package fills

import "github.com/tsproxy/tsproxy/rewrite/bucket"

// Held is the set of bucket keys one running command locked, through
// Lock, released when the command ends (ReleaseAll), however it ends.
// It is not safe for concurrent use: a command's plan runs on one
// goroutine.
type Held struct {
	cache *Cache
	// wrote is told each bucket namespace a lock is taken on, under the
	// lock and before the write (the staging tier's directories mark
	// the namespace written).
	wrote func(bucketNS string)
	held  []*Locked
}

// NewHeld is an empty set of locks of cache; wrote (may be nil) is told
// the namespace of every lock taken.
func NewHeld(cache *Cache, wrote func(bucketNS string)) *Held {
	return &Held{cache: cache, wrote: wrote}
}

// Lock takes the locks of keys of the bucket namespace bucketNS.
func (h *Held) Lock(bucketNS string, keys []bucket.Key) *Locked {
	l := h.cache.Lock(bucketNS, keys)
	if h.wrote != nil {
		h.wrote(bucketNS)
	}
	h.held = append(h.held, l)
	return l
}

// Locker is a plan's Lock of the keys of bucketNS: each call locks keys
// and returns their release, which forgets their fills (the plan changed
// their buckets, or may have).
func (h *Held) Locker(bucketNS string) func(keys []bucket.Key) func() {
	return func(keys []bucket.Key) func() {
		l := h.Lock(bucketNS, keys)
		return func() { h.release(l, true) }
	}
}

// release unlocks l, forgetting its keys' fills when forget says so.
func (h *Held) release(l *Locked, forget bool) {
	for i, x := range h.held {
		if x == l {
			h.held = append(h.held[:i], h.held[i+1:]...)
			if forget {
				l.ForgetAll()
			}
			l.Unlock()
			return
		}
	}
}

// ForgetAll forgets the fills of every key held.
func (h *Held) ForgetAll() {
	for _, l := range h.held {
		l.ForgetAll()
	}
}

// ReleaseAll unlocks every key still held.
func (h *Held) ReleaseAll() {
	for len(h.held) > 0 {
		h.release(h.held[0], false)
	}
}
