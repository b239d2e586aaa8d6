package merge_test

import (
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
	"github.com/tsproxy/tsproxy/rewrite/stage/merge"
)

// TestMergeBoundsSeries: a merge widens each series' entry in the
// event-id index to the windows it writes, and the marker it starts the
// index with vouches for the entries; a later merge of a later window
// widens the entry again, one of an earlier window leaves last alone.
func TestMergeBoundsSeries(t *testing.T) {
	m := newMem(t)
	rule := rwtest.InsertRule()
	const hour = 3_600_000
	at := func(s string, i int, ms int64) bson.D {
		return rwtest.Event(rwtest.OID(byte(i)), rwtest.DT(ms), s, float64(i))
	}
	bounds := func(s string) (int64, int64) {
		t.Helper()
		meta := bsoncore.Value{Type: bsoncore.TypeString, Data: bsoncore.AppendString(nil, s)}
		id := bucket.SeriesEntryID(bucket.KeyOf(meta, 0).Meta)
		for _, d := range m.colls[rule.IDIndexCollection()] {
			if got, _ := d.Lookup("_id").StringValueOK(); got == id {
				f, l, ok := bucket.SeriesBoundsOf(d)
				if !ok {
					t.Fatalf("entry of %s: %s", s, bson.Raw(d))
				}
				return f, l
			}
		}
		t.Fatalf("no series entry of %s", s)
		return 0, 0
	}
	stagedInsert(t, m, []bson.D{at("a", 1, 10*hour+5), at("a", 2, 12*hour+5), at("b", 3, 11*hour)})
	runMerge(t, m, merge.MergeOptions{All: true, Now: time.UnixMilli(13 * hour)})
	if f, l := bounds("a"); f != 10*hour || l != 12*hour {
		t.Fatalf("a bounded to [%d, %d], want its windows 10h and 12h", f, l)
	}
	if f, l := bounds("b"); f != 11*hour || l != 11*hour {
		t.Fatalf("b bounded to [%d, %d], want 11h", f, l)
	}
	marker := false
	for _, d := range m.colls[rule.IDIndexCollection()] {
		marker = marker || bucket.SeriesComplete(d)
	}
	if !marker {
		t.Fatal("the index's marker does not vouch for the series entries")
	}
	stagedInsert(t, m, []bson.D{at("a", 4, 20*hour), at("b", 5, 2*hour)})
	runMerge(t, m, merge.MergeOptions{All: true, Now: time.UnixMilli(21 * hour)})
	if f, l := bounds("a"); f != 10*hour || l != 20*hour {
		t.Fatalf("a bounded to [%d, %d] after a later window, want [10h, 20h]", f, l)
	}
	if f, l := bounds("b"); f != 2*hour || l != 11*hour {
		t.Fatalf("b bounded to [%d, %d] after an earlier window, want [2h, 11h]", f, l)
	}
}
