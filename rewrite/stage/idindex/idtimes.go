package idindex

import (
	"fmt"
	"math/rand/v2"
	"slices"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/source"
	"github.com/tsproxy/tsproxy/rewrite/stage"
)

// writeIDTimes writes the id-time documents of buckets (bucket.IDTimes)
// and a new version of the marker, in one command: a new version
// (random: two proxies' merges never share one) makes readers that kept
// the index re-read it. A minute the merge would fill is split first
// (its document marked, then its events go by second); a second it would
// fill is marked full and gets no filters. How full a document is comes
// from what this term wrote (Series), or from one find of it.
func (w *Writer) writeIDTimes(x *rewrite.Exec, buckets []Bucket) error {
	split := func(minute int64) bool { return w.known(bucket.IDTimeTarget{Second: minute}).Full }
	times := w.idTimes(buckets, split)
	targets := times.Targets()
	if err := w.learn(x, targets); err != nil {
		return err
	}
	var marks []bucket.IDTimeTarget
	filling := map[int64]bool{}
	for _, t := range targets {
		if k := w.known(t); !t.BySecond && (k.Full || k.N+int64(t.Added) > t.Cap()) {
			filling[t.Second] = true
			if !k.Full {
				marks = append(marks, t)
			}
		}
	}
	if len(filling) > 0 {
		times = w.idTimes(buckets, func(minute int64) bool { return split(minute) || filling[minute] })
		targets = times.Targets()
		if err := w.learn(x, targets); err != nil {
			return err
		}
	}
	stmts := times.Updates()
	var writes []bsoncore.Document
	var wrote []bucket.IDTimeTarget
	for i, t := range targets {
		switch k := w.known(t); {
		case k.Full: // a full second: finds of its ids read the whole index
		case t.BySecond && k.N+int64(t.Added) > t.Cap():
			marks = append(marks, t)
		default:
			writes, wrote = append(writes, stmts[i]), append(wrote, t)
		}
	}
	if len(marks) > 0 {
		// Marked before the seconds are written: a reader that finds a
		// second's document of the minute read the minute's mark.
		stmts := make([]bsoncore.Document, len(marks))
		for i, t := range marks {
			stmts[i] = bucket.IDTimeSplitUpdate(t)
		}
		if _, err := w.statements(x, "update", stmts); err != nil {
			return fmt.Errorf("mark the event-id index's full id-time documents: %w", err)
		}
		for _, t := range marks {
			w.Series.NoteIDTime(t.ID(), stage.IDTimeKnown{N: w.known(t).N, Full: true})
		}
	}
	if _, err := w.statements(x, "update", append(writes, bucket.IDIndexBumpUpdate(rand.Int64()))); err != nil {
		return fmt.Errorf("write the event-id index's id-time documents: %w", err)
	}
	for _, t := range wrote {
		w.Series.NoteIDTime(t.ID(), stage.IDTimeKnown{N: w.known(t).N + int64(t.Added)})
	}
	return nil
}

// known is what the term knows of target t's document.
func (w *Writer) known(t bucket.IDTimeTarget) stage.IDTimeKnown {
	k, _ := w.Series.IDTime(t.ID())
	return k
}

// learn finds the documents of targets the term knows nothing of, in
// one step.
func (w *Writer) learn(x *rewrite.Exec, targets []bucket.IDTimeTarget) error {
	var ids []string
	var finds []bsoncore.Document
	for _, t := range targets {
		if _, ok := w.Series.IDTime(t.ID()); !ok && !slices.Contains(ids, t.ID()) {
			ids = append(ids, t.ID())
			finds = append(finds, bucket.IDIndexFind(w.coll(), w.Rule.DB, t.ID()))
		}
	}
	found, err := source.Lookups(x, finds, "read the event-id index's id-time documents")
	if err != nil {
		return err
	}
	for i, doc := range found {
		var k stage.IDTimeKnown
		if doc != nil {
			k.N, k.Full = bucket.IDTimeState(doc)
		}
		w.Series.NoteIDTime(ids[i], k)
	}
	return nil
}

// idTimes gathers the id-time filters of buckets.
func (w *Writer) idTimes(buckets []Bucket, split func(minute int64) bool) *bucket.IDTimes {
	t := &bucket.IDTimes{}
	span := w.Rule.SpanMillis()
	for _, b := range buckets {
		all := b.All
		if all == nil {
			all = b.Added
		}
		t.Add(b.ID, b.Start+span, all, b.Added, split)
	}
	return t
}
