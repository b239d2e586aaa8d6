package updates

import (
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/deletes"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/query"
	"github.com/tsproxy/tsproxy/rules"
)

// write stores a round's edits, in journal records of at most
// maxRecordBytes of buckets.
func (u *updater) write(st *Statement, edits []bucketEdit) error {
	for len(edits) > 0 {
		k, size := 0, 0
		for k < len(edits) && (k == 0 || size+editBytes(edits[k]) <= maxRecordBytes) {
			size += editBytes(edits[k])
			k++
		}
		if err := u.writeRound(st, edits[:k]); err != nil {
			return err
		}
		edits = edits[k:]
	}
	return nil
}

func editBytes(e bucketEdit) int {
	n := len(e.replacement)
	for _, ev := range e.moved {
		n += len(ev.Stored)
	}
	return n
}

// writeRound writes some edits: journaled where it must be (beginRound),
// the buckets of moved events first, then the replacements of the
// buckets they left. A replacement that fails removes the new buckets
// again and the record with them, so that no event is left in both; a
// proxy stopped part way leaves the record pending, and the next update
// finishes it (openJournal).
func (u *updater) writeRound(st *Statement, edits []bucketEdit) error {
	var moved []bucket.Event
	var r round
	for _, e := range edits {
		moved = append(moved, e.moved...)
		r.matched += e.matched
		r.modified += e.modified
		r.ids = append(r.ids, e.ids...)
		if e.replacement != nil {
			r.replaces = append(r.replaces, replaced{id: e.id, doc: e.replacement})
		}
	}
	news, err := u.newBuckets(moved)
	if err != nil {
		return err
	}
	r.news = news
	return u.runRound(st, r)
}

// runRound journals and writes one round.
func (u *updater) runRound(st *Statement, r round) error {
	id, err := u.beginRound(st, r)
	if err != nil {
		return err
	}
	if err := u.insertBuckets(r.news); err != nil {
		u.abandonRound(id)
		return err
	}
	if err := u.replace(replacementsOf(r.replaces)); err != nil {
		u.removeBuckets(bucketIDs(r.news))
		u.abandonRound(id)
		return err
	}
	return u.endRound(id)
}

// abandonRound deletes the record of a round whose writes were undone.
func (u *updater) abandonRound(id string) {
	if id != "" {
		_ = u.journalWrite(u.deleteCommand(bsoncore.NewDocumentBuilder().AppendString("_id", id).Build()))
	}
}

func replacementsOf(rs []replaced) []deletes.BucketEdit {
	out := make([]deletes.BucketEdit, len(rs))
	for i, r := range rs {
		out[i] = deletes.BucketEdit{ID: r.id, Replacement: r.doc}
	}
	return out
}

func bucketIDs(docs []bsoncore.Document) []bson.ObjectID {
	ids := make([]bson.ObjectID, 0, len(docs))
	for _, d := range docs {
		if id, ok := d.Lookup(bucket.FieldID).ObjectIDOK(); ok {
			ids = append(ids, id)
		}
	}
	return ids
}

// replace runs the bucket replacements in batches.
func (u *updater) replace(replace []deletes.BucketEdit) error {
	limit := 50
	if m := u.env.Caps.MaxUpdateStatements; m > 0 {
		limit = min(limit, m)
	}
	for len(replace) > 0 {
		k := min(len(replace), limit)
		if _, err := u.req.find.Write(u.x, u.env.Env, u.req.find.ReplaceCommand(replace[:k]), k); err != nil {
			return mongoerr.Errorf(mongoerr.CodeOf(err), "tsproxy rule %s: rewriting buckets: %v", u.rule().Namespace, err)
		}
		replace = replace[k:]
	}
	return nil
}

// newBuckets are the new buckets of events, at their keys' first free
// seqs (read, not written: the caller holds the keys' locks).
func (u *updater) newBuckets(events []bucket.Event) ([]bsoncore.Document, error) {
	rule, lim := u.rule(), u.req.find.Limits()
	ns := rule.BucketNamespace()
	var docs []bsoncore.Document
	for _, group := range bucket.GroupEvents(events) {
		key := bucket.KeyOf(group[0].Meta, group[0].Start)
		seq, err := u.freeSeq(key)
		if err != nil {
			return nil, err
		}
		for _, chunk := range bucket.ChunkEvents(group, lim) {
			docs = append(docs, bucket.Complete(key.ID(ns, seq), chunk, rule, lim))
			seq++
		}
	}
	return docs, nil
}

// insertBuckets writes new buckets; one that fails removes those written.
func (u *updater) insertBuckets(docs []bsoncore.Document) error {
	if len(docs) == 0 {
		return nil
	}
	if err := u.stopIDIndex(); err != nil {
		return err
	}
	done, err := u.req.find.Write(u.x, u.env.Env, u.req.find.InsertCommand(docs), len(docs))
	if err != nil {
		u.removeBuckets(bucketIDs(docs[:min(done, len(docs))]))
		return mongoerr.Errorf(mongoerr.CodeOf(err), "tsproxy rule %s: writing the buckets of updated events: %v", u.rule().Namespace, err)
	}
	return nil
}

// freeSeq is the first seq of key with no bucket.
func (u *updater) freeSeq(key bucket.Key) (int, error) {
	ns := u.rule().BucketNamespace()
	for s := 0; s < maxProbeSeq; s++ {
		_, found, err := u.req.find.CountBucket(u.x, key.ID(ns, s))
		if err != nil || !found {
			return s, err
		}
	}
	return 0, query.RuleErrorf(u.rule(), mongoerr.InternalError, "more than %d buckets for one series and window", maxProbeSeq)
}

// removeBuckets deletes buckets this plan added, after a later write of
// it failed: the events they hold are still where they were.
func (u *updater) removeBuckets(ids []bson.ObjectID) {
	if len(ids) > 0 {
		_, _ = u.req.find.Write(u.x, u.env.Env, u.req.find.RemoveCommand(ids), len(ids))
	}
}

// stopIDIndex marks the rule's event-id index incomplete before the
// first new bucket, which gets no entry: finds by event _id then read
// the buckets rather than miss the moved event.
func (u *updater) stopIDIndex() error {
	rule := u.rule()
	if u.indexStopped || rule.Layout != rules.LayoutEvents || rule.Partitioned() {
		return nil
	}
	cmd, err := bson.Marshal(bucket.IDIndexStopCommand(rule))
	if err != nil {
		return err
	}
	reply, ok := u.x.One(cmd)
	if !ok {
		return rewrite.ErrAborted
	}
	if err := mongoerr.ReplyError(reply); err != nil && mongoerr.CodeOf(err) != mongoerr.NamespaceNotFound {
		return err
	}
	u.indexStopped = true
	return nil
}
