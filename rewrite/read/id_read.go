package read

import (
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/query"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// A find by event _id (findOne({_id: X}) after an insert, $in of ids)
// reads the rule's event-id index (bucket.IDIndexEntry) and then only
// the buckets whose entries may hold one of the ids, by _id lookups. When
// the index does not cover every bucket (no marker) or names too many,
// the read falls back to the event scan it was built on, before anything
// is returned.

// maxIDCandidates is how many buckets an index read looks up before the
// event scan is the cheaper read.
const maxIDCandidates = 64

// idIndexBatch is the batchSize of the index read: entries are about
// 1.3 KB for a bucket of 1000 events.
const idIndexBatch = 4096

// idRead is the index side of a PointRead.
type idRead struct {
	set  *bucket.IDSet
	coll string // the index collection

	sent     bool  // the index find was sent
	cursor   int64 // its upstream cursor while open
	listed   bool  // the index is read to the end
	complete bool  // its marker was seen

	seen       map[bson.ObjectID]bool
	candidates []bson.ObjectID
	next       int // the first candidate not yet looked up
	inFlight   int
	buckets    []bsoncore.Document
	bytes      int
	emitted    bool
}

// eventIDs reads a top-level equality, $eq or $in on _id: the ids a find
// names, or nil.
func eventIDs(rc *query.Ctx, filter bsoncore.Document) []bsoncore.Value {
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
		v := e.Value()
		ops, isOp := query.IsOperatorDoc(v)
		if !isOp {
			if v.Type == bsoncore.TypeRegex {
				return nil
			}
			return []bsoncore.Value{v}
		}
		elems, _ := ops.Elements()
		if len(elems) != 1 {
			return nil
		}
		switch elems[0].Key() {
		case "$eq":
			return []bsoncore.Value{elems[0].Value()}
		case "$in":
			arr, ok := elems[0].Value().ArrayOK()
			if !ok {
				return nil
			}
			vals, _ := arr.Values()
			for _, x := range vals {
				if x.Type == bsoncore.TypeRegex {
					return nil
				}
			}
			return vals
		}
		return nil
	}
	return nil
}

// idIndexRead is the read of a find by event _id, or nil: its event scan
// is the fallback. Only the merges of a staged rule keep the index (a
// partitioned rule's do not stage; the read of one of its partitions
// finds no marker and scans).
func idIndexRead(rc *query.Ctx, filter, sortDoc bsoncore.Document, proj *query.Projection, pg query.Paging) *PointRead {
	if rc.Rule.Partitioned() {
		return nil
	}
	ids := eventIDs(rc, filter)
	if ids == nil {
		return nil
	}
	pr := eventScanRead(rc, filter, sortDoc, proj, pg)
	if pr == nil {
		return nil
	}
	pr.ids = &idRead{set: bucket.NewIDSet(ids), coll: rc.Rule.IDIndexCollection(), seen: map[bson.ObjectID]bool{}}
	return pr
}

// idFind is the find of the whole index.
func (p *PointRead) idFind() []byte {
	return bsoncore.NewDocumentBuilder().AppendString("find", p.ids.coll).
		AppendInt32("batchSize", idIndexBatch).
		AppendString("$db", p.db).Build()
}

// idLookups is Lookups of an index read: the index find and its
// getMores, then the candidates' lookups, pipelined.
func (p *PointRead) idLookups() [][]byte {
	r := p.ids
	switch {
	case !r.sent:
		r.sent = true
		p.LookupsSent++
		return [][]byte{p.idFind()}
	case !r.listed:
		p.LookupsSent++
		return [][]byte{bsoncore.NewDocumentBuilder().AppendInt64("getMore", r.cursor).
			AppendString("collection", r.coll).
			AppendInt32("batchSize", idIndexBatch).
			AppendString("$db", p.db).Build()}
	}
	var cmds [][]byte
	for r.next < len(r.candidates) && len(cmds) < maxPipelined {
		nb := bsoncore.NewDocumentBuilder
		cmds = append(cmds, nb().AppendString("find", p.coll).
			AppendDocument("filter", nb().AppendObjectID(bucket.FieldID, r.candidates[r.next]).Build()).
			AppendInt32("limit", 1).
			AppendBoolean("singleBatch", true).
			AppendString("$db", p.db).Build())
		r.next++
	}
	r.inFlight = len(cmds)
	p.LookupsSent += len(cmds)
	return cmds
}

// idFeed takes the replies to the last idLookups.
func (p *PointRead) idFeed(replies [][]byte) error {
	r := p.ids
	for _, reply := range replies {
		doc := bsoncore.Document(reply)
		if err := doc.Validate(); err != nil {
			return mongoerr.Errorf(mongoerr.InternalError, "tsproxy rule %s: upstream reply is not valid BSON: %v", p.ns, err)
		}
		if !mongoerr.IsOK(doc) {
			r.listed = true
			return lookupError(p.ns, doc)
		}
		if !r.listed {
			return p.idIndexBatch(doc)
		}
		for _, b := range batchDocs(doc) {
			p.BucketsRead++
			r.buckets = append(r.buckets, b)
			if r.bytes += len(b); r.bytes > maxRunBytes {
				return mongoerr.Errorf(mongoerr.QueryExceededMemoryLimit, "tsproxy rule %s: the buckets a find by _id may read hold more than %d bytes", p.ns, maxRunBytes)
			}
		}
	}
	r.inFlight = 0
	if r.next < len(r.candidates) {
		return nil
	}
	r.emitted = true
	buckets := r.buckets
	r.buckets = nil
	return p.emitBuckets(buckets)
}

// idIndexBatch takes one batch of the index: the marker and the entries
// that may hold an id. Once the index is read, the read either looks the
// candidates up or, when the index cannot answer, becomes its event scan.
func (p *PointRead) idIndexBatch(reply bsoncore.Document) error {
	r := p.ids
	for _, d := range batchDocs(reply) {
		if bucket.IsIDIndexMarker(d) {
			r.complete = true
			continue
		}
		id, may, ok := r.set.MayHold(d)
		if ok && may && !r.seen[id] {
			r.seen[id] = true
			r.candidates = append(r.candidates, id)
		}
	}
	r.cursor, _ = reply.Lookup("cursor", "id").AsInt64OK()
	if r.cursor != 0 {
		return nil
	}
	r.listed = true
	if !r.complete || len(r.candidates) > maxIDCandidates {
		p.ids = nil // the event scan reads every bucket instead
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
		AppendString("indexCollection", p.ids.coll).
		AppendDocument("indexFind", p.idFind()).
		AppendString("lookup", "find {_id: <bucket _id>} for each bucket whose entry's Bloom filter may hold an id").
		AppendInt64("maxBuckets", maxIDCandidates).
		AppendString("eventFilter", p.spec.filterExplain()).
		AppendString("fallback", "TSPROXY_BUCKET_SCAN when the index does not cover every bucket or names more buckets").
		AppendDocument("fallbackFind", p.scanFind())
	return nb().AppendDocument("queryPlanner", nb().
		AppendString("namespace", p.ns).
		AppendDocument("winningPlan", tp.Build()).Build()).
		AppendDouble("ok", 1).Build()
}
