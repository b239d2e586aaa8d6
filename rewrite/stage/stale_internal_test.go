package stage

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
)

// TestStaleEntries: entries wait until staleEntriesBatch do, then go all
// at once; an entry written again is taken off the list, so a delete
// never removes a live entry; a failed delete puts them back.
func TestStaleEntries(t *testing.T) {
	entry := func(i int) bsoncore.Document {
		b := bson.ObjectID{11: byte(i), 10: byte(i >> 8)}
		return bucket.IDIndexEntry(b, 0, nil)
	}
	idOf := func(i int) bsoncore.Value { return entry(i).Lookup("_id") }
	var s StaleEntries
	for i := range StaleEntriesBatch - 1 {
		if due := s.Add([]bsoncore.Value{idOf(i)}); due != nil {
			t.Fatalf("entry %d: %d due, want none before %d wait", i, len(due), StaleEntriesBatch)
		}
	}
	// The same entry twice is one entry.
	if due := s.Add([]bsoncore.Value{idOf(0)}); due != nil || s.Len() != StaleEntriesBatch-1 {
		t.Fatalf("%d due, %d waiting after adding one again; want none and %d", len(due), s.Len(), StaleEntriesBatch-1)
	}
	// Written again: live, off the list.
	s.Revive([]bsoncore.Document{entry(3), entry(7), entry(9999)})
	if s.Len() != StaleEntriesBatch-3 {
		t.Fatalf("%d waiting after two were written again, want %d", s.Len(), StaleEntriesBatch-3)
	}
	due := s.Add([]bsoncore.Value{idOf(3), idOf(1000), idOf(1001)})
	if len(due) != StaleEntriesBatch || s.Len() != 0 {
		t.Fatalf("%d due, %d waiting; want all %d due at once", len(due), s.Len(), StaleEntriesBatch)
	}
	for _, v := range due {
		if v.Equal(idOf(7)) {
			t.Fatal("an entry written again is due for deletion")
		}
	}
	s.PutBack(due[:2])
	if got := s.Take(); len(got) != 2 || !got[0].Equal(due[0]) {
		t.Fatalf("took %d after putting 2 back", len(got))
	}
}
