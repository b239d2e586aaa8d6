package merge

import (
	"bytes"
	"fmt"
	"slices"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/source"
	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rules"
)

// planID is the _id of a retired collection's plan document: the first
// seq of each key and the staged documents left out as retries, recorded
// before any bucket is written so a repeated merge writes the same ones.
const planID = "plan"

// mergePlan is what a merge of one retired collection writes.
type mergePlan struct {
	bases map[string]int // by Key.String(): the first seq to write
	skip  map[bson.ObjectID]bool
	ids   map[string]bool // the staged documents merged, by idKey
	// tops are the last buckets to fill up, by Key.String();
	// rawTops is their record as read from a plan document.
	tops    map[string]*topUp
	rawTops bsoncore.Array
	// markers counts the marker documents the collection holds: neither staged
	// nor late.
	markers int
	// mark is what a counter merge marks its buckets with
	// (layout.CounterMerged): made once, when the plan is, so a repeat
	// of this merge tells its own writes from any other's.
	mark string
	// record is the key of this merge's record of the ids it merged
	// (recordKey): made once, when the plan is.
	record string
}

// idKey is a staged document's _id as a map key (type and bytes).
func idKey(d bsoncore.Document) string {
	v := d.Lookup("_id")
	return string(rune(v.Type)) + string(v.Data)
}

// moveLate moves the documents that reached retired collection coll
// after the merge read it back into staging: FerretDB's rename changes
// only its catalog, so an insert of another proxy that had looked the
// staging collection up before the rename commits into the renamed one.
// This proxy holds its own inserts off during a freeze; another's are
// caught here, just before the drop (an insert the drop overtakes fails
// and is not acknowledged). They go to the staging collection of their
// period, where the next merge takes them.
func (m *Merge) moveLate(x *rewrite.Exec, r stage.Collection, merged map[string]bool, markers int) error {
	// A proxy's own collection, frozen by it, takes nothing late: it
	// held its own inserts off, and no other proxy inserts there. One
	// taken over from a stopped owner may; one of the holder's names, as
	// the caller says.
	if !r.TakenOver && (r.Owner != "" || !m.opts.CheckLate) {
		return nil
	}
	coll := r.Name
	// The count first: reading the ids decodes every document on FerretDB.
	n, err := m.countOf(x, coll)
	if err != nil {
		return err
	}
	if n <= int64(len(merged)+1+markers) { // the staged documents, the plan and the markers
		return nil
	}
	all, err := drainAll(x, m.rule.DB, coll, stage.FindCommand(m.rule.DB, coll, nil, bsoncore.NewDocumentBuilder().AppendInt32("_id", 1).Build()), 0)
	if err != nil {
		return err
	}
	var late []bson.ObjectID
	for _, d := range all {
		if id, ok := stage.IdOf(d); ok && !merged[idKey(d)] {
			late = append(late, id)
		}
	}
	if len(late) == 0 {
		return nil
	}
	docs, err := drainAll(x, m.rule.DB, coll, stage.FindBatched(m.rule.DB, coll, stage.IdsIn(late), m.readBatch()), m.readBatch())
	if err != nil {
		return err
	}
	// Back to the open collection of r's staging period, which holds
	// every event of r: a staged document's own key is no guide, since
	// the packed form (bucket.StagedPacked) has none at its top.
	open := m.rule.StageCollection(r.Window)
	for _, d := range docs {
		if err := m.insertOne(x, open, markMovedLate(d)); err != nil {
			return fmt.Errorf("move late staged document %s: %w", d.Lookup("_id"), err)
		}
	}
	m.Stats.Late += len(docs)
	return nil
}

// markMovedLate is staged document d marked as moved back to staging
// (bucket.FieldMovedLate), so that the merge that stores it records its
// _id (recordedID).
func markMovedLate(d bsoncore.Document) bsoncore.Document {
	if _, ok := bsonutil.Lookup(d, bucket.FieldMovedLate); ok {
		return d
	}
	out := append(make([]byte, 0, len(d)+len(bucket.FieldMovedLate)+3), d[:len(d)-1]...)
	out = bsoncore.AppendBooleanElement(out, bucket.FieldMovedLate, true)
	out = append(out, 0)
	return bsoncore.UpdateLength(out, 0, int32(len(out)))
}

// recordedID is the _id of staged document d when the merge that stores
// it records it (RecordDoc), so that a later copy of d is left out
// (RecordSet.mergedElsewhere): a retryable write's (a retry meets the
// same derived id), or a document moved back to staging (a copy of the
// move may land after the merge).
func recordedID(d bsoncore.Document) (bson.ObjectID, bool) {
	id, ok := stage.IdOf(d)
	if !ok {
		return id, false
	}
	if stage.IsDerived(id) {
		return id, true
	}
	_, late := bsonutil.Lookup(d, bucket.FieldMovedLate)
	return id, late
}

// group is the events of one key, sorted by time.
type group struct {
	key    bucket.Key
	events []bucket.Event
}

// mergeOne merges retired collection r into the bucket collection and
// drops it. records are the ids earlier merges recorded, by token.
func (m *Merge) mergeOne(x *rewrite.Exec, r stage.Collection, records *stage.RecordSet) error {
	docs, err := m.stagedOf(x, r)
	if err != nil {
		return err
	}
	plan, staged, markers, err := splitRetired(docs)
	if err != nil {
		return err
	}
	repeated := plan != nil
	if plan == nil {
		plan = newMergePlan(staged, records, r)
	} else {
		// A repeated merge merges what the first run planned; documents
		// that reached the collection after that are late (see moveLate).
		staged = slices.DeleteFunc(staged, func(d bsoncore.Document) bool { return !plan.ids[idKey(d)] })
	}
	plan.markers = markers
	if m.rule.Layout != rules.LayoutEvents {
		return m.mergeLayoutOne(x, r, staged, plan, repeated, records)
	}
	groups, recorded, err := m.groups(staged, plan.skip)
	if err != nil {
		return err
	}
	// The keys of the buckets this merge tops up stay locked until they
	// are written.
	unlock, err := m.planKeys(x, r, groups, plan)
	defer func() { unlock() }()
	if err != nil {
		return err
	}
	if err := m.recordMerged(x, recordKey(r, plan), recorded, records); err != nil {
		return err
	}
	buckets, topped, events := m.buckets(groups, plan)
	if err := m.ids.Start(x); err != nil {
		return err
	}
	if err := m.ids.WriteSeries(x, groupKeys(groups)); err != nil {
		return err
	}
	if err := m.ids.WriteBuckets(x, idIndexBuckets(append(slices.Clip(buckets), topped...))); err != nil {
		return err
	}
	if err := m.insertBuckets(x, buckets); err != nil {
		return err
	}
	if err := m.rewriteTopUps(x, topped, repeated); err != nil {
		return err
	}
	if repeated || !m.opts.TopUp {
		m.forgetPlanKeys() // not under this run's key locks: the directory is not told
	} else if err := m.learn(x); err != nil {
		return err
	}
	unlock()
	unlock = func() {}
	if err := m.finishRetired(x, r, plan); err != nil {
		return err
	}
	m.Stats.Events += events
	m.Stats.Buckets += len(buckets)
	m.Stats.ToppedUp += len(topped)
	m.Stats.Keys += len(groups)
	m.Stats.Series = max(m.Stats.Series, seriesOf(groupKeys(groups)))
	m.Stats.Retries += len(plan.skip)
	return nil
}

// planKeys completes plan with where each group's buckets go: on the
// first run, each key's first free seq and the last buckets to top up,
// recorded in retired collection r before any bucket is written; on a
// repeated run, the top-ups its record holds. unlock releases the keys it
// locked (the top-ups' keys, until they are written); it is set, and must
// be called, even with an error.
func (m *Merge) planKeys(x *rewrite.Exec, r stage.Collection, groups []group, plan *mergePlan) (unlock func(), err error) {
	unlock = func() {}
	if plan.bases != nil {
		if len(plan.rawTops) > 0 {
			if plan.tops, err = m.readTopUpsDoc(plan.rawTops); err != nil {
				return unlock, fmt.Errorf("plan document: %w", err)
			}
			unlock = m.lockKeys(groupKeys(groups))
		}
		return unlock, nil
	}
	var known map[string]stage.KnownKey
	if m.opts.TopUp {
		// Locked before the probe: a delete that empties and removes a
		// key's last bucket must not run between the probe and the
		// writes, which would then leave a gap in the key's seqs.
		keys := groupKeys(groups)
		unlock = m.lockKeys(keys)
		if known, err = m.knownKeys(x, keys); err != nil {
			return unlock, err
		}
		m.planKnown = known
		m.planProbed = m.probedKeys(keys, known)
	}
	if plan.bases, err = m.probeBases(x, groups, known); err != nil {
		return unlock, err
	}
	if m.opts.TopUp {
		if plan.tops, err = m.readTopUps(x, groups, plan.bases, known); err != nil {
			return unlock, err
		}
	}
	if err := m.insertOne(x, r.Name, planDoc(plan)); err != nil {
		return unlock, fmt.Errorf("record plan: %w", err)
	}
	return unlock, nil
}

// splitRetired sorts what a retired collection holds: the plan its
// merge recorded (nil before one), its staged documents in _id order, and
// how many marker documents.
func splitRetired(docs []bsoncore.Document) (plan *mergePlan, staged []bsoncore.Document, markers int, err error) {
	for _, d := range docs {
		if s, ok := d.Lookup("_id").StringValueOK(); ok && s == planID {
			if plan, err = readPlan(d); err != nil {
				return nil, nil, 0, err
			}
			continue
		}
		if stage.IsMarker(d) {
			markers++
			continue
		}
		staged = append(staged, d)
	}
	stage.SortByID(staged)
	// Two staged documents of one _id are one write's two attempts: the
	// collection lacked its unique _id index, which FerretDB on
	// PostgreSQL leaves out when it is killed between creating a
	// collection and its index. Merged once.
	staged = slices.CompactFunc(staged, func(a, b bsoncore.Document) bool {
		x, y := a.Lookup("_id"), b.Lookup("_id")
		return x.Type == y.Type && bytes.Equal(x.Data, y.Data)
	})
	return plan, staged, markers, nil
}

// newMergePlan is the first run's plan of the merge of retired collection
// r: every staged document, less the retries of writes that records show
// merged by another merge.
func newMergePlan(staged []bsoncore.Document, records *stage.RecordSet, r stage.Collection) *mergePlan {
	plan := &mergePlan{skip: map[bson.ObjectID]bool{}, ids: map[string]bool{}, record: stage.NewRecordKey(r)}
	var recorded []bson.ObjectID
	for _, d := range staged {
		plan.ids[idKey(d)] = true
		if id, ok := recordedID(d); ok {
			recorded = append(recorded, id)
		}
	}
	for id := range records.MergedElsewhere(recorded, plan.record) {
		plan.skip[id] = true
	}
	return plan
}

// recordMerged records the ids of the staged documents of r that a later
// copy must not be merged again (recordedID: retryable writes, and
// documents moved back to staging) in TxnsCollection, before the merge
// of r writes their events.
func (m *Merge) recordMerged(x *rewrite.Exec, key string, recorded []bson.ObjectID, records *stage.RecordSet) error {
	if len(recorded) == 0 {
		return nil
	}
	if err := m.insertOne(x, stage.TxnsCollection(m.rule), stage.RecordDoc(key, recorded, m.opts.Now)); err != nil {
		return fmt.Errorf("record merged retryable writes: %w", err)
	}
	// The retired collections after this one in the same run leave
	// these out too, and the proxy's next merges (RecordCache).
	records.Add(key, m.opts.Now.UnixMilli(), recorded)
	return nil
}

// finishRetired ends the merge of retired collection r by plan: late
// documents go back to staging, and r is dropped.
func (m *Merge) finishRetired(x *rewrite.Exec, r stage.Collection, plan *mergePlan) error {
	if err := m.moveLate(x, r, plan.ids, plan.markers); err != nil {
		return err
	}
	if recycled, err := m.recycle(x, r); err != nil || recycled {
		if err == nil {
			m.Stats.Collections++
		}
		return err
	}
	reply, ok := x.One(source.DropCommand(m.rule.DB, r.Name))
	if !ok {
		return rewrite.ErrAborted
	}
	if err := mongoerr.ReplyError(reply); err != nil && mongoerr.CodeOf(err) != mongoerr.NamespaceNotFound {
		return fmt.Errorf("drop: %w", err)
	}
	m.Stats.Collections++
	return nil
}

// groups reads the staged documents' events, by key in key order, each
// sorted by time (staged documents in _id order, so ties keep one order
// on every run); recorded are the recordedIDs among the documents merged.
func (m *Merge) groups(staged []bsoncore.Document, skip map[bson.ObjectID]bool) ([]group, []bson.ObjectID, error) {
	var recorded []bson.ObjectID
	staged = slices.DeleteFunc(slices.Clone(staged), func(d bsoncore.Document) bool {
		if id, ok := recordedID(d); ok && !skip[id] {
			recorded = append(recorded, id)
		}
		id, isOID := stage.IdOf(d)
		return isOID && skip[id]
	})
	decoded := make([][]bucket.Event, len(staged))
	errs := make([]error, len(staged))
	stage.EachInParallel(len(staged), func(i int) {
		decoded[i], errs[i] = bucket.StagedEvents(staged[i], m.rule, m.lim)
	})
	for i, err := range errs {
		if err != nil {
			return nil, nil, fmt.Errorf("staged document %s: %w", staged[i].Lookup("_id"), err)
		}
	}
	// A staged document holds one or more groups, each of one key: a key
	// is looked up once a run of its events. The runs are gathered
	// first, so that each group's events are copied once, into a slice
	// of their size.
	type run struct {
		group int
		evs   []bucket.Event
	}
	byKey := map[string]int{}
	var groups []group
	var runs []run
	var sizes []int
	for _, evs := range decoded {
		for from := 0; from < len(evs); {
			to := from + 1
			for to < len(evs) && evs[to].Start == evs[from].Start && evs[to].Meta.Equal(evs[from].Meta) {
				to++
			}
			k := bucket.KeyOf(evs[from].Meta, evs[from].Start)
			i, ok := byKey[k.String()]
			if !ok {
				i = len(groups)
				byKey[k.String()] = i
				groups = append(groups, group{key: k})
				sizes = append(sizes, 0)
			}
			runs = append(runs, run{group: i, evs: evs[from:to]})
			sizes[i] += to - from
			from = to
		}
	}
	for i := range groups {
		groups[i].events = make([]bucket.Event, 0, sizes[i])
	}
	for _, r := range runs {
		groups[r.group].events = append(groups[r.group].events, r.evs...)
	}
	byTime := func(a, b bucket.Event) int { return cmpInt(a.Time, b.Time) }
	for i := range groups {
		// Events mostly arrive in time order: the check costs a pass, a
		// stable sort of the structs many moves.
		if !slices.IsSortedFunc(groups[i].events, byTime) {
			slices.SortStableFunc(groups[i].events, byTime)
		}
	}
	slices.SortFunc(groups, func(a, b group) int { return bucket.CompareKeys(a.key, b.key) })
	return groups, recorded, nil
}
