package idindex

import (
	"fmt"
	"math/rand/v2"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rules"
)

// Writer writes the event-id index of one merge of Rule.
type Writer struct {
	Rule *rules.Rule
	// Series keeps what this writer-lease term's merges wrote of the
	// series entries and which minutes' id-time documents they found
	// full; nil knows nothing.
	Series *stage.SeriesSeen
	// Stale keeps the entries top-ups left stale (see stale.go); nil
	// deletes them at once.
	Stale *stage.StaleEntries
	// Per is how many statements an update or delete command holds.
	Per int
	// Lookups says whether n deletes by _id cost less than one delete by
	// {_id: {$in}} (the merge Host's OneScanBeats): known false, not
	// measured.
	Lookups func(n int) (beats, known bool)
	// Listed: the index collection existed when the merge listed the
	// collections (Start).
	Listed bool
	// Dropped, when set, counts the stale entries deleted.
	Dropped *int
}

// Bucket is one bucket a merge writes: its _id, its window start (ms),
// its entry (bucket.IDIndexEntry of all its events), its events (All;
// nil when Added are all of them) and those the merge adds.
type Bucket struct {
	ID    bson.ObjectID
	Start int64
	Entry bsoncore.Document
	All   []bucket.Event
	Added []bucket.Event
}

func (w *Writer) coll() string { return w.Rule.IDIndexCollection() }

func (w *Writer) statements(x *rewrite.Exec, cmd string, stmts []bsoncore.Document) ([]int, error) {
	return stage.Statements(x, w.Rule.DB, cmd, w.coll(), w.Per, stmts)
}

// Start writes the marker when the index did not exist when the merge
// listed the collections and the bucket collection is empty: every
// bucket written from now has an entry, its series' entry and its
// id-time filters. A marker written anew starts Series over (the rule
// was dropped since what it holds was written).
func (w *Writer) Start(x *rewrite.Exec) error {
	if w.Listed {
		return nil
	}
	reply, ok := x.One(stage.CountCommand(w.Rule.DB, w.Rule.BucketCollection))
	if !ok {
		return rewrite.ErrAborted
	}
	if err := mongoerr.ReplyError(reply); err != nil {
		return fmt.Errorf("count %s: %w", w.Rule.BucketCollection, err)
	}
	if n, _ := bsoncore.Document(reply).Lookup("n").AsInt64OK(); n == 0 {
		w.Series.Reset()
		if err := stage.InsertOne(x, w.Rule.DB, w.coll(), bucket.IDIndexMarkerDoc(rand.Int64())); err != nil {
			return fmt.Errorf("start the event-id index: %w", err)
		}
	}
	w.Listed = true
	return nil
}

// WriteSeries widens the series entries (bucket SeriesUpdates) to the
// windows of keys, before their buckets are written: a read of a series'
// latest events looks up the windows the entry bounds.
func (w *Writer) WriteSeries(x *rewrite.Exec, keys []bucket.Key) error {
	keys = w.Series.Need(keys)
	if _, err := w.statements(x, "update", bucket.SeriesUpdates(keys)); err != nil {
		return fmt.Errorf("bound the series in the event-id index: %w", err)
	}
	w.Series.Wrote(keys)
	return nil
}

// WriteBuckets writes the entries and id-time filters of buckets before
// the buckets, so a crash between leaves an entry without a bucket (a
// wasted lookup), never a bucket without an entry. The first merge into
// an empty bucket collection starts the index with its marker (Start);
// one into a collection that already holds buckets without entries
// (written before the index existed) leaves the marker out, and finds by
// _id keep reading every bucket there.
func (w *Writer) WriteBuckets(x *rewrite.Exec, buckets []Bucket) error {
	if len(buckets) == 0 {
		return nil
	}
	if w.Series == nil {
		w.Series = &stage.SeriesSeen{} // what this merge learns, at least
	}
	if w.Stale != nil {
		// An entry written again is live, whatever a top-up left waiting
		// under its _id.
		entries := make([]bsoncore.Document, len(buckets))
		for i, b := range buckets {
			entries[i] = b.Entry
		}
		w.Stale.Revive(entries)
	}
	for rest := buckets; len(rest) > 0; {
		n := min(len(rest), 1000)
		docs := make([]bsoncore.Document, n)
		for i, b := range rest[:n] {
			docs[i] = b.Entry
		}
		rest = rest[n:]
		reply, ok := x.Do(rewrite.Step{stage.InsertStep(w.Rule.DB, w.coll(), docs)})
		if !ok {
			return rewrite.ErrAborted
		}
		// A duplicate key is the same entry, written by an earlier run.
		if _, err := stage.WriteOutcome(reply[0]); err != nil {
			return fmt.Errorf("write event-id index: %w", err)
		}
	}
	return w.writeIDTimes(x, buckets)
}
