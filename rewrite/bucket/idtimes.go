package bucket

import (
	"encoding/binary"
	"encoding/hex"
	"slices"
	"strconv"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// The id-time documents of the event-id index let a find by ObjectID
// _ids read a few small documents instead of the whole index, whose
// entries (one a bucket, about 2 KB for 1,000 events) grow with the
// rule: 22 MB at 10 million events. A driver gives an event its _id
// when the app inserts it, so the ObjectID's time is when the event
// came, not its time field, and the events that came in one minute are
// in a bounded number of buckets whatever the rule holds.
//
// One document a minute of ObjectID time, {_id: "m:<unix minute>", f:
// {b<bucket _id hex>: Bloom filter of that bucket's events whose _id is
// of the minute}, n: events counted in, w: latest window end}, updated
// ($set of the merge's buckets, $inc, $max, upserted, by {_id} alone:
// the one filter FerretDB v1.24 pushes down) by the merge before it
// writes the buckets, as the entries are. A minute that would hold more
// than IDTimeMinuteCap events (bulk ingest) is split: its document gets
// x: true, and its events from then on go to documents of their second,
// "s:<unix second>", of the same shape; a second that would hold more
// than IDTimeSecondCap gets x: true too, and finds of its ids read the
// whole index. The merge knows a document's n from what its writer-lease
// term wrote, or finds the document once (rewrite/stage/idindex).
//
// The documents answer only where the marker says so (IDTimesComplete):
// a marker written by a merge that writes them, on an empty bucket
// collection. Stale filters (a bucket deleted or rewritten smaller) cost
// a lookup that finds nothing, never an event missed; the sweeper
// deletes the documents whose every bucket it deleted (w).

const (
	idTimeMinutePrefix = "m:"
	idTimeSecondPrefix = "s:"
	idTimeFilters      = "f"
	idTimeCount        = "n"
	idTimeSplit        = "x"
	// IDTimeWindowEnd is a document's latest window end: the sweeper
	// deletes the documents whose every bucket it deleted by it.
	IDTimeWindowEnd = "w"
	// markerTimes, true in the marker: the id-time documents hold every
	// bucket's ObjectID _ids.
	markerTimes = "times"

	// IDTimeMinuteCap is how many events a minute's document takes
	// before the minute is split by second: about 40 KB of filters,
	// which every update of the document rewrites on FerretDB (333
	// events a second).
	IDTimeMinuteCap = 20_000
	// IDTimeSecondCap is how many events a second's document takes
	// before finds of its ids read the whole index: 1 MB of filters.
	IDTimeSecondCap = 500_000
	// MaxIDTimeMinutes is how many minutes a find's ObjectIDs may span
	// for the id-time documents to serve it.
	MaxIDTimeMinutes = 16
)

// IDTimesComplete says whether marker doc vouches for the id-time
// documents.
func IDTimesComplete(doc bsoncore.Document) bool {
	t, _ := doc.Lookup(markerTimes).BooleanOK()
	return t && IsIDIndexMarker(doc)
}

func idTimeDocID(second int64, bySecond bool) string {
	if bySecond {
		return idTimeSecondPrefix + strconv.FormatInt(second, 10)
	}
	return idTimeMinutePrefix + strconv.FormatInt(second/60, 10)
}

// IsIDTimeDoc says whether doc is an id-time document.
func IsIDTimeDoc(doc bsoncore.Document) bool {
	s, ok := doc.Lookup("_id").StringValueOK()
	return ok && (len(s) > 2 && (s[:2] == idTimeMinutePrefix || s[:2] == idTimeSecondPrefix))
}

func oidSecond(oid bson.ObjectID) int64 { return int64(binary.BigEndian.Uint32(oid[:4])) }

// IDTimes gathers the id-time filters of the buckets one merge writes.
type IDTimes struct {
	// By minute (or second, once split): bucket → filter keys and the
	// events newly counted in.
	docs  map[idTimeKey]*idTimeDoc
	order []idTimeKey
}

type idTimeKey struct {
	second   int64 // the minute's first second, or the second
	bySecond bool
}

type idTimeDoc struct {
	buckets map[bson.ObjectID]*idTimeBucket
	order   []bson.ObjectID
	added   int
	end     int64
}

type idTimeBucket struct{ keys [][]byte }

// Add adds bucket id, of window end (ms), whose events are all and of
// which added are new: its filter in each minute an added event's
// ObjectID is of, over all of its events of that minute (the update
// replaces the bucket's filter there). split says which minutes are
// split (by their first second): their events go by second.
func (t *IDTimes) Add(id bson.ObjectID, end int64, all, added []Event, split func(minute int64) bool) {
	if t.docs == nil {
		t.docs = map[idTimeKey]*idTimeDoc{}
	}
	keyOf := func(sec int64) idTimeKey {
		m := sec - sec%60
		if split != nil && split(m) {
			return idTimeKey{sec, true}
		}
		return idTimeKey{m, false}
	}
	touched := map[idTimeKey]int{}
	for _, e := range added {
		if oid, ok := e.Stored.Lookup("_id").ObjectIDOK(); ok {
			touched[keyOf(oidSecond(oid))]++
		}
	}
	if len(touched) == 0 {
		return
	}
	for _, e := range all {
		oid, ok := e.Stored.Lookup("_id").ObjectIDOK()
		if !ok {
			continue
		}
		k := keyOf(oidSecond(oid))
		if _, ok := touched[k]; !ok {
			continue
		}
		d := t.docs[k]
		if d == nil {
			d = &idTimeDoc{buckets: map[bson.ObjectID]*idTimeBucket{}}
			t.docs[k] = d
			t.order = append(t.order, k)
		}
		b := d.buckets[id]
		if b == nil {
			b = &idTimeBucket{}
			d.buckets[id] = b
			d.order = append(d.order, id)
		}
		key, _ := idHashKey(e.Stored.Lookup("_id"))
		b.keys = append(b.keys, key)
	}
	for k, n := range touched {
		if d := t.docs[k]; d != nil {
			d.added += n
			d.end = max(d.end, end)
		}
	}
}

// Empty says whether no bucket added has an ObjectID _id.
func (t *IDTimes) Empty() bool { return len(t.order) == 0 }

// IDTimeTarget is the document of a minute (Second its first second) or
// of a second, and how many events a merge adds to it.
type IDTimeTarget struct {
	Second   int64
	BySecond bool
	Added    int
}

// Minute is the first second of the target's minute.
func (t IDTimeTarget) Minute() int64 { return t.Second - t.Second%60 }

// ID is the target document's _id.
func (t IDTimeTarget) ID() string { return idTimeDocID(t.Second, t.BySecond) }

// Cap is how many events the target's document takes.
func (t IDTimeTarget) Cap() int64 {
	if t.BySecond {
		return IDTimeSecondCap
	}
	return IDTimeMinuteCap
}

// Targets are the documents the buckets added go to, in the order first
// added.
func (t *IDTimes) Targets() []IDTimeTarget {
	out := make([]IDTimeTarget, len(t.order))
	for i, k := range t.order {
		out[i] = IDTimeTarget{Second: k.second, BySecond: k.bySecond, Added: t.docs[k].added}
	}
	return out
}

// Updates are the update statements (upserts by _id) of the documents,
// in the order of Targets.
func (t *IDTimes) Updates() []bsoncore.Document {
	nb := bsoncore.NewDocumentBuilder
	stmts := make([]bsoncore.Document, 0, len(t.order))
	for _, k := range t.order {
		d := t.docs[k]
		set := nb()
		for _, id := range d.order {
			set.AppendBinary(idTimeFilters+".b"+id.Hex(), 0, bloomOf(d.buckets[id].keys))
		}
		stmts = append(stmts, nb().
			AppendDocument("q", nb().AppendString("_id", idTimeDocID(k.second, k.bySecond)).Build()).
			AppendDocument("u", nb().
				AppendDocument("$set", set.Build()).
				AppendDocument("$inc", nb().AppendInt64(idTimeCount, int64(d.added)).Build()).
				AppendDocument("$max", nb().AppendDateTime(IDTimeWindowEnd, d.end).Build()).
				Build()).
			AppendBoolean("upsert", true).
			Build())
	}
	return stmts
}

// IDTimeSplitUpdate is the statement that marks the target's document
// full (upserted: the document may not be there yet): a minute's events
// go by second from then on; a second's ids are found by reading the
// whole index.
func IDTimeSplitUpdate(t IDTimeTarget) bsoncore.Document {
	nb := bsoncore.NewDocumentBuilder
	return nb().
		AppendDocument("q", nb().AppendString("_id", t.ID()).Build()).
		AppendDocument("u", nb().AppendDocument("$set", nb().AppendBoolean(idTimeSplit, true).Build()).Build()).
		AppendBoolean("upsert", true).
		Build()
}

// IDTimeState reads an id-time document as found: the events counted
// in, and whether it is marked full.
func IDTimeState(doc bsoncore.Document) (n int64, full bool) {
	n, _ = doc.Lookup(idTimeCount).AsInt64OK()
	full, _ = doc.Lookup(idTimeSplit).BooleanOK()
	return n, full
}

// bloomOf is the filter of keys, shaped as an entry's.
func bloomOf(keys [][]byte) []byte {
	filter := make([]byte, max(128, (len(keys)*idBloomBitsPerID+7)/8*8)/8)
	for _, k := range keys {
		setBloom(filter, k)
	}
	return filter
}

// IDTimeLookup finds the buckets that may hold some ObjectID _ids by
// the id-time documents: Finds, then Take of what each found, until
// Finds is empty; then Candidates.
type IDTimeLookup struct {
	keys     map[int64][][]byte // by second
	minutes  []int64
	seconds  []int64 // of split minutes, to find next
	sent     []string
	marker   bool
	answered bool
	cannot   bool
	ids      []bson.ObjectID
	seen     map[bson.ObjectID]bool
}

// NewIDTimeLookup is the lookup of set's ids, or nil when they are not
// all ObjectIDs or span more than MaxIDTimeMinutes minutes.
func NewIDTimeLookup(set *IDSet) *IDTimeLookup {
	if set.anyUnhashed || set.always || len(set.hashed) == 0 {
		return nil
	}
	l := &IDTimeLookup{keys: map[int64][][]byte{}, seen: map[bson.ObjectID]bool{}}
	for _, key := range set.hashed {
		if key[0] != 'o' || len(key) != 13 {
			return nil
		}
		sec := oidSecond(bson.ObjectID(key[1:]))
		l.keys[sec] = append(l.keys[sec], key)
		if m := sec - sec%60; !slices.Contains(l.minutes, m) {
			l.minutes = append(l.minutes, m)
		}
	}
	if len(l.minutes) > MaxIDTimeMinutes {
		return nil
	}
	return l
}

// Finds are the finds to send next, in coll of db (nil: done): the
// marker and the minutes' documents, then the seconds' of split ones.
func (l *IDTimeLookup) Finds(coll, db string) []bsoncore.Document {
	if l.cannot {
		return nil
	}
	var ids []string
	switch {
	case !l.answered:
		ids = append(ids, IDIndexMarker)
		for _, m := range l.minutes {
			ids = append(ids, idTimeDocID(m, false))
		}
		l.answered = true
	case len(l.seconds) > 0:
		for _, s := range l.seconds {
			ids = append(ids, idTimeDocID(s, true))
		}
		l.seconds = nil
	}
	l.sent = ids
	cmds := make([]bsoncore.Document, len(ids))
	for i, id := range ids {
		cmds[i] = IDIndexFind(coll, db, id)
	}
	return cmds
}

// Take takes what the last Finds found: the document of each, nil where
// none.
func (l *IDTimeLookup) Take(found []bsoncore.Document) {
	for i, doc := range found {
		if i >= len(l.sent) {
			break
		}
		id := l.sent[i]
		if id == IDIndexMarker {
			l.marker = doc != nil && IDTimesComplete(doc)
			if !l.marker {
				l.cannot = true
				return
			}
			continue
		}
		if doc == nil {
			continue // nothing came in that minute or second
		}
		l.takeDoc(id, doc)
	}
	l.sent = nil
}

func (l *IDTimeLookup) takeDoc(id string, doc bsoncore.Document) {
	n, _ := strconv.ParseInt(id[2:], 10, 64)
	bySecond := id[:2] == idTimeSecondPrefix
	var keys [][]byte
	if bySecond {
		keys = l.keys[n]
	} else {
		for s := n * 60; s < n*60+60; s++ {
			keys = append(keys, l.keys[s]...)
		}
	}
	if split, _ := doc.Lookup(idTimeSplit).BooleanOK(); split {
		if bySecond {
			l.cannot = true // too full to hold the second's ids
			return
		}
		for s := n * 60; s < n*60+60; s++ {
			if len(l.keys[s]) > 0 {
				l.seconds = append(l.seconds, s)
			}
		}
	}
	filters, ok := doc.Lookup(idTimeFilters).DocumentOK()
	if !ok {
		return
	}
	elems, _ := filters.Elements()
	for _, e := range elems {
		key := e.Key()
		raw, err := hex.DecodeString(key[min(1, len(key)):])
		_, f, okf := e.Value().BinaryOK()
		if err != nil || len(raw) != 12 || !okf || len(f) == 0 {
			continue
		}
		bid := bson.ObjectID(raw)
		if l.seen[bid] {
			continue
		}
		for _, k := range keys {
			if testBloom(f, k) {
				l.seen[bid] = true
				l.ids = append(l.ids, bid)
				break
			}
		}
	}
}

// Pending says whether Finds has more to find.
func (l *IDTimeLookup) Pending() bool { return !l.cannot && (!l.answered || len(l.seconds) > 0) }

// Scan is what the lookup found as an index scan's answer, or nil when
// it cannot answer.
func (l *IDTimeLookup) Scan() *IDIndexScan {
	ids, ok := l.Candidates()
	if !ok {
		return nil
	}
	return &IDIndexScan{complete: true, ids: ids, seen: l.seen}
}

// Candidates are the buckets that may hold an id; ok is false when the
// documents cannot answer (no marker that vouches for them, a second
// too full), and the whole index is to be read instead.
func (l *IDTimeLookup) Candidates() (ids []bson.ObjectID, ok bool) {
	return l.ids, !l.cannot && l.marker
}
