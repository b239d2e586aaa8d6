package merge

import (
	"bytes"
	"fmt"
	"slices"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/layout"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rules"
)

// mergeLayoutOne merges retired collection r of a counter or slots rule: the
// staged events, in the order they
// arrived, become one write per (series, window), after a read of those
// buckets. repeated says r's plan was read (an earlier run was cut): a
// counter then leaves out the buckets that carry the plan's mark, so
// nothing is counted twice; a slots bucket written again changes
// nothing.
func (m *Merge) mergeLayoutOne(x *rewrite.Exec, r stage.Collection, staged []bsoncore.Document, plan *mergePlan, repeated bool, records *stage.RecordSet) error {
	sortByArrival(staged)
	var evs []bucket.Event
	var recorded []bson.ObjectID
	for _, d := range staged {
		id, isOID := stage.IdOf(d)
		if isOID && plan.skip[id] {
			continue
		}
		if rid, ok := recordedID(d); ok {
			recorded = append(recorded, rid)
		}
		de, err := bucket.StagedEvents(d, m.rule, m.lim)
		if err != nil {
			return fmt.Errorf("staged document %s: %w", d.Lookup("_id"), err)
		}
		evs = append(evs, de...)
	}
	if !repeated {
		// A retired collection's name may come back (its token is the
		// clock's), so the mark is the name and a random part.
		plan.mark = r.Name + "/" + bson.NewObjectID().Hex()
		// Recorded first: it puts r first in line should this merge be
		// cut (mergeRetired), which the counter's mark relies on.
		if err := m.insertOne(x, r.Name, planDoc(plan)); err != nil {
			return fmt.Errorf("record plan: %w", err)
		}
	}
	if plan.mark == "" {
		// Not a plan of this merge (another layout's, another version's):
		// what it counted cannot be told, so nothing is counted.
		return fmt.Errorf("plan document without a counter mark: not written by a counter or slots merge")
	}
	if err := m.recordMerged(x, recordKey(r, plan), recorded, records); err != nil {
		return err
	}
	groups := layout.GroupStaged(m.rule, evs)
	keys := groups.Keys()
	// The proxy's directory of the rule's buckets, as the events' merge
	// uses it: asked under the keys' locks, which hold
	// until it learns what this merge wrote. Not on a repeated run: what
	// the cut run wrote is not known.
	unlock := func() {}
	defer func() { unlock() }()
	var known map[string]stage.KnownKey
	if m.opts.Known != nil && !repeated {
		unlock = m.lockKeys(keys)
		var err error
		if known, err = m.knownKeys(x, keys); err != nil {
			return err
		}
	}
	// Whole buckets, but for a counter whose buckets take an $inc (not on
	// an upstream that packs: package layout): its mark alone.
	var proj bsoncore.Document
	if m.rule.Layout == rules.LayoutCounter && !m.opts.PackedEvents {
		proj = bsoncore.NewDocumentBuilder().AppendInt32(layout.CounterMerged, 1).Build()
	}
	stored, err := m.lookupBuckets(x, keys, proj, known)
	if err != nil {
		return err
	}
	var w layout.MergeWrites
	switch m.rule.Layout {
	case rules.LayoutCounter:
		if w, err = layout.CounterMergeWrites(m.rule, groups, plan.mark, stored, m.opts.PackedEvents); err != nil {
			return err
		}
	case rules.LayoutSlots:
		if w, err = layout.SlotsMergeWrites(m.rule, groups, stored, m.opts.PackedEvents); err != nil {
			return err
		}
	default:
		return mongoerr.Errorf(mongoerr.InternalError, "layout %q does not stage", m.rule.Layout)
	}
	if err := m.insertNewBuckets(x, w.Inserts); err != nil {
		return err
	}
	// At most MaxUpdateStatements a command, as rewriteTopUps says why.
	for _, c := range layout.MergeCommands(m.rule, w.Updates, m.opts.RollupStatements) {
		reply, ok := x.Do(rewrite.Step{{Body: c, Update: true}})
		if !ok {
			return rewrite.ErrAborted
		}
		if _, err := stage.WriteOutcome(reply[0]); err != nil {
			return fmt.Errorf("write buckets: %w", err)
		}
	}
	shells, shellKeys := layout.ShellsAfter(m.rule, keys, m.host().ClaimShells, m.opts.PackedEvents)
	if shells != nil {
		// A duplicate key is a shell there already; anything else only
		// costs the next window its preallocation.
		if _, ok := x.One(shells); !ok {
			return rewrite.ErrAborted
		}
	}
	if known != nil {
		m.last = m.layoutLearned(w, shellKeys)
		if err := m.learn(x); err != nil {
			return err
		}
	}
	unlock()
	unlock = func() {}
	if err := m.finishRetired(x, r, plan); err != nil {
		return err
	}
	m.Stats.Events += w.Events()
	// New buckets only, as the events layout counts them (a rewrite of a
	// bucket is not another): merged events / buckets is the mean fill.
	// An upsert may make one too (a counter's $inc when not packed).
	for _, k := range keys {
		if _, exists := stored(k); !exists {
			m.Stats.Buckets++
		}
	}
	m.Stats.Keys += len(keys)
	m.Stats.Series = max(m.Stats.Series, seriesOf(keys))
	m.Stats.Retries += len(plan.skip)
	return nil
}

// lookupBuckets reads the buckets of keys of a layout rule, but for
// those the directory knows (known, nil without one): a key it knows has
// no bucket, or whose whole bucket it kept, needs no read. On FerretDB,
// where a read by _id scans the bucket collection, a merge of new
// windows then reads nothing, and one of open windows reads nothing the
// proxy's own merges wrote, however much the rule has stored.
func (m *Merge) lookupBuckets(x *rewrite.Exec, keys []bucket.Key, projection bsoncore.Document, known map[string]stage.KnownKey) (layout.StoredBucket, error) {
	kept := map[string]bsoncore.Document{} // nil: no bucket
	var unknown []bucket.Key
	for _, k := range keys {
		kk, ok := known[k.String()]
		switch {
		case ok && kk.Next == 0:
			kept[k.String()] = nil
		case ok && kk.Last != nil && projection == nil:
			kept[k.String()] = kk.Last
		default:
			unknown = append(unknown, k)
		}
	}
	m.Stats.KnownBuckets += len(kept)
	read, err := m.readLayoutBuckets(x, unknown, projection)
	if err != nil {
		return nil, err
	}
	return func(k bucket.Key) (bsoncore.Document, bool) {
		if d, ok := kept[k.String()]; ok {
			return d, d != nil
		}
		return read(k)
	}, nil
}

// readLayoutBuckets reads the buckets of keys of a layout rule: a lookup
// by _id each, or one find of them all where each lookup would scan the
// collection anyway (Host.OneScanBeats).
func (m *Merge) readLayoutBuckets(x *rewrite.Exec, keys []bucket.Key, projection bsoncore.Document) (layout.StoredBucket, error) {
	if len(keys) == 0 {
		return func(bucket.Key) (bsoncore.Document, bool) { return nil, false }, nil
	}
	if beats, known := m.host().OneScanBeats(len(keys)); !known || !beats {
		return layout.ReadBuckets(x, m.rule, keys, projection)
	}
	batch := m.layoutReadBatch(projection)
	docs, err := drainAll(x, m.rule.DB, m.rule.BucketCollection, layout.BucketsIn(m.rule, keys, projection, batch), batch)
	if err != nil {
		return nil, fmt.Errorf("read the buckets to write: %w", err)
	}
	byID := make(map[bson.ObjectID]bsoncore.Document, len(docs))
	for _, d := range docs {
		if id, ok := stage.IdOf(d); ok {
			byID[id] = d
		}
	}
	return func(k bucket.Key) (bsoncore.Document, bool) {
		d, ok := byID[layout.BucketID(m.rule, k)]
		return d, ok
	}, nil
}

// layoutLearned is what a layout merge leaves in the keys it wrote (w)
// and those of the shells it inserted, for the directory: each key has its
// bucket, kept whole where the write gave it whole. A key the retention
// sweep of another proxy may reach is left out (sweepable), so is a
// shell's key this merge also wrote (its write is the bucket).
func (m *Merge) layoutLearned(w layout.MergeWrites, shells []bucket.Key) map[string]stage.KnownKey {
	out := map[string]stage.KnownKey{}
	for _, s := range append(slices.Clip(w.Inserts), w.Updates...) {
		if !m.sweepable(s.Key) {
			out[s.Key.String()] = stage.KnownKey{Next: 1, Last: s.Bucket, Full: s.Bucket == nil}
		}
	}
	for _, k := range shells {
		if _, ok := out[k.String()]; !ok && !m.sweepable(k) {
			// A shell there already, or one that failed to go in: either
			// way a read tells (only "no bucket" is taken on trust).
			out[k.String()] = stage.KnownKey{Next: 1, Full: true}
		}
	}
	return out
}

// layoutReadBatch is how many of a layout rule's buckets one reply may
// hold within maxReadBytes (FerretDB does not cut a batch at 16 MiB):
// whole slots buckets take a value of up to ~24 bytes a slot (with
// preallocate, its presence flag too); a counter's mark, little.
func (m *Merge) layoutReadBatch(projection bsoncore.Document) int32 {
	if projection != nil {
		return 10_000
	}
	perBucket := 1024 + 48*m.rule.LayoutOptions.SlotsPerWindow()
	return int32(min(max(1, stage.MaxReadBytes/perBucket), 10_000))
}

// insertNewBuckets inserts the whole buckets of keys that had none. A
// duplicate key means one appeared since the merge read them, which
// nothing but the merge does: an error, and the next run reads again.
func (m *Merge) insertNewBuckets(x *rewrite.Exec, buckets []layout.MergeStatement) error {
	docs := make([]bsoncore.Document, len(buckets))
	for i, b := range buckets {
		docs[i] = b.Doc
	}
	return m.insertAll(x, docs, func(_, _ int, reply []byte) error {
		dups, err := stage.WriteOutcome(reply)
		if err == nil && len(dups) > 0 {
			err = fmt.Errorf("%d buckets appeared while the merge wrote them", len(dups))
		}
		if err != nil {
			return fmt.Errorf("insert buckets: %w", err)
		}
		return nil
	})
}

// sortByArrival orders a layout rule's staged documents by their arrival
// stamp (bucket.FieldStagedAt), then _id: on the same proxy, the order in
// which their inserts reached it, which decides the last write of a slot.
func sortByArrival(docs []bsoncore.Document) {
	at := func(d bsoncore.Document) int64 {
		n, _ := d.Lookup(bucket.FieldStagedAt).AsInt64OK()
		return n
	}
	slices.SortStableFunc(docs, func(a, b bsoncore.Document) int {
		if c := cmpInt(at(a), at(b)); c != 0 {
			return c
		}
		return bytes.Compare(a.Lookup("_id").Data, b.Lookup("_id").Data)
	})
}
