package stage

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
)

// TestSeriesSeen: keys inside what was written need nothing; a window
// outside, a new series, and everything after a Reset do; nil knows
// nothing.
func TestSeriesSeen(t *testing.T) {
	key := func(s string, start int64) bucket.Key {
		return bucket.KeyOf(bsoncore.Value{Type: bsoncore.TypeString, Data: bsoncore.AppendString(nil, s)}, start)
	}
	var s SeriesSeen
	s.Wrote([]bucket.Key{key("a", 10), key("a", 30)})
	if got := s.Need([]bucket.Key{key("a", 10), key("a", 20), key("a", 30)}); len(got) != 0 {
		t.Fatalf("need %v inside the written bounds", got)
	}
	if got := s.Need([]bucket.Key{key("a", 40), key("a", 5), key("b", 20)}); len(got) != 3 {
		t.Fatalf("need %d of a later, an earlier window and a new series, want 3", len(got))
	}
	s.Reset()
	if got := s.Need([]bucket.Key{key("a", 20)}); len(got) != 1 {
		t.Fatal("known after a reset")
	}
	var none *SeriesSeen
	none.Wrote([]bucket.Key{key("a", 1)})
	none.Reset()
	if got := none.Need([]bucket.Key{key("a", 1)}); len(got) != 1 {
		t.Fatal("a nil SeriesSeen knows a key")
	}
}
