package stage

import (
	"bytes"
	"fmt"
	"slices"
	"sync"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
)

// Stale event-id index entries. A top-up writes its bucket's new entry
// and leaves the old one stale. Deleting it is a delete by
// {_id: {$in}} on the event-id index collection, which FerretDB pushes
// down on no backend: it decodes every entry of the rule, one per bucket,
// on all three upstreams (about 20 ms at 240 buckets, `tsbench dashboard
// -prefill 100000`), and a merge that tops up runs before every read of a
// rule that takes inserts. So the merge hands the old entries to
// MergeOptions.Stale, which deletes them in one command once
// staleEntriesBatch are waiting, and at a flush.
//
// Why leaving one waiting is safe: a stale entry names the same bucket
// as the entry that replaced it, with a subset of its ids (a top-up only
// adds events), so a read that meets it looks up a bucket it would look
// up anyway, or one more at worst ("stale entries cost a lookup, never an
// answer"). What is not safe is deleting a
// waiting entry that has become some bucket's live entry again (an
// entry's _id names its bucket and its ids, and a bucket that lost events
// to a delete can take the same ids again). Merges are the only writers
// of entries (deletes, drops and sweeps write none); every entry a merge
// writes is first taken off the list (writeIDIndex); and the proxy
// starts the list over in each term of the writer lease it holds, since
// another proxy's merges may have written entries in between, leaving
// what waited in place.

// staleEntriesBatch is how many stale entries wait before one delete
// removes them all: with 4 series, a delete every 16 merges of an open
// window. Not more: FerretDB tests each entry against every id of the
// $in (about 0.7 µs a test, against about 50 µs to decode the entry),
// so a delete of 64 costs about twice a delete of 4, while 256 cost four
// times as much, a spike in one read's merge.
const staleEntriesBatch = 64

// StaleEntries are the stale event-id index entries of one rule that its
// merges have not deleted yet; valid while the proxy that keeps them
// merges the rule alone (the proxy starts it over otherwise).
type StaleEntries struct {
	mu  sync.Mutex
	ids map[string]bsoncore.Value // by the bytes of the entry's _id
}

// add puts ids on the list and returns every waiting entry once
// staleEntriesBatch or more wait (the list is then empty), else nil.
func (s *StaleEntries) add(ids []bsoncore.Value) []bsoncore.Value {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.putLocked(ids)
	if len(s.ids) < staleEntriesBatch {
		return nil
	}
	return s.takeLocked()
}

// take empties the list and returns what was on it.
func (s *StaleEntries) take() []bsoncore.Value {
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

// revive takes the entries of entries (documents to write) off the list:
// they are live again.
func (s *StaleEntries) revive(entries []bsoncore.Document) {
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

// deleteEntries deletes the event-id index entries ids, in one command;
// if it fails, they wait again (MergeOptions.Stale).
func (m *Merge) deleteEntries(x *rewrite.Exec, ids []bsoncore.Value) error {
	if len(ids) == 0 {
		return nil
	}
	in := bsoncore.NewArrayBuilder()
	for _, id := range ids {
		in.AppendValue(id)
	}
	q := bsoncore.NewDocumentBuilder().AppendDocument("_id", bsoncore.NewDocumentBuilder().AppendArray("$in", in.Build()).Build()).Build()
	if err := m.deleteMany(x, m.rule.IDIndexCollection(), q); err != nil {
		if m.opts.Stale != nil {
			m.opts.Stale.putBack(ids)
		}
		return fmt.Errorf("drop stale event-id index entries: %w", err)
	}
	m.Stats.StaleDropped += len(ids)
	return nil
}

// dropStaleEntries deletes the stale entries waiting (MergeOptions
// DropStale: a flush settles the index too).
func (m *Merge) dropStaleEntries(x *rewrite.Exec) error {
	if m.opts.Stale == nil || m.opts.Guest {
		return nil
	}
	return m.deleteEntries(x, m.opts.Stale.take())
}

// putBack returns ids to the list after their delete failed.
func (s *StaleEntries) putBack(ids []bsoncore.Value) {
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
