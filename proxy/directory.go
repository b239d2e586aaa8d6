package proxy

import (
	"sync"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/stage"
)

// directories are what this proxy knows of the buckets of the rules it
// merges (stage.Known, rewrite/stage/directory.go): a rule's is valid
// while the proxy holds the same term of its writer lease, no write of
// the buckets outside its merges went through this proxy since (epochs),
// and the bucket collection is the same one (its uuid). Any other case,
// or a merge that failed, starts it over empty.
type directories struct {
	mu sync.Mutex
	// epochs count, by bucket namespace, the writes of the buckets
	// outside merges on this proxy (deletes, direct inserts, drops,
	// retention sweeps): each one makes the namespace's directory stale.
	epochs map[string]uint64
	dirs   map[string]*directory
}

// directory is one rule's.
type directory struct {
	term     int64
	epoch    uint64
	coll     string // the bucket collection's uuid; "": there was none
	complete bool   // every key of the collection is in keys
	read     bool   // the keys were read (stage.Known.Load)
	keys     map[string]stage.KnownKey
	bytes    int // of the last buckets kept (KnownKey.Last)
}

// maxDirectoryBytes bounds the last buckets one rule's directory keeps
// for top-ups; past it a key keeps its next seq only (its last bucket is
// read when topped up).
const maxDirectoryBytes = 32 << 20

func newDirectories() *directories {
	return &directories{epochs: map[string]uint64{}, dirs: map[string]*directory{}}
}

// wrote says that something other than a merge wrote the buckets of
// bucketNS through this proxy, or is about to.
func (d *directories) wrote(bucketNS string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.epochs[bucketNS]++
	delete(d.dirs, bucketNS)
}

// forget drops bucketNS's directory (its merge failed: what it wrote is
// not known).
func (d *directories) forget(bucketNS string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.dirs, bucketNS)
}

// known is the stage.Known of bucketNS for a merge whose proxy holds
// term number term() (0: none) of the rule's writer lease.
func (d *directories) known(bucketNS string, term func() int64) *stage.Known {
	return &stage.Known{
		Of: func(coll string, keys []bucket.Key) (map[string]stage.KnownKey, bool, bool) {
			d.mu.Lock()
			defer d.mu.Unlock()
			dir := d.valid(bucketNS, term(), coll)
			if dir == nil {
				return nil, false, false
			}
			return stage.KnownOf(dir.keys, dir.complete, keys), dir.complete, dir.read
		},
		Load: func(coll string, keys map[string]stage.KnownKey, complete bool) {
			d.mu.Lock()
			defer d.mu.Unlock()
			if t := term(); t > 0 {
				if keys == nil {
					keys = map[string]stage.KnownKey{}
				}
				d.dirs[bucketNS] = &directory{term: t, epoch: d.epochs[bucketNS], coll: coll, complete: complete, read: true, keys: keys}
			}
		},
		Learn: func(coll string, keys map[string]stage.KnownKey) {
			d.mu.Lock()
			defer d.mu.Unlock()
			t := term()
			dir := d.dirs[bucketNS]
			// A directory of no collection stays whole when the merge made
			// it: every bucket in it is this merge's.
			if t == 0 || dir == nil || dir.term != t || dir.epoch != d.epochs[bucketNS] || dir.coll != coll && dir.coll != "" {
				// Only what this merge wrote, under its key locks, is known.
				dir = &directory{term: t, epoch: d.epochs[bucketNS], keys: map[string]stage.KnownKey{}}
				if t == 0 {
					return
				}
				d.dirs[bucketNS] = dir
			}
			dir.coll = coll
			for k, kk := range keys {
				dir.bytes -= len(dir.keys[k].Last)
				if dir.bytes+len(kk.Last) > maxDirectoryBytes {
					kk.Last = nil
				}
				dir.bytes += len(kk.Last)
				dir.keys[k] = kk
			}
			if len(dir.keys) > stage.MaxDirectoryKeys {
				delete(d.dirs, bucketNS)
			}
		},
	}
}

// valid is bucketNS's directory if it still holds (the caller holds mu):
// else it is dropped and valid returns nil.
func (d *directories) valid(bucketNS string, term int64, coll string) *directory {
	dir := d.dirs[bucketNS]
	if dir == nil {
		return nil
	}
	if term == 0 || dir.term != term || dir.epoch != d.epochs[bucketNS] || dir.coll != coll {
		delete(d.dirs, bucketNS)
		return nil
	}
	return dir
}
