package point

import (
	"slices"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/match"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/query"
)

// A find by event _id (findOne({_id: X}) after an insert, $in of ids)
// reads the rule's event-id index (bucket.IDIndexEntry) and then only
// the buckets whose entries may hold one of the ids, by _id lookups. When
// the index does not cover every bucket (no marker) or names too many,
// the read falls back to the event scan it was built on, before anything
// is returned.

// MaxIDCandidates is how many buckets an index read looks up before the
// event scan is the cheaper read.
const MaxIDCandidates = 64

// IDIndexBatch is the batchSize of the index read: entries are about
// 2 KB for a bucket of 1000 events.
const IDIndexBatch = 4096

// idRead is the index side of a PointRead.
type idRead struct {
	coll string // the index collection
	scan *bucket.IDIndexScan
	// times, while set: the read first tries the id-time documents
	// (ObjectID ids), whose finds are in flight when timesSent.
	times     *bucket.IDTimeLookup
	timesSent bool

	// With a cache, the read first finds the marker alone: at the
	// version of the cached snapshot, the snapshot is the index. Else it
	// reads the whole index, and the cache keeps it for the next reads.
	cache    bucket.IDIndexCache
	cacheKey string
	cached   *bucket.IDIndexSnapshot // to check against the marker
	checking bool                    // the marker find was sent
	checked  bool                    // and answered

	sent   bool  // the index find was sent
	cursor int64 // its upstream cursor while open
	listed bool  // the index is read to the end

	candidates []bson.ObjectID // likely ones first
	next       int             // the first candidate not yet looked up
	buckets    []bsoncore.Document
	bytes      int
	emitted    bool
}

// EventIDs reads a top-level equality, $eq or $in on _id: the ids a
// filter names, or nil.
func EventIDs(rc *query.Ctx, filter bsoncore.Document) []bsoncore.Value {
	if len(filter) == 0 {
		return nil
	}
	conj, err := rc.Conjuncts(filter, 0, nil)
	if err != nil {
		return nil
	}
	for _, e := range conj {
		if e.Key() != "_id" {
			continue
		}
		ids, why := equalityValues(e.Value(), "_id")
		if why != "" || slices.ContainsFunc(ids, func(v bsoncore.Value) bool { return v.Type == bsoncore.TypeRegex }) {
			return nil
		}
		return ids
	}
	return nil
}

// idIndexRead is the read of a find by event _id, or nil: its event scan
// is the fallback. Only the merges of a staged rule keep the index (a
// partitioned rule's do not stage; the read of one of its partitions
// finds no marker and scans).
//
// Where the upstream's $unwind keeps the meta (MongoDB, FerretDB 2.x) a
// read of events is otherwise the upstream's own, but the upstream has
// no index on the events' ids and scans every bucket for one (FerretDB
// 2.x: 62 ms for a findOne over 240 buckets, against 1.3 ms on a plain
// collection): a staged rule's index names the few buckets to read whole
// instead. Elsewhere there is no index, and the upstream's read stays.
func IDIndexRead(rc *query.Ctx, filter, sortDoc bsoncore.Document, proj *query.Projection, pg query.Paging) *PointRead {
	if rc.Rule.Partitioned() {
		return nil
	}
	ids := EventIDs(rc, filter)
	if ids == nil {
		return nil
	}
	if rc.Caps.UnwindKeepsFields {
		if !rc.Rule.Staged(rc.Caps.StagesEvents()) {
			return nil
		}
		scanRC := *rc
		scanRC.Caps.UnwindKeepsFields = false
		rc = &scanRC
	}
	pr := EventScanRead(rc, filter, sortDoc, proj, pg)
	if pr == nil {
		return nil
	}
	r := &idRead{coll: rc.Rule.IDIndexCollection()}
	set := bucket.NewIDSet(ids)
	r.scan = bucket.NewIDIndexScan(set, rc.Span, rc.IDIndex != nil)
	r.times = bucket.NewIDTimeLookup(set)
	if rc.IDIndex != nil {
		r.cache, r.cacheKey = rc.IDIndex, rc.Rule.DB+"."+r.coll
		r.cached = r.cache.Get(r.cacheKey)
	}
	pr.Ids = r
	return pr
}

// idFind is the find of the whole index.
func (p *PointRead) idFind() []byte { return IDIndexFind(p.Ids.coll, p.db) }

// IDIndexFind is the find of a whole event-id index, coll in db, and
// IDIndexBatch its batch size.
func IDIndexFind(coll, db string) []byte {
	return bsoncore.NewDocumentBuilder().AppendString("find", coll).
		AppendInt32("batchSize", IDIndexBatch).
		AppendString("$db", db).Build()
}

// idLookups is Lookups of an index read: the index find and its
// getMores, then the candidates' lookups, pipelined.
func (p *PointRead) idLookups() [][]byte {
	r := p.Ids
	if r.times != nil {
		if finds := r.times.Finds(r.coll, p.db); len(finds) > 0 {
			r.timesSent = true
			p.LookupsSent += len(finds)
			cmds := make([][]byte, len(finds))
			for i, f := range finds {
				cmds[i] = f
			}
			return cmds
		}
	}
	switch {
	case r.cached != nil && !r.checking:
		r.checking = true
		p.LookupsSent++
		return [][]byte{bucket.IDIndexMarkerFind(r.coll, p.db)}
	case !r.listed && !r.sent:
		r.sent = true
		p.LookupsSent++
		return [][]byte{p.idFind()}
	case !r.listed:
		p.LookupsSent++
		return [][]byte{bsoncore.NewDocumentBuilder().AppendInt64("getMore", r.cursor).
			AppendString("collection", r.coll).
			AppendInt32("batchSize", IDIndexBatch).
			AppendString("$db", p.db).Build()}
	}
	// A read that may stop early (a limit, no sort: findOne) looks the
	// candidates up one at a time, likely ones first; on the stock
	// upstreams each lookup scans the bucket collection.
	inFlight := maxPipelined
	if p.limited && p.Spec.Order == nil {
		inFlight = 1
	}
	var cmds [][]byte
	for r.next < len(r.candidates) && len(cmds) < inFlight {
		cmds = append(cmds, p.bucketLookup(r.candidates[r.next]))
		r.next++
	}
	p.LookupsSent += len(cmds)
	return cmds
}

// idFeed takes the replies to the last idLookups.
func (p *PointRead) idFeed(replies [][]byte) error {
	r := p.Ids
	if r.timesSent {
		return p.idTimesFeed(replies)
	}
	for _, reply := range replies {
		doc := bsoncore.Document(reply)
		if err := doc.Validate(); err != nil {
			return mongoerr.Errorf(mongoerr.InternalError, "tsproxy rule %s: upstream reply is not valid BSON: %v", p.ns, err)
		}
		if !mongoerr.IsOK(doc) {
			r.listed = true
			return lookupError(p.ns, doc)
		}
		if r.checking && !r.checked {
			r.checked = true
			return p.idMarker(doc)
		}
		if !r.listed {
			return p.idIndexBatch(doc)
		}
		for _, b := range batchDocs(doc) {
			p.BucketsRead++
			if p.Spec.Order == nil {
				// Unsorted: each bucket's events go out as they come.
				if err := p.emitBuckets([]bsoncore.Document{b}); err != nil {
					return err
				}
				continue
			}
			r.buckets = append(r.buckets, b)
			if r.bytes += len(b); r.bytes > maxRunBytes {
				return mongoerr.Errorf(mongoerr.QueryExceededMemoryLimit, "tsproxy rule %s: the buckets a find by _id may read hold more than %d bytes", p.ns, maxRunBytes)
			}
		}
	}
	if r.next < len(r.candidates) {
		return nil
	}
	r.emitted = true
	buckets := r.buckets
	r.buckets = nil
	if len(buckets) == 0 {
		return nil
	}
	return p.emitBuckets(buckets)
}

// idTimesFeed takes what the id-time documents' finds found: the
// candidates once they are all read, or, where they cannot answer, the
// read goes on to the whole index.
func (p *PointRead) idTimesFeed(replies [][]byte) error {
	r := p.Ids
	r.timesSent = false
	found := make([]bsoncore.Document, len(replies))
	for i, reply := range replies {
		doc, err := p.lookupReply(reply)
		if err != nil {
			return err
		}
		if docs := batchDocs(doc); len(docs) > 0 {
			found[i] = docs[0]
		}
	}
	r.times.Take(found)
	scan := r.times.Scan()
	if scan == nil {
		r.times = nil // the whole index next
		return nil
	}
	if r.times.Pending() {
		return nil
	}
	r.times, r.cached = nil, nil // answered: no kept snapshot to check
	r.scan = scan
	return p.idListed()
}

// idIndexBatch takes one batch of the index.
func (p *PointRead) idIndexBatch(reply bsoncore.Document) error {
	r := p.Ids
	for _, d := range batchDocs(reply) {
		r.scan.Take(d)
	}
	r.cursor, _ = reply.Lookup("cursor", "id").AsInt64OK()
	if r.cursor != 0 {
		return nil
	}
	if kept := r.scan.Kept(); kept != nil {
		r.cache.Put(r.cacheKey, kept)
	}
	return p.idListed()
}

// idMarker takes the reply to the marker find of a read with a cached
// snapshot: no marker, the index cannot answer; the snapshot's version,
// the snapshot is the index; another, the index is read again.
func (p *PointRead) idMarker(reply bsoncore.Document) error {
	r := p.Ids
	if r.scan.CheckKept(batchDocs(reply), r.cached) {
		if !r.scan.Complete() {
			r.cache.Put(r.cacheKey, nil)
		}
		return p.idListed()
	}
	r.cached = nil // stale: the next idLookups reads the whole index
	return nil
}

// idListed: the index is read. The read looks the candidates up or, when
// the index cannot answer, becomes its event scan.
func (p *PointRead) idListed() error {
	r := p.Ids
	r.listed = true
	r.candidates = r.scan.Candidates()
	if !r.scan.Complete() || len(r.candidates) > MaxIDCandidates {
		p.Ids = nil // the event scan reads every bucket instead
		return nil
	}
	if len(r.candidates) == 0 {
		r.emitted = true
	}
	return nil
}

// idExplain is what explain shows of an index read.
func (p *PointRead) idExplain() bsoncore.Document {
	nb := bsoncore.NewDocumentBuilder
	tp := nb().AppendString("stage", "TSPROXY_EVENT_ID_INDEX").
		AppendString("bucketCollection", p.bucketNS).
		AppendString("indexCollection", p.Ids.coll).
		AppendDocument("indexFind", p.idFind()).
		AppendString("idTimeLookup", "ObjectID ids: find the marker and {_id: \"m:<minute of the id>\"} (then \"s:<second>\" of a split minute), whose Bloom filters name the buckets; else the whole index").
		AppendString("lookup", "find {_id: <bucket _id>} for each bucket whose entry's Bloom filter may hold an id").
		AppendInt64("maxBuckets", MaxIDCandidates).
		AppendString("eventFilter", p.Spec.filterExplain()).
		AppendString("fallback", "TSPROXY_BUCKET_SCAN when the index does not cover every bucket or names more buckets").
		AppendDocument("fallbackFind", p.ScanFind())
	return nb().AppendDocument("queryPlanner", nb().
		AppendString("namespace", p.ns).
		AppendDocument("winningPlan", tp.Build()).Build()).
		AppendDouble("ok", 1).Build()
}

// EventMatcher evaluates a filter on the stored events of whole buckets,
// as an event scan does (meta restored): the delete path uses it.
type EventMatcher struct {
	pred      match.DocPred
	ns        string
	metaField string
}

// NewEventMatcher compiles filter, or says why the proxy cannot
// evaluate it.
func NewEventMatcher(rc *query.Ctx, filter bsoncore.Document) (*EventMatcher, error) {
	pred, err := compileFilter(filter) // a copy: the matcher outlives the request buffer
	if err != nil {
		return nil, err
	}
	return &EventMatcher{pred: pred, ns: rc.NS, metaField: rc.MetaField}, nil
}

// Match calls f with each event of bucket b that matches, as stored (what
// $unwind returns), until f returns true.
func (m *EventMatcher) Match(b bsoncore.Document, f func(stored bsoncore.Document) (stop bool)) error {
	meta, err := b.LookupErr(bucket.FieldMeta)
	if err != nil {
		meta = bsoncore.Value{Type: bsoncore.TypeNull}
	}
	vals, err := bucketEvents(b, m.ns)
	if err != nil {
		return err
	}
	for _, v := range vals {
		ev, ok := v.DocumentOK()
		if !ok {
			continue
		}
		doc, err := bucket.RestoreMeta(ev, m.metaField, func() (bsoncore.Value, error) { return meta, nil })
		if err != nil {
			return err
		}
		if m.pred(doc) && f(ev) {
			return nil
		}
	}
	return nil
}
