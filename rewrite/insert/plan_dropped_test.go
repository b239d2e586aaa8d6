package insert

import (
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
)

// mapFills is Fills over a map, by Key.String().
type mapFills map[string]bucket.Fill

func (m mapFills) Fill(k bucket.Key) bucket.Fill   { return m[k.String()] }
func (m mapFills) Set(k bucket.Key, f bucket.Fill) { m[k.String()] = f }

// droppedReply is FerretDB on PostgreSQL's answer to a find whose
// collection a concurrent drop removed.
func droppedReply(t testing.TB) []byte {
	return rwtest.Doc(t, bson.D{{Key: "ok", Value: 0.0}, {Key: "code", Value: int32(1)}, {Key: "codeName", Value: "InternalError"},
		{Key: "errmsg", Value: `[msg_find.go:344 handler.handleMaxTimeMSError] ERROR: relation "db.readings_buckets_x" does not exist (SQLSTATE 42P01)`}})
}

// TestFillLoaderDroppedUnder: a fill probe whose collection is dropped
// under it (a retention sweeper dropping a partition) is sent again as
// it was, and then finds no bucket; a few times at most, and any other
// error fails the load.
func TestFillLoaderDroppedUnder(t *testing.T) {
	rule := rwtest.InsertRule()
	a, b := bucket.KeyOf(mustValue("a"), 0), bucket.KeyOf(mustValue("b"), 0)
	bucketA := bson.D{{Key: "_id", Value: bid("a", 0, 0)}, {Key: "count", Value: int32(2)}, {Key: "bytes", Value: int32(40)}}

	t.Run("read again, then no bucket", func(t *testing.T) {
		fills := mapFills{}
		l := newFillLoader(rule, fills, []bucket.Key{a, b})
		first := l.step()
		if len(first) != 2 {
			t.Fatalf("first step: %d reads, want 2", len(first))
		}
		// a's read found its bucket, b's met the drop: nothing is taken
		// from the step, and the same two reads go again.
		if err := l.feed([][]byte{rwtest.CursorReply(t, 0, bucketA), droppedReply(t)}); err != nil {
			t.Fatalf("feed with a dropped collection: %v", err)
		}
		again := l.step()
		if len(again) != 2 || string(again[0].Body) != string(first[0].Body) || string(again[1].Body) != string(first[1].Body) {
			t.Fatalf("the step is not sent again as it was: %d reads", len(again))
		}
		if len(fills) != 0 {
			t.Fatalf("fills set from a step sent again: %v", fills)
		}
		if err := l.feed([][]byte{rwtest.CursorReply(t, 0, bucketA), rwtest.CursorReply(t, 0)}); err != nil {
			t.Fatal(err)
		}
		if f := fills[b.String()]; f != (bucket.Fill{Seq: -1, Known: true}) {
			t.Errorf("b's fill = %+v, want no bucket", f)
		}
		// a probes its next seq, which is missing: bucket 0 is open.
		if err := l.feed([][]byte{rwtest.CursorReply(t, 0)}); err != nil {
			t.Fatal(err)
		}
		if f := fills[a.String()]; f != (bucket.Fill{Seq: 0, Count: 2, Bytes: 40, Known: true}) {
			t.Errorf("a's fill = %+v", f)
		}
		if l.step() != nil {
			t.Error("the loader is not done")
		}
	})

	t.Run("bounded", func(t *testing.T) {
		l := newFillLoader(rule, mapFills{}, []bucket.Key{b})
		for i := 0; i < maxRereads; i++ {
			if err := l.feed([][]byte{droppedReply(t)}); err != nil {
				t.Fatalf("reread %d: %v", i+1, err)
			}
		}
		err := l.feed([][]byte{droppedReply(t)})
		if err == nil || !strings.Contains(err.Error(), "load bucket fill") || !strings.Contains(err.Error(), "42P01") {
			t.Fatalf("after %d rereads: %v, want the upstream's error", maxRereads, err)
		}
	})

	t.Run("other errors fail at once", func(t *testing.T) {
		l := newFillLoader(rule, mapFills{}, []bucket.Key{b})
		denied := rwtest.Doc(t, bson.D{{Key: "ok", Value: 0.0}, {Key: "code", Value: int32(13)}, {Key: "errmsg", Value: "not authorized"}})
		if err := l.feed([][]byte{denied}); err == nil || !strings.Contains(err.Error(), "not authorized") {
			t.Fatalf("feed: %v", err)
		}
	})
}
