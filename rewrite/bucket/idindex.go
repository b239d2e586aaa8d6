package bucket

import (
	"encoding/binary"
	"hash/fnv"
	"math"
	"slices"
	"strconv"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rules"
)

// The event-id index of a rule (rules.Rule.IDIndexCollection) lets a find
// by event _id read the few buckets that may hold the id instead of every
// bucket: on FerretDB a filter on "events._id" decodes every bucket, and
// only a find by a document's own _id is cheap.
//
// One entry per bucket, written before the bucket by the merge that writes
// it (rewrite/stage): {_id: "b:<bucket _id>:<hash of the rest>", b:
// bucket _id, s: window start, n: events, u: true when some event _id
// is not hashed, f: a Bloom filter of the hashed ids}. An entry's _id names its content, so
// a stale entry (its bucket was deleted, or rewritten by a delete with a
// subset of its events) never stops the entry of a new bucket with the
// same _id from being written; stale entries cost a lookup, never an
// answer.
//
// The index answers only when it covers every bucket, which the marker
// document {_id: IDIndexMarker} says: a merge writes it before the first
// bucket of an empty bucket collection, and the direct write path, whose
// buckets get no entries, deletes it before its first write (proxy).

// IDIndexMarker is the _id of the document that says the index covers
// every bucket of the collection.
const IDIndexMarker = "complete"

// Bloom filter shape: 16 bits per id and 11 probes, about 0.05% false
// positives (each costs a bucket lookup, which on the stock FerretDB
// upstreams scans the bucket collection). Fixed, so entries written by
// any proxy read the same.
const (
	idBloomBitsPerID = 16
	idBloomProbes    = 11
)

// IDIndexStartField is an entry's window start: the sweeper deletes the
// entries of the buckets it deletes by it.
const IDIndexStartField = "s"

// Entry fields.
const (
	idEntryBucket   = "b"
	idEntryStart    = "s"
	idEntryCount    = "n"
	idEntryUnhashed = "u"
	idEntryFilter   = "f"
)

// IDIndexEntry is the index entry of bucket id, of window start (ms),
// holding events (stored events, each with its _id).
func IDIndexEntry(id bson.ObjectID, start int64, events []Event) bsoncore.Document {
	bits := max(128, (len(events)*idBloomBitsPerID+7)/8*8)
	filter := make([]byte, bits/8)
	unhashed := false
	for _, e := range events {
		key, ok := idHashKey(e.Stored.Lookup("_id"))
		if !ok {
			unhashed = true
			continue
		}
		setBloom(filter, key)
	}
	h := fnv.New64a()
	h.Write(filter)
	if unhashed {
		h.Write([]byte{1})
	}
	nb := bsoncore.NewDocumentBuilder
	return nb().
		AppendString("_id", idEntryID(id, h.Sum64())).
		AppendObjectID(idEntryBucket, id).
		AppendDateTime(idEntryStart, start).
		AppendInt32(idEntryCount, int32(len(events))).
		AppendBoolean(idEntryUnhashed, unhashed).
		AppendBinary(idEntryFilter, 0, filter).
		Build()
}

// idEntryID is the _id of an entry: its bucket's _id and the hash of the
// rest, as a string, the one kind of _id besides an ObjectID that
// FerretDB v1.24 pushes down, so a stale entry is deleted by a lookup
// rather than a scan of the index (entries written before 2026-12-04
// have {b, h} there, and MayHold reads both).
func idEntryID(bucketID bson.ObjectID, hash uint64) string {
	return "b:" + bucketID.Hex() + ":" + strconv.FormatUint(hash, 16)
}

// IDIndexMarkerDoc is the marker document at version v. Each merge that
// adds entries sets a new version, so a reader that kept the index of a
// version (IDIndexSnapshot) knows it is whole while the marker shows it.
// The marker also says the series entries bound every series
// (SeriesComplete) and that the id-time documents hold every bucket's
// ObjectID _ids (IDTimesComplete): the merges that write it write those
// too.
func IDIndexMarkerDoc(v int64) bsoncore.Document {
	return bsoncore.NewDocumentBuilder().AppendString("_id", IDIndexMarker).AppendInt64(idIndexVersion, v).
		AppendBoolean(markerSeries, true).AppendBoolean(markerTimes, true).Build()
}

// idIndexVersion is the marker's version field.
const idIndexVersion = "v"

// IsIDIndexMarker says whether doc is the marker document.
func IsIDIndexMarker(doc bsoncore.Document) bool {
	s, ok := doc.Lookup("_id").StringValueOK()
	return ok && s == IDIndexMarker
}

// IDIndexVersionOf is the version of marker document doc.
func IDIndexVersionOf(doc bsoncore.Document) int64 {
	v, _ := doc.Lookup(idIndexVersion).AsInt64OK()
	return v
}

// IDIndexBumpUpdate is the update statement that sets the marker's
// version to v, if the marker is there (no upsert: a stopped index stays
// stopped).
func IDIndexBumpUpdate(v int64) bsoncore.Document {
	nb := bsoncore.NewDocumentBuilder
	return nb().
		AppendDocument("q", nb().AppendString("_id", IDIndexMarker).Build()).
		AppendDocument("u", nb().AppendDocument("$set", nb().AppendInt64(idIndexVersion, v).Build()).Build()).
		Build()
}

// IDIndexSnapshot is a whole event-id index as read at marker version V:
// its entries (copies), and their bytes.
type IDIndexSnapshot struct {
	V       int64
	Entries []bsoncore.Document
	Bytes   int
}

// IDIndexCache keeps snapshots between reads, by "db.collection" of the
// index: the proxy's, so the reads of a rule whose index did not change
// since read the marker alone.
type IDIndexCache interface {
	Get(ns string) *IDIndexSnapshot
	Put(ns string, s *IDIndexSnapshot)
}

// IDSet is the event _ids a find asks for, ready to test index entries.
type IDSet struct {
	hashed [][]byte
	// times are the ObjectIDs' times (ms): a driver gives an event the
	// _id when the app inserts it, so for live data the bucket whose
	// window holds that time is the likely one (Likely).
	times []int64
	// anyUnhashed: some id can equal only ids the filters do not hold
	// (documents, dates, null...), so entries marked u may hold it.
	anyUnhashed bool
	// always: some id may equal an id of any entry (a decimal equals
	// numbers of every type, and decimals are not hashed).
	always bool
}

// NewIDSet prepares the ids of an equality or $in on _id.
func NewIDSet(ids []bsoncore.Value) *IDSet {
	s := &IDSet{}
	for _, v := range ids {
		if oid, ok := v.ObjectIDOK(); ok {
			s.times = append(s.times, int64(binary.BigEndian.Uint32(oid[:4]))*1000)
		}
		if key, ok := idHashKey(v); ok {
			s.hashed = append(s.hashed, key)
			continue
		}
		if v.Type == bsoncore.TypeDecimal128 || v.Type == bsoncore.TypeDouble {
			s.always = true // a decimal, or a NaN double
		}
		s.anyUnhashed = true
	}
	return s
}

// MayHold says whether the bucket of index entry doc may hold one of the
// ids, and returns the bucket's _id; ok is false for a document that is
// not an entry (the marker).
func (s *IDSet) MayHold(doc bsoncore.Document) (id bson.ObjectID, may, ok bool) {
	if id, ok = entryBucket(doc); !ok {
		return id, false, false
	}
	unhashed, _ := doc.Lookup(idEntryUnhashed).BooleanOK()
	_, filter, okf := doc.Lookup(idEntryFilter).BinaryOK()
	if !okf || len(filter) == 0 || s.always || (unhashed && (s.anyUnhashed || len(s.hashed) > 0 && hasUnhashedEqual(s.hashed))) {
		// No usable filter, or an id the filter cannot rule out.
		return id, true, true
	}
	for _, k := range s.hashed {
		if testBloom(filter, k) {
			return id, true, true
		}
	}
	return id, false, true
}

// entryBucket is the _id of the bucket of entry doc: its b field, or its
// _id's in an entry written before entries had string _ids; ok is false
// for a document that is not a bucket's entry (the marker, a series
// entry).
func entryBucket(doc bsoncore.Document) (bson.ObjectID, bool) {
	if id, ok := doc.Lookup(idEntryBucket).ObjectIDOK(); ok {
		return id, true
	}
	key, err := doc.LookupErr("_id")
	if err != nil {
		return bson.ObjectID{}, false
	}
	kd, isDoc := key.DocumentOK()
	if !isDoc {
		return bson.ObjectID{}, false
	}
	return kd.Lookup(idEntryBucket).ObjectIDOK()
}

// Likely says whether index entry doc is of a bucket whose window (of
// span ms) holds the time of one of the ObjectIDs: where to look first
// when one event is enough (findOne).
func (s *IDSet) Likely(doc bsoncore.Document, span int64) bool {
	start, ok := doc.Lookup(idEntryStart).DateTimeOK()
	if !ok {
		return false
	}
	for _, t := range s.times {
		if t >= start && t < start+span {
			return true
		}
	}
	return false
}

// hasUnhashedEqual: a number may equal an unhashed decimal of the
// bucket, and a string an unhashed symbol (entries written before
// symbols were hashed as strings).
func hasUnhashedEqual(keys [][]byte) bool {
	for _, k := range keys {
		if k[0] == 'n' || k[0] == 'd' || k[0] == 's' {
			return true
		}
	}
	return false
}

// idHashKey is the key an id is hashed under, equal for ids MongoDB
// compares equal: ObjectIDs and strings (and symbols) by their bytes,
// numbers by value (int32 5, int64 5 and double 5.0 alike). Other types
// (and decimals, NaN) are not hashed.
func idHashKey(v bsoncore.Value) ([]byte, bool) {
	switch v.Type {
	case bsoncore.TypeObjectID:
		oid, ok := v.ObjectIDOK()
		return append([]byte{'o'}, oid[:]...), ok
	case bsoncore.TypeString:
		s, ok := v.StringValueOK()
		return append([]byte{'s'}, s...), ok
	case bsoncore.TypeSymbol: // MongoDB compares a symbol and a string of the same characters equal
		s, ok := v.SymbolOK()
		return append([]byte{'s'}, s...), ok
	case bsoncore.TypeInt32, bsoncore.TypeInt64:
		n, ok := v.AsInt64OK()
		return binary.BigEndian.AppendUint64([]byte{'n'}, uint64(n)), ok
	case bsoncore.TypeDouble:
		f, ok := v.DoubleOK()
		switch {
		case !ok || math.IsNaN(f):
			return nil, false
		case f == math.Trunc(f) && f >= -(1<<63) && f < 1<<63:
			return binary.BigEndian.AppendUint64([]byte{'n'}, uint64(int64(f))), true
		}
		return binary.BigEndian.AppendUint64([]byte{'d'}, math.Float64bits(f)), true
	}
	return nil, false
}

// bloomProbes calls f with the bit of each probe of key in a filter of
// nbits bits: double hashing over FNV-1a, whose low bits it first mixes
// with MurmurHash3's finalizer (FNV's multiply carries a key's last
// bytes only upward, and ids often differ only there).
func bloomProbes(nbits int, key []byte, f func(bit int) bool) bool {
	h := fnv.New64a()
	h.Write(key)
	sum := fmix64(h.Sum64())
	h1, h2 := uint32(sum), uint32(sum>>32)|1
	for i := uint32(0); i < idBloomProbes; i++ {
		if !f(int((h1 + i*h2) % uint32(nbits))) {
			return false
		}
	}
	return true
}

func fmix64(k uint64) uint64 {
	k ^= k >> 33
	k *= 0xff51afd7ed558ccd
	k ^= k >> 33
	k *= 0xc4ceb9fe1a85ec53
	k ^= k >> 33
	return k
}

func setBloom(filter, key []byte) {
	bloomProbes(len(filter)*8, key, func(bit int) bool {
		filter[bit/8] |= 1 << (bit % 8)
		return true
	})
}

func testBloom(filter, key []byte) bool {
	return bloomProbes(len(filter)*8, key, func(bit int) bool { return filter[bit/8]&(1<<(bit%8)) != 0 })
}

// IDIndexStopCommand deletes the marker of rule's event-id index.
func IDIndexStopCommand(rule *rules.Rule) bson.D {
	return idIndexDelete(rule, bson.D{{Key: "_id", Value: IDIndexMarker}})
}

// IDIndexSweepCommand deletes the entries of rule's event-id index whose
// buckets start before cutoff, and the id-time documents whose buckets
// all end before it.
func IDIndexSweepCommand(rule *rules.Rule, cutoff time.Time) bson.D {
	before := bson.D{{Key: "$lt", Value: bson.NewDateTimeFromTime(cutoff)}}
	return idIndexDelete(rule, bson.D{{Key: IDIndexStartField, Value: before}}, bson.D{{Key: IDTimeWindowEnd, Value: before}})
}

func idIndexDelete(rule *rules.Rule, qs ...bson.D) bson.D {
	deletes := bson.A{}
	for _, q := range qs {
		deletes = append(deletes, bson.D{{Key: "q", Value: q}, {Key: "limit", Value: 0}})
	}
	return bson.D{
		{Key: "delete", Value: rule.IDIndexCollection()},
		{Key: "deletes", Value: deletes},
		{Key: "$db", Value: rule.DB},
	}
}

// IDIndexScan takes the documents of an event-id index, as read or as
// kept: whether the marker is there, and the candidate buckets in the
// order to look them up (Likely ones first). Reads and deletes by event
// _id use it alike.
type IDIndexScan struct {
	set      *IDSet
	span     int64
	complete bool
	version  int64
	ids      []bson.ObjectID
	likely   int
	seen     map[bson.ObjectID]bool
	keep     *IDIndexSnapshot // the documents read, for a cache; nil: not kept
}

// maxKeptIndexBytes bounds the snapshot one scan keeps.
const maxKeptIndexBytes = 16 << 20

// NewIDIndexScan scans for set's ids in buckets of span ms; keep keeps
// what it reads as a snapshot.
func NewIDIndexScan(set *IDSet, span int64, keep bool) *IDIndexScan {
	s := &IDIndexScan{set: set, span: span, seen: map[bson.ObjectID]bool{}}
	if keep {
		s.keep = &IDIndexSnapshot{}
	}
	return s
}

// Take takes one document read from the index.
func (s *IDIndexScan) Take(doc bsoncore.Document) {
	if s.keep != nil {
		if s.keep.Bytes += len(doc); s.keep.Bytes > maxKeptIndexBytes {
			s.keep = nil // too large to keep
		} else {
			s.keep.Entries = append(s.keep.Entries, slices.Clone(doc))
		}
	}
	s.take(doc)
}

// TakeSnapshot takes a kept snapshot whole.
func (s *IDIndexScan) TakeSnapshot(snap *IDIndexSnapshot) {
	s.keep = nil
	for _, d := range snap.Entries {
		s.take(d)
	}
}

func (s *IDIndexScan) take(doc bsoncore.Document) {
	if IsIDIndexMarker(doc) {
		s.complete, s.version = true, IDIndexVersionOf(doc)
		return
	}
	id, may, ok := s.set.MayHold(doc)
	if !ok || !may || s.seen[id] {
		return
	}
	s.seen[id] = true
	s.ids = append(s.ids, id)
	if s.set.Likely(doc, s.span) {
		last := len(s.ids) - 1
		s.ids[s.likely], s.ids[last] = s.ids[last], s.ids[s.likely]
		s.likely++
	}
}

// Complete says whether the marker was seen: the index covers every
// bucket.
func (s *IDIndexScan) Complete() bool { return s.complete }

// Candidates are the buckets that may hold an id, likely ones first.
func (s *IDIndexScan) Candidates() []bson.ObjectID { return s.ids }

// Kept is the snapshot of what the scan read, or nil (not kept, too
// large, or the index cannot answer).
func (s *IDIndexScan) Kept() *IDIndexSnapshot {
	if s.keep == nil || !s.complete {
		return nil
	}
	s.keep.V = s.version
	return s.keep
}

// IDIndexMarkerFind finds the marker of the index coll in db alone.
func IDIndexMarkerFind(coll, db string) []byte { return IDIndexFind(coll, db, IDIndexMarker) }

// IDIndexFind finds the document of string _id id (the marker, a series
// entry) of the index coll in db.
func IDIndexFind(coll, db, id string) []byte {
	nb := bsoncore.NewDocumentBuilder
	return nb().AppendString("find", coll).
		AppendDocument("filter", nb().AppendString("_id", id).Build()).
		AppendInt32("limit", 1).
		AppendBoolean("singleBatch", true).
		AppendString("$db", db).Build()
}

// CheckKept takes the documents IDIndexMarkerFind found, for a kept
// snapshot: done when they settle the scan without reading the index (no
// marker: the index cannot answer, and kept is to be forgotten; the
// kept version: kept is the index); false when kept is stale.
func (s *IDIndexScan) CheckKept(marker []bsoncore.Document, kept *IDIndexSnapshot) (done bool) {
	switch {
	case len(marker) == 0 || !IsIDIndexMarker(marker[0]):
		return true
	case IDIndexVersionOf(marker[0]) == kept.V:
		s.TakeSnapshot(kept)
		return true
	}
	return false
}
