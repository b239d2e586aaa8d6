package updates

import (
	"errors"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/deletes"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/query"
	"github.com/tsproxy/tsproxy/rewrite/updateop"
	"github.com/tsproxy/tsproxy/rules"
)

// Env is what an update plan needs besides the command.
type Env struct {
	deletes.Env
	NewObjectID func() bson.ObjectID
	Now         func() time.Time
	// RetryKey names a retryable update (its session, owner and
	// txnNumber; "" for one that is not): its rounds are journaled and
	// its reply kept, so a retry is answered once, whichever proxy it
	// reaches.
	RetryKey string
	// Sweep: the update also deletes journal records older than the
	// retention (the caller asks now and then, not on every update).
	Sweep bool
}

// updateChunk bounds the buckets one round locks, reads and rewrites,
// so that a large updateMany holds few keys at a time and inserts of
// other keys go on.
const updateChunk = 500

// maxLockRounds bounds how often a round takes its locks again because
// the events it moves, read again under the locks, go to keys it did
// not lock (a concurrent write changed them in between).
const maxLockRounds = 4

// maxProbeSeq bounds the seqs probed for a key's first free bucket.
const maxProbeSeq = 1 << 16

// Plan updates events: per statement, the matching events are found
// upstream, the buckets holding them are locked (with the keys the
// updated events move to), read, and rewritten: each matched event
// updated in its bucket, or moved to a new bucket of its new series and
// window. An upsert that matched nothing inserts its event in a new
// bucket. A statement that fails is a write error at its index.
func Plan(cmd rewrite.Command, rule *rules.Rule, env Env) rewrite.Plan {
	if len(rule.Rollups) > 0 {
		return rewrite.Fail(query.RuleErrorf(rule, mongoerr.NotImplemented, "update is not supported on a rule with rollups (its rollups would no longer count its events)"))
	}
	req, err := NewRequest(cmd, rule, env.Caps)
	if err != nil {
		return rewrite.Fail(err)
	}
	return rewrite.Script(func(x *rewrite.Exec) (rewrite.Result, error) {
		u := &updater{x: x, req: req, env: env, now: env.Now()}
		if err := u.openJournal(); err != nil {
			return rewrite.Result{}, err
		}
		if u.jr.reply != nil {
			return rewrite.Result{Reply: u.jr.reply}, nil
		}
		for _, st := range req.Statements {
			err := st.Err
			if err == nil {
				err = u.statement(st)
			}
			if errors.Is(err, rewrite.ErrAborted) {
				return rewrite.Result{}, err
			}
			if err == nil {
				continue
			}
			u.out.errs = append(u.out.errs, deletes.StatementError{Index: st.Index, Err: err})
			if req.ordered {
				break
			}
		}
		reply := req.reply(u.out)
		if err := u.recordReply(reply); err != nil {
			return rewrite.Result{}, err
		}
		return rewrite.Result{Reply: reply}, nil
	})
}

type updater struct {
	x   *rewrite.Exec
	req *Request
	env Env
	now time.Time
	out outcome
	// indexStopped: the event-id index was marked incomplete, before the
	// first new bucket (which gets no entry).
	indexStopped bool
	// images, for a findAndModify, keep its event before and after.
	images *images
	jr     *journal
	// skip are the events earlier attempts of this update already
	// updated, for the statement running (idKey of their _ids).
	skip map[string]bool
	// pick, for a findAndModify with a sort, is the one event (as
	// stored) it changes.
	pick bsoncore.Document
}

// outcome is what the reply reports.
type outcome struct {
	n, modified int
	upserted    []upsertedID
	errs        []deletes.StatementError
}

type upsertedID struct {
	index int
	id    bsoncore.Value
}

func (u *updater) rule() *rules.Rule { return u.req.rule }

// statement runs one statement.
func (u *updater) statement(st *Statement) error {
	u.skip = nil
	if done := u.jr.done[st.Index]; done != nil {
		u.out.n += done.matched
		u.out.modified += done.modified
		if done.upserted.Type != 0 {
			u.out.upserted = append(u.out.upserted, upsertedID{index: st.Index, id: done.upserted})
			return nil
		}
		if !st.Multi && done.matched > 0 {
			return nil
		}
		u.skip = done.ids
	}
	cands, err := u.req.find.Matches(u.x, st.find, u.env.Env)
	if err != nil {
		return err
	}
	if st.sort != nil {
		if cands.List, err = u.firstInOrder(st, cands.List); err != nil {
			return err
		}
	} else if !st.Multi {
		cands.KeepFirst()
	}
	matched := 0
	for list := cands.List; len(list) > 0; {
		k := min(len(list), updateChunk)
		n, err := u.round(st, list[:k])
		matched += n
		if err != nil {
			return err
		}
		if !st.Multi && matched > 0 {
			break
		}
		list = list[k:]
	}
	if matched == 0 && st.Upsert {
		return u.upsert(st)
	}
	return nil
}

// round updates the matched events of some candidate buckets under the
// locks of their keys and of the keys their events move to, and returns
// the events it matched.
func (u *updater) round(st *Statement, list []*deletes.Candidate) (int, error) {
	ids := make([]bson.ObjectID, len(list))
	for i, c := range list {
		ids[i] = c.Bucket()
	}
	// Unlocked first: the keys to lock are the buckets' and, where the
	// update may move events, those the updated events go to. An update
	// that moves none, of buckets whose keys the match reported (an
	// upstream whose $unwind keeps them), reads nothing before it locks.
	mayMove := st.Update.Touches(u.rule().MetaField) || st.Update.Touches(u.rule().TimeField)
	keys := map[string]bucket.Key{}
	if !mayMove && allKeyed(list) {
		for _, c := range list {
			keys[c.Key.String()] = c.Key
		}
		return u.lockedRounds(st, list, ids, keys)
	}
	docs, err := u.req.find.ReadBuckets(u.x, ids, mayMove)
	if err != nil {
		return 0, err
	}
	for _, doc := range docs {
		if doc != nil {
			if k, err := keyOf(doc); err == nil {
				keys[k.String()] = k
			}
		}
	}
	if mayMove {
		edits, err := u.edits(st, list, docs)
		if err != nil {
			return 0, err
		}
		addMovedKeys(keys, edits)
	}
	return u.lockedRounds(st, list, ids, keys)
}

// allKeyed says whether the match reported every candidate's key.
func allKeyed(list []*deletes.Candidate) bool {
	for _, c := range list {
		if !c.HasKey {
			return false
		}
	}
	return true
}

// lockedRounds runs lockedRound under the locks of keys, locking again
// (with the keys it missed) while its moved events go to keys it did not
// lock.
func (u *updater) lockedRounds(st *Statement, list []*deletes.Candidate, ids []bson.ObjectID, keys map[string]bucket.Key) (int, error) {
	for round := 0; ; round++ {
		unlock := u.env.Lock(keyList(keys))
		n, missing, err := u.lockedRound(st, list, ids, keys)
		unlock()
		if err != nil || len(missing) == 0 {
			return n, err
		}
		if round+1 >= maxLockRounds {
			return 0, query.RuleErrorf(u.rule(), mongoerr.ConflictingOperationInProgress, "the events an update moves kept changing under it; retry the update")
		}
		for _, k := range missing {
			keys[k.String()] = k
		}
	}
}

// lockedRound reads the buckets again under the locks, updates their
// events and writes them; missing are the keys its moved events go to
// that it did not lock (nothing written then).
func (u *updater) lockedRound(st *Statement, list []*deletes.Candidate, ids []bson.ObjectID, locked map[string]bucket.Key) (int, []bucket.Key, error) {
	docs, err := u.req.find.ReadBuckets(u.x, ids, true)
	if err != nil {
		return 0, nil, err
	}
	edits, err := u.edits(st, list, docs)
	if err != nil {
		return 0, nil, err
	}
	var missing []bucket.Key
	for _, e := range edits {
		for _, ev := range e.moved {
			k := bucket.KeyOf(ev.Meta, ev.Start)
			if _, ok := locked[k.String()]; !ok {
				missing = append(missing, k)
			}
		}
	}
	if len(missing) > 0 {
		return 0, missing, nil
	}
	n, modified := 0, 0
	for _, e := range edits {
		n += e.matched
		modified += e.modified
	}
	if err := u.write(st, edits); err != nil {
		return 0, nil, err
	}
	u.out.n += n
	u.out.modified += modified
	return n, nil, nil
}

// bucketEdit is what a statement does to one bucket.
type bucketEdit struct {
	id  bson.ObjectID
	key bucket.Key
	// replacement is the bucket with its events updated and those moved
	// out removed, without its _id; nil when no event of it changed.
	replacement       bsoncore.Document
	matched, modified int
	moved             []bucket.Event
	// ids are the _ids of the events matched.
	ids []bsoncore.Value
}

// edits applies the statement's update to the matched events of the
// buckets read (nil: gone since the match).
func (u *updater) edits(st *Statement, list []*deletes.Candidate, docs [][]byte) ([]bucketEdit, error) {
	var edits []bucketEdit
	taken := 0
	for i, doc := range docs {
		if doc == nil {
			continue
		}
		if !st.Multi && taken > 0 {
			break
		}
		e, err := u.edit(st, list[i], doc, !st.Multi)
		if err != nil {
			return nil, err
		}
		taken += e.matched
		if e.matched > 0 {
			edits = append(edits, e)
		}
	}
	return edits, nil
}

// edit updates the matched events of one bucket (at most one with
// limitOne).
func (u *updater) edit(st *Statement, cand *deletes.Candidate, bdoc bsoncore.Document, limitOne bool) (bucketEdit, error) {
	rule, lim := u.rule(), u.req.find.Limits()
	meta, start, err := bucket.KeyFields(bdoc)
	if err != nil {
		return bucketEdit{}, err
	}
	key := bucket.KeyOf(meta, start)
	e := bucketEdit{id: cand.Bucket(), key: key}
	stored, err := bucket.EventDocs(bdoc)
	if err != nil {
		return bucketEdit{}, query.RuleErrorf(rule, mongoerr.InternalError, "bucket %s: %v", e.id.Hex(), err)
	}
	matched := cand.Matched()
	var keep []bucket.Event
	changed := false
	for _, sd := range stored {
		if (limitOne && e.matched == 1) || !matched.Take(sd) || u.skip[idKey(sd.Lookup("_id"))] || (u.pick != nil && string(sd) != string(u.pick)) {
			keep = append(keep, u.req.find.StoredToEvent(sd, meta, start))
			continue
		}
		e.matched++
		e.ids = append(e.ids, sd.Lookup("_id"))
		if st.remove {
			if err := u.keepRemoved(sd, meta); err != nil {
				return bucketEdit{}, err
			}
			e.modified++
			changed = true
			continue
		}
		ev, moved, modified, err := u.updateEvent(st, sd, meta, key)
		if err != nil {
			return bucketEdit{}, err
		}
		if !modified {
			keep = append(keep, u.req.find.StoredToEvent(sd, meta, start))
			continue
		}
		e.modified++
		changed = true
		if moved {
			e.moved = append(e.moved, ev)
		} else {
			keep = append(keep, ev)
		}
	}
	if !changed {
		return e, nil
	}
	if len(keep) == 0 {
		e.replacement = bucket.Shell(meta, start)
	} else {
		e.replacement = deletes.WithoutID(bucket.Complete(e.id, keep, rule, lim))
	}
	return e, nil
}

// updateEvent applies the update to one stored event of a bucket of key:
// the event as it is to be stored, whether it leaves key, and whether
// the update changed it. An event the update makes invalid (no valid
// timeField, an unstorable meta) is MongoDB's error, and nothing of the
// statement is written.
func (u *updater) updateEvent(st *Statement, stored bsoncore.Document, meta bsoncore.Value, key bucket.Key) (bucket.Event, bool, bool, error) {
	rule := u.rule()
	doc, err := bucket.RestoreMeta(stored, rule.MetaField, func() (bsoncore.Value, error) { return meta, nil })
	if err != nil {
		return bucket.Event{}, false, false, err
	}
	updated, changed, err := st.Update.Apply(doc, updateop.Options{Now: u.now})
	if err != nil {
		return bucket.Event{}, false, false, err
	}
	if u.images != nil {
		u.images.before, u.images.after = doc, updated
	}
	if !changed {
		return bucket.Event{}, false, false, nil
	}
	ev, err := u.prepare(st, updated)
	if err != nil {
		return bucket.Event{}, false, false, err
	}
	return ev, bucket.KeyOf(ev.Meta, ev.Start).String() != key.String(), true, nil
}

// keepRemoved keeps, for a findAndModify's reply, the event it removes.
func (u *updater) keepRemoved(stored bsoncore.Document, meta bsoncore.Value) error {
	if u.images == nil {
		return nil
	}
	doc, err := bucket.RestoreMeta(stored, u.rule().MetaField, func() (bsoncore.Value, error) { return meta, nil })
	u.images.before = doc
	return err
}

// prepare validates an updated or upserted event and builds its stored
// form, as an insert of it would.
func (u *updater) prepare(st *Statement, doc bsoncore.Document) (bucket.Event, error) {
	lim := u.req.find.Limits()
	buf := make([]byte, 0, len(doc)+32)
	aggs := make([]bsoncore.Value, len(lim.Aggregates))
	ev, werr := bucket.PrepareEvent(doc, st.Index, u.rule(), lim, u.env.NewObjectID, &buf, aggs)
	if werr != nil {
		return bucket.Event{}, mongoerr.Errorf(werr.Code, "%s", werr.Msg)
	}
	return ev, nil
}

// upsert inserts the event of an upsert that matched nothing.
func (u *updater) upsert(st *Statement) error {
	doc, err := st.Update.Upserted(st.Filter, u.now)
	if err != nil {
		return err
	}
	id := bsoncore.Document(doc).Lookup("_id")
	if id.Type == 0 {
		oid := u.env.NewObjectID()
		id = bsoncore.Value{Type: bsoncore.TypeObjectID, Data: oid[:]}
		doc = prependID(doc, id)
	}
	ev, err := u.prepare(st, doc)
	if err != nil {
		return err
	}
	unlock := u.env.Lock([]bucket.Key{bucket.KeyOf(ev.Meta, ev.Start)})
	defer unlock()
	news, err := u.newBuckets([]bucket.Event{ev})
	if err != nil {
		return err
	}
	if err := u.runRound(st, round{news: news, matched: 1, upserted: id}); err != nil {
		return err
	}
	u.out.n++
	u.out.upserted = append(u.out.upserted, upsertedID{index: st.Index, id: id})
	if u.images != nil {
		u.images.after = doc
	}
	return nil
}

func prependID(doc bsoncore.Document, id bsoncore.Value) bsoncore.Document {
	elems, _ := doc.Elements()
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendValueElement(d, "_id", id)
	for _, e := range elems {
		d = append(d, e...)
	}
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

func keyOf(bdoc bsoncore.Document) (bucket.Key, error) {
	meta, start, err := bucket.KeyFields(bdoc)
	if err != nil {
		return bucket.Key{}, err
	}
	return bucket.KeyOf(meta, start), nil
}

func addMovedKeys(keys map[string]bucket.Key, edits []bucketEdit) {
	for _, e := range edits {
		for _, ev := range e.moved {
			k := bucket.KeyOf(ev.Meta, ev.Start)
			keys[k.String()] = k
		}
	}
}

func keyList(keys map[string]bucket.Key) []bucket.Key {
	names := make([]string, 0, len(keys))
	for n := range keys {
		names = append(names, n)
	}
	slices.Sort(names)
	out := make([]bucket.Key, len(names))
	for i, n := range names {
		out[i] = keys[n]
	}
	return out
}
