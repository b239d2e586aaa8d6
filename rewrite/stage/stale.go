package stage

import (
	"bytes"
	"slices"
	"sync"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// StaleEntriesBatch is how many stale entries wait before one delete
// removes them all: with 4 series, a delete every 16 merges of an open
// window. Not more: FerretDB tests each entry against every id of the
// $in (about 0.7 µs a test, against about 50 µs to decode the entry),
// so a delete of 64 costs about twice a delete of 4, while 256 cost four
// times as much, a spike in one read's merge.
const StaleEntriesBatch = 64

// StaleEntries are the stale event-id index entries of one rule that its
// merges have not deleted yet; valid while the proxy that keeps them
// merges the rule alone (the proxy starts it over otherwise).
type StaleEntries struct {
	mu  sync.Mutex
	ids map[string]bsoncore.Value // by the bytes of the entry's _id
}

// Add puts ids on the list and returns every waiting entry once
// staleEntriesBatch or more wait (the list is then empty), else nil.
func (s *StaleEntries) Add(ids []bsoncore.Value) []bsoncore.Value {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.putLocked(ids)
	if len(s.ids) < StaleEntriesBatch {
		return nil
	}
	return s.takeLocked()
}

// Take empties the list and returns what was on it.
func (s *StaleEntries) Take() []bsoncore.Value {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.takeLocked()
}

func (s *StaleEntries) takeLocked() []bsoncore.Value {
	out := make([]bsoncore.Value, 0, len(s.ids))
	for _, id := range s.ids {
		out = append(out, id)
	}
	s.ids = nil
	// In a fixed order: the delete's statement is then the same for
	// the same entries.
	slices.SortFunc(out, func(a, b bsoncore.Value) int { return bytes.Compare(a.Data, b.Data) })
	return out
}

// Revive takes the entries of entries (documents to write) off the list:
// they are live again.
func (s *StaleEntries) Revive(entries []bsoncore.Document) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.ids) == 0 {
		return
	}
	for _, e := range entries {
		delete(s.ids, string(e.Lookup("_id").Data))
	}
}

// Len is how many stale entries wait.
func (s *StaleEntries) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.ids)
}

// PutBack returns ids to the list after their delete failed.
func (s *StaleEntries) PutBack(ids []bsoncore.Value) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.putLocked(ids)
}

// putLocked adds ids, copied: an entry's _id is a slice of the entry a
// merge built, which the list must not keep alive.
func (s *StaleEntries) putLocked(ids []bsoncore.Value) {
	if s.ids == nil {
		s.ids = map[string]bsoncore.Value{}
	}
	for _, id := range ids {
		s.ids[string(id.Data)] = bsoncore.Value{Type: id.Type, Data: slices.Clone(id.Data)}
	}
}
