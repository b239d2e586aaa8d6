package tier

import (
	"sync"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/stage"
)

// Directories are what this proxy knows of the buckets of the rules it
// merges (stage.Known): a rule's is valid
// while the proxy holds the same term of its writer lease, no write of
// the buckets outside its merges went through this proxy since (epochs),
// and the bucket collection is the same one (its uuid). Any other case,
// or a merge that failed, starts it over empty.
type Directories struct {
	mu sync.Mutex
	// epochs count, by bucket namespace, the writes of the buckets
	// outside merges on this proxy (deletes, direct inserts, drops,
	// retention sweeps): each one makes the namespace's directory stale.
	epochs map[string]uint64
	dirs   map[string]*directory
	// records are the records of merged retryable writes the merges
	// keep, by bucket namespace (stage.RecordCache).
	records map[string]*keptRecords
	// stale are the stale event-id index entries the merges leave
	// waiting, by bucket namespace (stage.StaleEntries).
	stale map[string]*ofTerm[stage.StaleEntries]
	// series are what the merges of a term wrote of the rules' series
	// entries (stage.SeriesSeen), by bucket namespace.
	series map[string]*ofTerm[stage.SeriesSeen]
	// maxRecordIDs bounds the derived ids kept for all rules
	// (maxKeptRecordIDs; the tests set less).
	maxRecordIDs int
	uses         uint64
}

// keptRecords are one rule's records of merged retryable writes: valid
// while the proxy holds the same term of the rule's writer lease (the
// holder's merges are their only writers) and their collection is the
// same one (its uuid).
type keptRecords struct {
	term int64
	coll string
	set  *stage.RecordSet
	used uint64 // d.uses when last got or put: the least recent go first
}

// ofTerm is what one rule's merges keep of its event-id index (the
// stale entries waiting, the series entries written): valid while the
// proxy holds the same term of the rule's writer lease, in which its
// merges are the only writers of the index.
type ofTerm[T any] struct {
	term int64
	kept *T
}

// keptOfTerm is m's value for bucketNS in term: a new one when the
// value kept is another term's (or none). Called with d.mu held.
func keptOfTerm[T any](m map[string]*ofTerm[T], bucketNS string, term int64) *T {
	k := m[bucketNS]
	if k == nil || k.term != term {
		k = &ofTerm[T]{term: term, kept: new(T)}
		m[bucketNS] = k
	}
	return k.kept
}

// maxKeptRecordIDs bounds the derived ids kept for all rules (12 bytes
// each: 48 MB; 10 minutes of 6,600 retryable inserts a second); past it,
// a rule's merges read its records back at each merge, as they did
// before they were kept.
const maxKeptRecordIDs = 4_000_000

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

func NewDirectories() *Directories {
	return &Directories{epochs: map[string]uint64{}, dirs: map[string]*directory{}, records: map[string]*keptRecords{}, stale: map[string]*ofTerm[stage.StaleEntries]{}, series: map[string]*ofTerm[stage.SeriesSeen]{}, maxRecordIDs: maxKeptRecordIDs}
}

// Wrote says that something other than a merge wrote the buckets of
// bucketNS through this proxy, or is about to.
func (d *Directories) Wrote(bucketNS string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.epochs[bucketNS]++
	delete(d.dirs, bucketNS)
}

// Forget drops bucketNS's directory and records (its merge failed: what
// it wrote is not known).
func (d *Directories) Forget(bucketNS string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.dirs, bucketNS)
	delete(d.records, bucketNS)
}

// RecordCache is the stage.RecordCache of bucketNS for a merge whose
// proxy holds term number term() (0: none) of the rule's writer lease.
func (d *Directories) RecordCache(bucketNS string, term func() int64) *stage.RecordCache {
	return &stage.RecordCache{
		Get: func(coll string) *stage.RecordSet {
			d.mu.Lock()
			defer d.mu.Unlock()
			r := d.records[bucketNS]
			if r == nil {
				return nil
			}
			// Records of no collection are those of the merge that made
			// it: another proxy writes records only in another term.
			if t := term(); t == 0 || r.term != t || r.coll != coll && r.coll != "" || r.set.Len() > d.maxRecordIDs {
				delete(d.records, bucketNS)
				return nil
			}
			r.coll = coll
			d.uses++
			r.used = d.uses
			// The merges grew what is kept: others go, least recently
			// used first.
			for d.KeptRecordIDs() > d.maxRecordIDs {
				d.EvictRecords()
			}
			return r.set
		},
		Put: func(coll string, set *stage.RecordSet) {
			d.mu.Lock()
			defer d.mu.Unlock()
			delete(d.records, bucketNS)
			t := term()
			if t == 0 || set.Len() > d.maxRecordIDs {
				return
			}
			// Room for them: other rules' records go, least recently
			// used first (a rule this proxy no longer merges keeps its
			// records until then).
			for d.KeptRecordIDs()+set.Len() > d.maxRecordIDs {
				d.EvictRecords()
			}
			d.uses++
			d.records[bucketNS] = &keptRecords{term: t, coll: coll, set: set, used: d.uses}
		},
	}
}

// StaleEntries is the stage.StaleEntries of bucketNS for a merge of
// this proxy in term number term (0: none, and nil). A new term starts
// an empty list: another proxy's merges may have written entries since,
// so the entries waiting are left in place for good (each costs a
// lookup at most). Deletes, drops and sweeps
// through this proxy do not start it over: only a merge writes entries,
// and it takes those it writes off the list.
func (d *Directories) StaleEntries(bucketNS string, term int64) *stage.StaleEntries {
	if term == 0 {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return keptOfTerm(d.stale, bucketNS, term)
}

// SeriesSeen is the stage.SeriesSeen of bucketNS for a merge of this
// proxy in term number term (0: none, and nil). A new term starts it
// empty: while another proxy held the lease, the rule may have been
// dropped and its series entries with it.
func (d *Directories) SeriesSeen(bucketNS string, term int64) *stage.SeriesSeen {
	if term == 0 {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return keptOfTerm(d.series, bucketNS, term)
}

// StaleWaiting says whether stale event-id index entries of bucketNS
// wait to be deleted.
func (d *Directories) StaleWaiting(bucketNS string) bool {
	d.mu.Lock()
	k := d.stale[bucketNS]
	d.mu.Unlock()
	return k != nil && k.kept.Len() > 0
}

// Known is the stage.Known of bucketNS for a merge whose proxy holds
// term number term() (0: none) of the rule's writer lease.
func (d *Directories) Known(bucketNS string, term func() int64) *stage.Known {
	return &stage.Known{Dir: knownDir{d: d, bucketNS: bucketNS, term: term}}
}

// knownDir is the stage.Directory of one rule's merges.
type knownDir struct {
	d        *Directories
	bucketNS string
	term     func() int64
}

func (k knownDir) Of(coll string, keys []bucket.Key) (map[string]stage.KnownKey, bool, bool) {
	d, bucketNS, term := k.d, k.bucketNS, k.term
	d.mu.Lock()
	defer d.mu.Unlock()
	dir := d.Valid(bucketNS, term(), coll)
	if dir == nil {
		return nil, false, false
	}
	return stage.KnownOf(dir.keys, dir.complete, keys), dir.complete, dir.read
}

func (k knownDir) Load(coll string, keys map[string]stage.KnownKey, complete bool) {
	d, bucketNS, term := k.d, k.bucketNS, k.term
	d.mu.Lock()
	defer d.mu.Unlock()
	if t := term(); t > 0 {
		if keys == nil {
			keys = map[string]stage.KnownKey{}
		}
		d.dirs[bucketNS] = &directory{term: t, epoch: d.epochs[bucketNS], coll: coll, complete: complete, read: true, keys: keys}
	}
}

func (k knownDir) Learn(coll string, keys map[string]stage.KnownKey) {
	d, bucketNS, term := k.d, k.bucketNS, k.term
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
}

// EvictRecords drops the least recently used rule's records (the caller
// holds mu).
func (d *Directories) EvictRecords() {
	var oldest string
	for ns, r := range d.records {
		if oldest == "" || r.used < d.records[oldest].used {
			oldest = ns
		}
	}
	delete(d.records, oldest)
}

// KeptRecordIDs is the number of derived ids kept for all rules (the
// caller holds mu).
func (d *Directories) KeptRecordIDs() int {
	n := 0
	for _, r := range d.records {
		n += r.set.Len()
	}
	return n
}

// Valid is bucketNS's directory if it still holds (the caller holds mu):
// else it is dropped and valid returns nil.
func (d *Directories) Valid(bucketNS string, term int64, coll string) *directory {
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
