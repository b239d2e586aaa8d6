package merge

import (
	"fmt"
	"slices"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/stage"
)

// Topping up. A merge that starts new buckets after a key's last one
// leaves that last bucket as full as the merge before it left it: merges
// of an open window (merge batches, the merge before a read) would each
// leave one partial bucket a key. With MergeOptions.TopUp a merge first
// fills the key's last bucket, when it has room, with the key's earliest
// new events, and starts new buckets only for the rest: one rewrite of
// one bucket a key a merge, so a bucket is rewritten at most as many
// times as merges reach it before it is full.
//
// Why it is safe:
//   - The merge reads the last bucket under the key's lock (the lock a
//     delete takes for its read and rewrite of a bucket: Host.LockBuckets)
//     and rewrites it before releasing it, so a delete on this proxy never
//     interleaves. A delete needs the rule's writer lease where topping up
//     runs (FerretDB), and settles the staging tier first, which finishes a
//     merge that was cut: no delete reaches the bucket between a cut merge
//     and its repetition either.
//   - The bucket as read is recorded in the merge's plan, before anything
//     is written. The first run of a merge rewrites it by _id alone (a
//     filter FerretDB sends to its storage: with {_id, count} it decoded
//     every bucket of the rule, once a statement): nothing else writes it
//     between the read and the rewrite (the lock above, the writer
//     lease). A repeated merge's rewrite is conditional on the count as
//     read: it rebuilds the same bucket from the plan, and finds it
//     written already (count and event ids are the new ones) or rewrites
//     it.
//   - The bucket keeps every event it held (the new events are added, the
//     old never moved), so its count only grows, and the condition on it
//     cannot meet a bucket that already took the new events.

// What a top-up may cost. These upstreams rewrite a whole document on
// every update, so topping up a bucket of n events with k costs n+k event
// writes, and merges of a few events each (the merge before a read takes
// what was staged since the last read: one or a few events a series)
// would cost more the fuller the open bucket, up to maxEvents a merge. So
// a merge tops up a last bucket only while it holds fewer than the floor
// (MergeOptions.TopUpFloor), or at most topUpRatio times the events the
// merge has for its key; past that the key starts a new bucket. What a
// merge rewrites is then at most the floor a key plus topUpRatio+1 writes
// an event, whatever maxEvents. The price: under reads more frequent than
// the floor's events a series, buckets close at the floor (128 events:
// still over 100 times fewer documents than events) instead of at
// maxEvents; merges of more events (merge batches, flushes, the merge
// after a quiet period) still fill them.
//
// The closing top-up. Merges cut per-event inserts by size (a merge
// batch), wherever that falls in a window, so the merge that takes a
// window's last events may have few of them for a bucket the merge before
// left half full: 99 events for a bucket of 501 (tsbench ingest, batch 1)
// were a bucket of their own, and batch 1 ended with more buckets than
// batch 1000. A merge that also takes events of a later window of the
// same series sees the key's window closed (closingKeys): it tops the
// last bucket up whatever the ratio, once a key in the life of the
// merging proxy's directory (KnownKey.Closed; only keys the directory
// learns), so late events that trickle into a closed window later cost
// what they cost before. That one rewrite is at most the window's own
// events, so at most one write more an event of the window.
const (
	DefaultTopUpFloor = 128
	topUpRatio        = 4
)

// closingKeys are the keys of groups whose series has a group of a later
// window in the same merge: events arrive about in time order, so those
// windows are closed (the closing top-up above).
func closingKeys(groups []group) map[string]bool {
	latest := map[string]int64{} // by series
	for _, g := range groups {
		if s, ok := latest[string(g.key.Meta)]; !ok || g.key.Start > s {
			latest[string(g.key.Meta)] = g.key.Start
		}
	}
	var out map[string]bool
	for _, g := range groups {
		if g.key.Start < latest[string(g.key.Meta)] {
			if out == nil {
				out = map[string]bool{}
			}
			out[g.key.String()] = true
		}
	}
	return out
}

// mayCloseKey says whether key k, whose window this merge sees closed,
// gets its closing top-up: not yet in this directory's life, and the
// directory will learn that it had it (it knows the key, or learns the
// keys the merge probes).
func (m *Merge) mayCloseKey(k string) bool {
	if kk, ok := m.planKnown[k]; ok {
		return !kk.Closed
	}
	return m.planProbed[k]
}

// worthToppingUp says whether a last bucket of old events is topped up
// by a merge with adding events for its key.
func (m *Merge) worthToppingUp(old, adding int) bool {
	floor := m.opts.TopUpFloor
	if floor <= 0 {
		floor = DefaultTopUpFloor
	}
	return old < floor || old <= topUpRatio*adding
}

// topUp is a key's last bucket as a merge read it, to be filled up.
type topUp struct {
	seq int
	doc bsoncore.Document // the bucket as read (kept in the plan)
	old []bucket.Event
}

// maxTopUpBytes bounds the buckets one merge plan records (they are
// copied into the plan document, which must stay under 16 MiB): keys past
// it start new buckets, as without topping up.
const maxTopUpBytes = 8 << 20

// groupKeys are the keys of groups.
func groupKeys(groups []group) []bucket.Key {
	keys := make([]bucket.Key, len(groups))
	for i, g := range groups {
		keys[i] = g.key
	}
	return keys
}

// lockKeys locks keys through Host.LockBuckets.
func (m *Merge) lockKeys(keys []bucket.Key) func() {
	if len(keys) == 0 {
		return func() {}
	}
	return m.host().LockBuckets(keys)
}

// readTopUps reads the last bucket of each key whose base is past seq 0
// and keeps those with room for more events. A key the directory knows
// (known) is not read: its last bucket is full, or known as written.
func (m *Merge) readTopUps(x *rewrite.Exec, groups []group, bases map[string]int, known map[string]stage.KnownKey) (map[string]*topUp, error) {
	ns := m.rule.BucketNamespace()
	closing := map[string]bool{}
	for k := range closingKeys(groups) {
		if m.mayCloseKey(k) {
			closing[k] = true
		}
	}
	// What the directory learns of them, whatever this merge finds.
	m.planClosing = closing
	byID := map[bson.ObjectID]string{}
	adding := map[string]int{}
	var ids []bson.ObjectID
	var found []bsoncore.Document
	for _, g := range groups {
		k := g.key.String()
		s := bases[k]
		if s == 0 {
			continue
		}
		adding[k] = len(g.events)
		if kk, ok := known[k]; ok && kk.Next == s && (kk.Full || kk.Last != nil) {
			if kk.Last != nil { // as this proxy's last merge of the key wrote it
				byID[g.key.ID(ns, s-1)] = k
				found = append(found, kk.Last)
			}
			continue
		}
		id := g.key.ID(ns, s-1)
		byID[id] = k
		ids = append(ids, id)
	}
	if len(ids) > 0 {
		read, err := m.bucketsByID(x, ids, nil)
		if err != nil {
			return nil, fmt.Errorf("read last buckets: %w", err)
		}
		found = append(found, read...)
	}
	if len(found) == 0 {
		return nil, nil
	}
	stage.SortByID(found)
	tops := map[string]*topUp{}
	total := 0
	for _, d := range found {
		id, _ := stage.IdOf(d)
		k, ok := byID[id]
		if !ok || total+len(d) > maxTopUpBytes {
			continue
		}
		t, err := m.topUpOf(d, bases[k]-1, adding[k], closing[k])
		if err != nil {
			return nil, fmt.Errorf("last bucket %s: %w", id.Hex(), err)
		}
		if t != nil {
			tops[k] = t
			total += len(d)
		}
	}
	return tops, nil
}

// topUpOf is bucket d (seq) as a top-up for adding events, or nil when
// it has no room or is not worth it; closing: its key's closing top-up,
// worth it whatever it holds.
func (m *Merge) topUpOf(d bsoncore.Document, seq, adding int, closing bool) (*topUp, error) {
	if n := bucketCount(d); n < 0 || n >= m.lim.MaxEvents || !closing && !m.worthToppingUp(n, adding) {
		return nil, nil
	}
	old, err := bucket.StoredEvents(d, m.rule, m.lim)
	if err != nil {
		return nil, err
	}
	if eventBytes(old) >= m.lim.MaxBytes {
		return nil, nil
	}
	return &topUp{seq: seq, doc: d, old: old}, nil
}

func eventBytes(evs []bucket.Event) int64 {
	var n int64
	for _, e := range evs {
		n += int64(len(e.Stored))
	}
	return n
}

// fillUp splits a key's new events (sorted by time) into those that go
// into the last bucket t, with its old events (the bucket's events, in
// time order), and the rest. added is 0 when the bucket takes none.
func (t *topUp) fillUp(evs []bucket.Event, lim bucket.Limits) (bucketEvents []bucket.Event, added int, rest []bucket.Event) {
	n, size := len(t.old), eventBytes(t.old)
	for added < len(evs) && n < lim.MaxEvents && size+int64(len(evs[added].Stored)) <= lim.MaxBytes {
		n, size = n+1, size+int64(len(evs[added].Stored))
		added++
	}
	if added == 0 {
		return nil, 0, evs
	}
	bucketEvents = append(slices.Clone(t.old), evs[:added]...)
	slices.SortStableFunc(bucketEvents, func(a, b bucket.Event) int { return cmpInt(a.Time, b.Time) })
	return bucketEvents, added, evs[added:]
}

// rewriteTopUps rewrites the topped-up buckets of a merge (in a
// repeated merge, each on the condition that it still holds the count the
// merge read), and counts their new events into the rule's rollups when
// every rewrite took effect now. A bucket the rewrite missed must hold
// the merge's events already (a repeated merge wrote it): anything else
// is an error, never an overwrite.
func (m *Merge) rewriteTopUps(x *rewrite.Exec, topped []builtBucket, repeated bool) error {
	// FerretDB keeps each statement's query open until its update command
	// ends, one pool connection each (PostgreSQL's pool holds 50): a
	// command of many statements beside other clients' work exhausts the
	// pool and FerretDB stops answering anyone (CI met that with 47). So
	// at most MaxUpdateStatements a command, as the rollups do.
	for len(topped) > 0 {
		n := min(len(topped), m.statementsPer())
		if err := m.rewriteTopUpBatch(x, topped[:n], repeated); err != nil {
			return err
		}
		topped = topped[n:]
	}
	return nil
}

// rewriteTopUpBatch is rewriteTopUps for one update command.
func (m *Merge) rewriteTopUpBatch(x *rewrite.Exec, topped []builtBucket, repeated bool) error {
	stmts := make([]bsoncore.Document, len(topped))
	for i, b := range topped {
		q := bsoncore.NewDocumentBuilder().AppendObjectID("_id", b.id)
		if repeated {
			q.AppendInt32(bucket.FieldCount, int32(b.oldCount))
		}
		stmts[i] = bsoncore.NewDocumentBuilder().AppendDocument("q", q.Build()).AppendDocument("u", b.doc).Build()
	}
	body := bsoncore.NewDocumentBuilder().AppendString("update", m.rule.BucketCollection).AppendBoolean("ordered", false).AppendString("$db", m.rule.DB).Build()
	reply, ok := x.Do(rewrite.Step{{Body: body, Seq: &rewrite.Sequence{Identifier: "updates", Documents: stmts}, Update: true}})
	if !ok {
		return rewrite.ErrAborted
	}
	doc := bsoncore.Document(reply[0])
	if _, err := stage.WriteOutcome(reply[0]); err != nil { // the reply's error, write errors and write concern
		return fmt.Errorf("top up buckets: %w", err)
	}
	var err error
	if n, _ := doc.Lookup("n").AsInt64OK(); int(n) == len(topped) {
		err = m.countRollups(x, topped, nil)
	} else {
		// Some were written before (a repeated merge): check that each
		// holds what the merge would write. Rollups are not counted
		// (they count at most once).
		err = m.verifyToppedUp(x, topped)
	}
	if err != nil {
		return err
	}
	return m.dropOldEntries(x, topped)
}

// dropOldEntries deletes the event-id index entries the topped-up
// buckets had before (idindex.Writer.DropOld).
func (m *Merge) dropOldEntries(x *rewrite.Exec, topped []builtBucket) error {
	var old []bsoncore.Value
	for _, b := range topped {
		// The same filter (a few events, whose bits were all set) names
		// the same entry: it is the new one too.
		if !b.oldEntry.Equal(b.entry.Lookup("_id")) {
			old = append(old, b.oldEntry)
		}
	}
	return m.ids.DropOld(x, old)
}

// verifyToppedUp checks that each of topped holds the merge's events, in
// order.
func (m *Merge) verifyToppedUp(x *rewrite.Exec, topped []builtBucket) error {
	want := map[bson.ObjectID]builtBucket{}
	ids := make([]bson.ObjectID, 0, len(topped))
	for _, b := range topped {
		want[b.id] = b
		ids = append(ids, b.id)
	}
	found, err := drainAll(x, m.rule.DB, m.rule.BucketCollection, stage.FindBatched(m.rule.DB, m.rule.BucketCollection, stage.IdsIn(ids), m.readBatch()), m.readBatch())
	if err != nil {
		return err
	}
	for _, d := range found {
		id, _ := stage.IdOf(d)
		b, ok := want[id]
		if !ok {
			continue
		}
		if !sameEventIDs(d, b.all) {
			return mongoerr.Errorf(mongoerr.InternalError, "bucket %s changed since the merge read it to top it up (was it written outside the staging tier?)", id.Hex())
		}
		delete(want, id)
	}
	for id, b := range want {
		// The retention sweep (under a lease of its own) may delete a
		// bucket of late data between the merge's read and its rewrite,
		// or before a cut merge is repeated: its window is expired, and
		// so are the events the merge had for it. Anything else missing
		// is an error, which would otherwise fail every later merge.
		if meta, start, err := bucket.KeyFields(b.doc); err == nil && m.sweepable(bucket.KeyOf(meta, start)) {
			m.Stats.Swept++
			delete(want, id)
		}
	}
	if len(want) > 0 {
		return mongoerr.Errorf(mongoerr.InternalError, "%d buckets to top up are not there", len(want))
	}
	return nil
}

// sameEventIDs says whether bucket d holds exactly evs, in order, by
// event _id.
func sameEventIDs(d bsoncore.Document, evs []bucket.Event) bool {
	vals, err := bucket.EventValues(d)
	if err != nil || len(vals) != len(evs) {
		return false
	}
	for i, v := range vals {
		doc, ok := v.DocumentOK()
		if !ok || !doc.Lookup("_id").Equal(evs[i].Stored.Lookup("_id")) {
			return false
		}
	}
	return true
}

// topUpsDoc is the plan's record of the buckets to top up: [{k, s, b}].
func topUpsDoc(tops map[string]*topUp) bsoncore.Array {
	arr := bsoncore.NewArrayBuilder()
	keys := make([]string, 0, len(tops))
	for k := range tops {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		t := tops[k]
		arr.AppendDocument(bsoncore.NewDocumentBuilder().AppendBinary("k", 0, []byte(k)).AppendInt32("s", int32(t.seq)).AppendDocument("b", t.doc).Build())
	}
	return arr.Build()
}

// readTopUpsDoc reads topUpsDoc's output back.
func (m *Merge) readTopUpsDoc(arr bsoncore.Array) (map[string]*topUp, error) {
	vals, err := arr.Values()
	if err != nil {
		return nil, err
	}
	tops := map[string]*topUp{}
	for _, v := range vals {
		e, ok := v.DocumentOK()
		if !ok {
			return nil, fmt.Errorf("a top-up is not a document")
		}
		_, k, okK := e.Lookup("k").BinaryOK()
		s, okS := e.Lookup("s").AsInt64OK()
		d, okB := e.Lookup("b").DocumentOK()
		if !okK || !okS || !okB {
			return nil, fmt.Errorf("a top-up lacks k, s or b")
		}
		old, err := bucket.StoredEvents(d, m.rule, m.lim)
		if err != nil {
			return nil, fmt.Errorf("top-up of seq %d: %w", s, err)
		}
		tops[string(k)] = &topUp{seq: int(s), doc: d, old: old}
	}
	return tops, nil
}
