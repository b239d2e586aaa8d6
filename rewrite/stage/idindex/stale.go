package idindex

import (
	"fmt"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/stage"
)

// Stale event-id index entries. A top-up writes its bucket's new entry
// and leaves the old one stale. Deleting it is a delete by
// {_id: {$in}} on the event-id index collection, which FerretDB pushes
// down on no backend: it decodes every entry of the rule, one per bucket,
// on all three upstreams (about 20 ms at 240 buckets, `tsbench dashboard
// -prefill 100000`), and a merge that tops up runs before every read of a
// rule that takes inserts. So the merge hands the old entries to
// Writer.Stale, which deletes them in one command once
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
// writes is first taken off the list (WriteBuckets); and the proxy
// starts the list over in each term of the writer lease it holds, since
// another proxy's merges may have written entries in between, leaving
// what waited in place.

// deleteEntries deletes the event-id index entries ids, in one command;
// if it fails, they wait again (Writer.Stale). Where a lookup by
// _id is an index lookup (the embedded upstream indexes the event-id
// index's _id too), entries with a string _id go one statement each,
// each a lookup: a {_id: {$in}} is pushed down on no FerretDB backend
// and decodes every entry of the rule, a cost that grew with the rule
// (issue 59). Elsewhere, and for entries of the older {b, h} _id, the
// one $in.
func (w *Writer) deleteEntries(x *rewrite.Exec, ids []bsoncore.Value) error {
	if len(ids) == 0 {
		return nil
	}
	var byLookup, byScan []bsoncore.Value
	if beats, known := w.lookups(len(ids)); known && !beats {
		for _, id := range ids {
			if id.Type == bsoncore.TypeString {
				byLookup = append(byLookup, id)
			} else {
				byScan = append(byScan, id)
			}
		}
	} else {
		byScan = ids
	}
	if err := w.deleteEntriesByID(x, byLookup); err != nil {
		return w.entriesWaitAgain(ids, err)
	}
	if len(byScan) > 0 {
		in := bsoncore.NewArrayBuilder()
		for _, id := range byScan {
			in.AppendValue(id)
		}
		q := bsoncore.NewDocumentBuilder().AppendDocument("_id", bsoncore.NewDocumentBuilder().AppendArray("$in", in.Build()).Build()).Build()
		if err := stage.DeleteMany(x, w.Rule.DB, w.coll(), q); err != nil {
			return w.entriesWaitAgain(byScan, err)
		}
	}
	if w.Dropped != nil {
		*w.Dropped += len(ids)
	}
	return nil
}

// deleteEntriesByID deletes entries ids with a statement each.
func (w *Writer) deleteEntriesByID(x *rewrite.Exec, ids []bsoncore.Value) error {
	nb := bsoncore.NewDocumentBuilder
	stmts := make([]bsoncore.Document, len(ids))
	for i, id := range ids {
		stmts[i] = nb().AppendDocument("q", nb().AppendValue("_id", id).Build()).AppendInt32("limit", 1).Build()
	}
	_, err := w.statements(x, "delete", stmts)
	return err
}

// entriesWaitAgain puts ids back on the list after a failed delete.
func (w *Writer) entriesWaitAgain(ids []bsoncore.Value, err error) error {
	if w.Stale != nil {
		w.Stale.PutBack(ids)
	}
	return fmt.Errorf("drop stale event-id index entries: %w", err)
}

// DropOld deletes the entries topped-up buckets had before (old, the
// _ids of those the top-ups did not write again): stale, they would cost
// a lookup each, and one entry a top-up would add up. After the rewrite,
// so an entry never lacks for a bucket. With Stale, most wait to be
// deleted with others.
func (w *Writer) DropOld(x *rewrite.Exec, old []bsoncore.Value) error {
	if len(old) == 0 {
		return nil
	}
	if w.Stale != nil {
		old = w.Stale.Add(old)
	}
	return w.deleteEntries(x, old)
}

// DropStale deletes every stale entry waiting (a flush settles the index
// too).
func (w *Writer) DropStale(x *rewrite.Exec) error {
	if w.Stale == nil {
		return nil
	}
	return w.deleteEntries(x, w.Stale.Take())
}

func (w *Writer) lookups(n int) (beats, known bool) {
	if w.Lookups == nil {
		return false, false
	}
	return w.Lookups(n)
}
