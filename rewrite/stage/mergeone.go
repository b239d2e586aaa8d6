package stage

import (
	"fmt"
	"slices"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/source"
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
	// tops are the last buckets to fill up, by Key.String() (topup.go);
	// rawTops is their record as read from a plan document.
	tops    map[string]*topUp
	rawTops bsoncore.Array
	// markers counts the marker documents the collection holds
	// (kept.go): neither staged nor late.
	markers int
	// mark is what a counter merge marks its buckets with
	// (layout.CounterMerged): made once, when the plan is, so a repeat
	// of this merge tells its own writes from any other's.
	mark string
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
func (m *Merge) moveLate(x *rewrite.Exec, r Collection, merged map[string]bool, markers int) error {
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
	all, err := drainAll(x, m.rule.DB, coll, findCommand(m.rule.DB, coll, nil, bsoncore.NewDocumentBuilder().AppendInt32("_id", 1).Build()), 0)
	if err != nil {
		return err
	}
	var late []bson.ObjectID
	for _, d := range all {
		if id, ok := idOf(d); ok && !merged[idKey(d)] {
			late = append(late, id)
		}
	}
	if len(late) == 0 {
		return nil
	}
	docs, err := drainAll(x, m.rule.DB, coll, findBatched(m.rule.DB, coll, idsIn(late), m.readBatch()), m.readBatch())
	if err != nil {
		return err
	}
	for _, d := range docs {
		_, start, err := bucket.KeyFields(d)
		if err != nil {
			return fmt.Errorf("late staged document %s: %w", d.Lookup("_id"), err)
		}
		if err := m.insertOne(x, m.rule.StageCollection(start), d); err != nil {
			return fmt.Errorf("move late staged document %s: %w", d.Lookup("_id"), err)
		}
	}
	m.Stats.Late += len(docs)
	return nil
}

// group is the events of one key, sorted by time.
type group struct {
	key    bucket.Key
	events []bucket.Event
}

// mergeOne merges retired collection r into the bucket collection and
// drops it. records are the derived ids merged before, by token.
func (m *Merge) mergeOne(x *rewrite.Exec, r Collection, records *RecordSet) error {
	docs, err := m.stagedOf(x, r)
	if err != nil {
		return err
	}
	var plan *mergePlan
	var staged []bsoncore.Document
	markers := 0
	for _, d := range docs {
		if s, ok := d.Lookup("_id").StringValueOK(); ok && s == planID {
			if plan, err = readPlan(d); err != nil {
				return err
			}
			continue
		}
		if isMarker(d) {
			markers++
			continue
		}
		staged = append(staged, d)
	}
	sortByID(staged)
	repeated := plan != nil
	if plan == nil {
		plan = &mergePlan{skip: map[bson.ObjectID]bool{}, ids: map[string]bool{}}
		var derived []bson.ObjectID
		for _, d := range staged {
			plan.ids[idKey(d)] = true
			if id, ok := idOf(d); ok && IsDerived(id) {
				derived = append(derived, id)
			}
		}
		for id := range records.mergedElsewhere(derived, r.Token) {
			plan.skip[id] = true
		}
	} else {
		// A repeated merge merges what the first run planned; documents
		// that reached the collection after that are late (see moveLate).
		staged = slices.DeleteFunc(staged, func(d bsoncore.Document) bool { return !plan.ids[idKey(d)] })
	}
	plan.markers = markers
	if m.rule.Layout != rules.LayoutEvents {
		return m.mergeLayoutOne(x, r, staged, plan, repeated, records)
	}
	groups, derived, err := m.groups(staged, plan.skip)
	if err != nil {
		return err
	}
	// The keys of the buckets this merge tops up stay locked until they
	// are written (topup.go).
	unlock := func() {}
	defer func() { unlock() }()
	if plan.bases == nil {
		if m.opts.TopUp {
			// Locked before the probe: a delete that empties and removes
			// a key's last bucket must not run between the probe and the
			// writes, which would then leave a gap in the key's seqs.
			unlock = m.lockKeys(groupKeys(groups))
		}
		var known map[string]KnownKey
		if m.opts.TopUp {
			if known, err = m.knownKeys(x, groups); err != nil {
				return err
			}
			m.planKnown = known
		}
		if plan.bases, err = m.probeBases(x, groups, known); err != nil {
			return err
		}
		if m.opts.TopUp {
			if plan.tops, err = m.readTopUps(x, groups, plan.bases, known); err != nil {
				return err
			}
		}
		if err := m.insertOne(x, r.Name, planDoc(plan)); err != nil {
			return fmt.Errorf("record plan: %w", err)
		}
	} else if len(plan.rawTops) > 0 {
		if plan.tops, err = m.readTopUpsDoc(plan.rawTops); err != nil {
			return fmt.Errorf("plan document: %w", err)
		}
		unlock = m.lockKeys(groupKeys(groups))
	}
	if err := m.recordDerived(x, r, derived, records); err != nil {
		return err
	}
	buckets, topped, events := m.buckets(groups, plan)
	if err := m.writeIDIndex(x, append(slices.Clip(buckets), topped...)); err != nil {
		return err
	}
	if err := m.insertBuckets(x, buckets); err != nil {
		return err
	}
	if err := m.rewriteTopUps(x, topped, repeated); err != nil {
		return err
	}
	if repeated || !m.opts.TopUp {
		m.last, m.planKnown = nil, nil // not under this run's key locks: the directory is not told
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

// recordDerived records the derived ids of retryable writes that the
// merge of r merges (TxnsCollection), before it writes their events.
func (m *Merge) recordDerived(x *rewrite.Exec, r Collection, derived []bson.ObjectID, records *RecordSet) error {
	if len(derived) == 0 {
		return nil
	}
	if err := m.insertOne(x, TxnsCollection(m.rule), RecordDoc(r.Token, derived, m.opts.Now)); err != nil {
		return fmt.Errorf("record merged retryable writes: %w", err)
	}
	// The retired collections after this one in the same run leave
	// these out too, and the proxy's next merges (RecordCache).
	records.Add(r.Token, m.opts.Now.UnixMilli(), derived)
	return nil
}

// finishRetired ends the merge of retired collection r by plan: late
// documents go back to staging, and r is dropped.
func (m *Merge) finishRetired(x *rewrite.Exec, r Collection, plan *mergePlan) error {
	if err := m.moveLate(x, r, plan.ids, plan.markers); err != nil {
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
// on every run); derived are the derived ids among the documents merged.
func (m *Merge) groups(staged []bsoncore.Document, skip map[bson.ObjectID]bool) ([]group, []bson.ObjectID, error) {
	var derived []bson.ObjectID
	staged = slices.DeleteFunc(slices.Clone(staged), func(d bsoncore.Document) bool {
		id, isOID := idOf(d)
		if isOID && IsDerived(id) && !skip[id] {
			derived = append(derived, id)
		}
		return isOID && skip[id]
	})
	decoded := make([][]bucket.Event, len(staged))
	errs := make([]error, len(staged))
	eachInParallel(len(staged), func(i int) {
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
	return groups, derived, nil
}

// probeSeqs is how many seqs of each key one probe asks for: on
// FerretDB a probe ($in on _id) decodes every bucket whatever it asks
// for, so it asks for many.
const probeSeqs = 64

// probeLookups is how many seqs of each key the first probe by lookups
// asks for: one, as most keys a merge writes are new (their window has
// no bucket yet), and then twice as many each round.
const probeLookups = 1

// probeBases finds the first free seq of each group's key in the bucket
// collection: the buckets of a key are seq 0..n without gaps (deletes
// leave shells), so it is the first id that is missing.
func (m *Merge) probeBases(x *rewrite.Exec, groups []group, known map[string]KnownKey) (map[string]int, error) {
	ns := m.rule.BucketNamespace()
	bases := map[string]int{}
	var pending []group
	for _, g := range groups {
		if seq, ok := m.next[g.key.String()]; ok {
			bases[g.key.String()] = seq // after a collection this merge planned
		} else if kk, ok := known[g.key.String()]; ok {
			bases[g.key.String()] = kk.Next
		} else {
			pending = append(pending, g)
		}
	}
	// A scan finds any number of seqs at one cost; lookups grow with
	// them, so they ask for a few first and twice as many each round.
	width := probeSeqs
	if m.pointLookups(len(pending) * probeLookups) {
		width = probeLookups
	}
	for from := 0; len(pending) > 0; from += width {
		if from >= bucket.MaxSeq {
			return nil, fmt.Errorf("key %x has more than %d buckets", pending[0].key.Meta, bucket.MaxSeq)
		}
		if from > 0 && width < probeSeqs {
			width *= 2
		}
		var ids []bson.ObjectID
		for _, g := range pending {
			for s := from; s < from+width; s++ {
				ids = append(ids, g.key.ID(ns, s))
			}
		}
		found, err := m.bucketsByID(x, ids, bsoncore.NewDocumentBuilder().AppendInt32("_id", 1).Build())
		if err != nil {
			return nil, err
		}
		have := map[bson.ObjectID]bool{}
		for _, d := range found {
			if id, ok := idOf(d); ok {
				have[id] = true
			}
		}
		var next []group
		for _, g := range pending {
			s := from
			for s < from+width && have[g.key.ID(ns, s)] {
				s++
			}
			if s == from+width {
				next = append(next, g)
				continue
			}
			bases[g.key.String()] = s
		}
		pending = next
	}
	return bases, nil
}

// builtBucket is one merged bucket and what identifies its content.
type builtBucket struct {
	id    bson.ObjectID
	doc   bsoncore.Document
	count int
	first bsoncore.Value    // the first event's _id
	entry bsoncore.Document // its event-id index entry
	evs   []bucket.Event    // its new events, for the rule's rollups
	// A topped-up bucket (topup.go): its count when the merge read it,
	// all its events, and the _id of its event-id index entry before.
	oldCount int
	all      []bucket.Event
	oldEntry bsoncore.Value
}

// buckets cuts each group into complete buckets: first the key's last
// bucket filled up (plan.tops), then new ones from the key's base seq.
// It notes each key's next free seq (m.next).
func (m *Merge) buckets(groups []group, plan *mergePlan) (inserts, topped []builtBucket, events int) {
	ns := m.rule.BucketNamespace()
	if m.next == nil {
		m.next = map[string]int{}
	}
	// What the directory learns (noteLast), in the order written.
	type note struct {
		key    string
		seq, i int
		topped bool
	}
	var notes []note
	var starts []int64 // each insert's window start
	for _, g := range groups {
		k := g.key.String()
		evs := g.events
		if t := plan.tops[k]; t != nil {
			all, added, rest := t.fillUp(evs, m.lim)
			if added > 0 {
				id := g.key.ID(ns, t.seq)
				topped = append(topped, builtBucket{
					id: id, doc: bucket.Complete(id, all, m.rule, m.lim), count: len(all), first: all[0].Stored.Lookup("_id"),
					entry: bucket.IDIndexEntry(id, g.key.Start, all), evs: evs[:added], oldCount: len(t.old), all: all,
					oldEntry: bucket.IDIndexEntry(id, g.key.Start, t.old).Lookup("_id"),
				})
				events += added
			}
			evs = rest
		}
		seq := plan.bases[k]
		if len(topped) > 0 && topped[len(topped)-1].id == g.key.ID(ns, seq-1) {
			notes = append(notes, note{key: k, seq: seq - 1, i: len(topped) - 1, topped: true})
		}
		for _, chunk := range bucket.ChunkEvents(evs, m.lim) {
			notes = append(notes, note{key: k, seq: seq, i: len(inserts)})
			inserts = append(inserts, builtBucket{id: g.key.ID(ns, seq), count: len(chunk), first: chunk[0].Stored.Lookup("_id"), evs: chunk})
			starts = append(starts, g.key.Start)
			seq++
			events += len(chunk)
		}
		m.next[k] = max(m.next[k], seq)
	}
	// The documents, built on the proxy's cores; then what the directory
	// learns of them, in order (a key's last bucket last).
	eachInParallel(len(inserts), func(i int) {
		b := &inserts[i]
		b.doc = bucket.Complete(b.id, b.evs, m.rule, m.lim)
		b.entry = bucket.IDIndexEntry(b.id, starts[i], b.evs)
	})
	for _, n := range notes {
		if n.topped {
			b := topped[n.i]
			m.noteLast(n.key, n.seq, b.doc, b.all)
		} else {
			m.noteLast(n.key, n.seq, inserts[n.i].doc, inserts[n.i].evs)
		}
	}
	return inserts, topped, events
}

// maxReadBytes bounds the staged bytes one reply of a retired
// collection's read may hold: FerretDB does not cut a batch at 16MiB as
// MongoDB does, and a larger reply is refused.
const maxReadBytes = 32 << 20

// countOf counts coll's documents. FerretDB decodes every document to
// count them (300–540 ms for a bucket collection of 400,000 events on
// SQLite), so it counts a retired collection, or the bucket collection
// once, before the event-id index exists.
func (m *Merge) countOf(x *rewrite.Exec, coll string) (int64, error) {
	reply, ok := x.One(countCommand(m.rule.DB, coll))
	if !ok {
		return 0, rewrite.ErrAborted
	}
	if err := mongoerr.ReplyError(reply); err != nil {
		return 0, fmt.Errorf("count %s: %w", coll, err)
	}
	n, _ := bsoncore.Document(reply).Lookup("n").AsInt64OK()
	return n, nil
}

// readRetired reads every document of a retired collection. Nothing is
// counted first: a count decodes every document on FerretDB, as the read
// does again.
func (m *Merge) readRetired(x *rewrite.Exec, coll string) ([]bsoncore.Document, error) {
	return drainAll(x, m.rule.DB, coll, findBatched(m.rule.DB, coll, nil, m.readBatch()), m.readBatch())
}

// readBatch is how many staged documents (or buckets) one reply may hold
// within maxReadBytes: each holds at most the rule's maxBytes of events
// (and summaries about as large as one event).
func (m *Merge) readBatch() int32 {
	perDoc := m.rule.MaxBytes + 64<<10
	return int32(min(max(1, maxReadBytes/perDoc), 10_000))
}
