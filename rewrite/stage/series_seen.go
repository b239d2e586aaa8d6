package stage

import (
	"sync"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
)

// SeriesSeen is what the merges of one proxy's writer-lease term wrote
// of a rule's series entries (bucket.SeriesUpdates): the windows each
// series' entry is known to cover, so that a merge widens an entry only
// when it writes a window outside it (a new series, a later or earlier
// window), not at every merge of per-event inserts. Bounds only widen,
// so what it holds stays true while the index lives; a merge that
// starts the index anew (its marker written on an empty bucket
// collection: the rule was dropped) starts it over (Reset). A nil
// SeriesSeen knows nothing.
//
// It also keeps what the term knows of the id-time documents
// (bucket.IDTimes): how many events each holds and whether it is full,
// as written or as found, so a merge finds a document at most once a
// term.
type SeriesSeen struct {
	mu     sync.Mutex
	bounds map[string][2]int64    // series entry _id → [first, last]
	times  map[string]IDTimeKnown // id-time document _id → what it holds
}

// IDTimeKnown is what a term knows of an id-time document: the events
// it holds, whether it is full.
type IDTimeKnown struct {
	N    int64
	Full bool
}

// maxIDTimesKnown bounds the id-time documents kept: forgetting them
// costs a merge a find of each it writes again.
const maxIDTimesKnown = 10_000

// IDTime is what the term knows of id-time document id; ok is false
// when nothing.
func (s *SeriesSeen) IDTime(id string) (k IDTimeKnown, ok bool) {
	if s == nil {
		return k, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k, ok = s.times[id]
	return k, ok
}

// NoteIDTime records what id-time document id holds.
func (s *SeriesSeen) NoteIDTime(id string, k IDTimeKnown) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.times == nil || len(s.times) >= maxIDTimesKnown {
		s.times = map[string]IDTimeKnown{}
	}
	s.times[id] = k
}

// Need returns the keys whose window their series' entry is not known
// to cover.
func (s *SeriesSeen) Need(keys []bucket.Key) []bucket.Key {
	if s == nil {
		return keys
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []bucket.Key
	for _, k := range keys {
		b, ok := s.bounds[bucket.SeriesEntryID(k.Meta)]
		if !ok || k.Start < b[0] || k.Start > b[1] {
			out = append(out, k)
		}
	}
	return out
}

// Wrote records that the entries of keys' series now cover their
// windows (their upserts succeeded).
func (s *SeriesSeen) Wrote(keys []bucket.Key) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.bounds == nil {
		s.bounds = map[string][2]int64{}
	}
	for _, k := range keys {
		id := bucket.SeriesEntryID(k.Meta)
		b, ok := s.bounds[id]
		if !ok {
			b = [2]int64{k.Start, k.Start}
		}
		s.bounds[id] = [2]int64{min(b[0], k.Start), max(b[1], k.Start)}
	}
}

// Reset forgets everything: the index started anew.
func (s *SeriesSeen) Reset() {
	if s == nil {
		return
	}
	s.mu.Lock()
	s.bounds, s.times = nil, nil
	s.mu.Unlock()
}
