package point

import (
	"slices"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/cursor"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/query"
)

// PointRead is a find served from bucket point lookups: a cursor the proxy
// holds itself. It streams window
// by window: only the buckets of the windows in flight and the events of
// the batch being built are in memory.
//
// The proxy calls Want with the batch size the client asked for, then
// sends the commands Lookups returns (pipelined, in order) and gives their
// replies, in the same order, to Feed, until Lookups returns nil; then
// Batch builds the reply.
type PointRead struct {
	Spec      *PointSpec
	Scan      *BucketScan // set: the buckets come from a scan, not keys
	Ids       *idRead     // set: from the event-id index first
	bucketNS  string
	coll, db  string
	ns        string
	metaField string
	timeField string
	span      int64 // the rule's window (ms)
	proj      *query.Projection
	skip      int64
	limited   bool
	limit     int64 // when limited: how many may still be returned
	single    bool

	keys    []pointKey // window-major, metas in the filter's order
	head    int        // the first key not yet flushed to out
	pending []pointLookup
	Out     []bsoncore.Document
	OutSize int
	want    int64 // documents the next batch wants; -1: as many as fit
	ramp    int   // lookups of the head window's last round (headLookups)
	started bool

	// BucketsRead and Lookups count the buckets fetched and the lookups
	// sent (a lookup that finds nothing ends a key), for explain and
	// metrics.
	BucketsRead, LookupsSent int
}

type pointKey struct {
	window  int64
	meta    bsoncore.Value
	seq     int // the next seq to look up
	done    bool
	buckets []bsoncore.Document
}

type pointLookup struct{ key, seq int }

// maxPipelined bounds the lookups in flight on the upstream connection.
const maxPipelined = 16

func NewPointRead(rc *query.Ctx, s *PointSpec, proj *query.Projection, skip, limit int64, single bool) *PointRead {
	p := &PointRead{
		Spec: s, bucketNS: rc.Rule.BucketNamespace(), coll: rc.Rule.BucketCollection, db: rc.Rule.DB,
		ns: rc.NS, metaField: rc.MetaField, timeField: rc.TimeField, span: rc.Rule.SpanMillis(),
		proj: proj, skip: skip, limited: limit > 0, limit: limit, single: single, want: -1,
	}
	p.keys = make([]pointKey, 0, s.Keys())
	for _, w := range s.Windows {
		for _, m := range s.Metas {
			p.keys = append(p.keys, pointKey{window: w, meta: m})
		}
	}
	return p
}

// NewScanRead is a PointRead whose buckets come from one sorted upstream
// find instead of _id lookups.
func NewScanRead(rc *query.Ctx, s *PointSpec, sc *BucketScan, proj *query.Projection, skip, limit int64, single bool) *PointRead {
	p := NewPointRead(rc, s, proj, skip, limit, single)
	p.Scan = sc
	return p
}

// NS is the app's namespace.
func (p *PointRead) NS() string { return p.ns }

// Want sets how many documents the next batch holds at most: n >= 0 (a
// find's batchSize 0 opens the cursor with an empty batch), or n < 0 for
// as many as fit in a reply (a getMore without batchSize). The first
// batch of a find without batchSize holds 101, as MongoDB's.
func (p *PointRead) Want(n int64) { p.want = n }

// exhausted: every key flushed (or the limit reached).
func (p *PointRead) Exhausted() bool {
	if p.limited && p.limit == 0 {
		return true
	}
	if p.Ids != nil {
		return p.Ids.emitted
	}
	if p.Scan != nil {
		return p.Scan.Exhausted()
	}
	return p.head >= len(p.keys)
}

// Lookups returns the next upstream finds to send, or nil when the batch
// can be built.
func (p *PointRead) Lookups() [][]byte {
	if p.Exhausted() || p.batchFull() {
		return nil
	}
	if p.Ids != nil {
		return p.idLookups()
	}
	if p.Scan != nil {
		return p.scanLookups()
	}
	p.pending = p.pending[:0]
	var cmds [][]byte
	if p.fewWanted() {
		return p.headLookups()
	}
	for i := p.head; i < len(p.keys) && len(cmds) < maxPipelined; i++ {
		k := &p.keys[i]
		if k.done {
			continue
		}
		p.pending = append(p.pending, pointLookup{key: i, seq: k.seq})
		cmds = append(cmds, p.lookupCommand(*k, k.seq))
	}
	p.LookupsSent += len(cmds)
	return cmds
}

// fewWanted: the batch being built (or what the limit leaves) wants at
// most fewEvents events, as the latest reading of a series does, which
// the first buckets of the first window usually hold: then only the
// head window is looked up (headLookups), not maxPipelined windows of
// which all but the first are read for nothing.
func (p *PointRead) fewWanted() bool {
	need := p.want
	if p.limited && (need < 0 || p.limit < need) {
		need = p.limit
	}
	return need > 0 && need <= fewEvents
}

// fewEvents bounds the events a read wants for headLookups.
const fewEvents = 1000

// headLookups looks up the next buckets of the head window's keys only:
// several seqs of each at once, a number that starts at headFirst and
// doubles each round the window is not done (a lookup past a key's last
// seq finds nothing and ends the key).
func (p *PointRead) headLookups() [][]byte {
	if p.ramp == 0 {
		p.ramp = headFirst
	} else {
		p.ramp = min(2*p.ramp, maxPipelined)
	}
	win := p.keys[p.head:min(p.head+len(p.Spec.Metas), len(p.keys))]
	open := 0
	for _, k := range win {
		if !k.done {
			open++
		}
	}
	if open == 0 {
		return nil // flush moves a done window out: not reached
	}
	var cmds [][]byte
	for i := range win {
		k := &win[i]
		if k.done {
			continue
		}
		for seq := k.seq; seq < k.seq+max(1, p.ramp/open); seq++ {
			p.pending = append(p.pending, pointLookup{key: p.head + i, seq: seq})
			cmds = append(cmds, p.lookupCommand(*k, seq))
		}
	}
	p.LookupsSent += len(cmds)
	return cmds
}

// headFirst is how many lookups the head window's first round sends: a
// window of 1-second data in buckets of 1,000 events has 4.
const headFirst = 4

func (p *PointRead) batchFull() bool {
	return p.OutSize >= query.MaxBatchBytes || (p.want > 0 && int64(len(p.Out)) >= p.want) || p.want == 0
}

// lookupCommand is the find of one bucket by _id.
func (p *PointRead) lookupCommand(k pointKey, seq int) []byte {
	return p.bucketLookup(bucket.ID(p.bucketNS, k.meta, k.window, seq))
}

// bucketLookup is the find of the bucket whose _id is id.
func (p *PointRead) bucketLookup(id bson.ObjectID) []byte {
	nb := bsoncore.NewDocumentBuilder
	return nb().AppendString("find", p.coll).
		AppendDocument("filter", nb().AppendObjectID(bucket.FieldID, id).Build()).
		AppendInt32("limit", 1).
		AppendBoolean("singleBatch", true).
		AppendString("$db", p.db).Build()
}

// Feed takes the replies to the last Lookups, in order.
func (p *PointRead) Feed(replies [][]byte) error {
	if p.Ids != nil {
		return p.idFeed(replies)
	}
	if p.Scan != nil {
		return p.scanFeed(replies)
	}
	if len(replies) != len(p.pending) {
		return mongoerr.Errorf(mongoerr.InternalError, "tsproxy rule %s: %d replies to %d bucket lookups", p.ns, len(replies), len(p.pending))
	}
	for i, r := range replies {
		l := p.pending[i]
		doc, err := p.lookupReply(r)
		if err != nil {
			return err
		}
		k := &p.keys[l.key]
		if k.done || k.seq != l.seq {
			continue
		}
		docs := batchDocs(doc)
		if len(docs) == 0 {
			// By the invariant, no higher seq exists either.
			k.done = true
			continue
		}
		p.BucketsRead++
		k.buckets = append(k.buckets, docs[0])
		k.seq++
	}
	p.pending = p.pending[:0]
	return p.flush()
}

// lookupError is an upstream's error reply as the proxy's own.
// lookupReply is the reply to a lookup, or the error it is (not BSON, or
// the upstream's failure).
func (p *PointRead) lookupReply(r []byte) (bsoncore.Document, error) {
	doc := bsoncore.Document(r)
	if err := doc.Validate(); err != nil {
		return nil, mongoerr.Errorf(mongoerr.InternalError, "tsproxy rule %s: upstream reply is not valid BSON: %v", p.ns, err)
	}
	if !mongoerr.IsOK(doc) {
		return nil, lookupError(p.ns, doc)
	}
	return doc, nil
}

func lookupError(ns string, reply bsoncore.Document) error {
	e := mongoerr.FromReply(reply, "")
	return mongoerr.Errorf(e.Code, "tsproxy rule %s: bucket lookup failed upstream: %s", ns, e.Msg)
}

// flush moves every complete leading window to out.
func (p *PointRead) flush() error {
	per := len(p.Spec.Metas)
	for p.head < len(p.keys) && !p.Exhausted() {
		win := p.keys[p.head : p.head+per]
		for _, k := range win {
			if !k.done {
				return nil
			}
		}
		var buckets []bsoncore.Document
		for _, k := range win {
			buckets = append(buckets, k.buckets...)
		}
		if err := p.emitBuckets(buckets); err != nil {
			return err
		}
		for i := range win {
			win[i].buckets = nil
		}
		p.head += per
	}
	return nil
}

// pointEvent is one matching stored event and its bucket's meta.
type pointEvent struct {
	ev   bsoncore.Document
	ms   int64
	meta bsoncore.Value
}

// emitBuckets filters, sorts, skips, limits, reshapes and projects the
// events of one window's buckets. Windows are disjoint in time, so a sort
// on time needs only the window's own events.
func (p *PointRead) emitBuckets(buckets []bsoncore.Document) error {
	if p.Spec.pred != nil || p.Spec.Order != nil {
		docs, err := p.eventsOfBuckets(buckets)
		if err != nil {
			return err
		}
		for _, doc := range docs {
			if done, err := p.take(doc); done || err != nil {
				return err
			}
		}
		return nil
	}
	evs, err := p.eventsInRange(buckets)
	if err != nil {
		return err
	}
	if p.Spec.sortDir != 0 {
		slices.SortStableFunc(evs, p.compare)
	}
	for _, e := range evs {
		if p.limited && p.limit == 0 {
			break
		}
		if p.skip > 0 {
			p.skip--
			continue
		}
		doc, err := bucket.RestoreMeta(e.ev, p.metaField, func() (bsoncore.Value, error) { return e.meta, nil })
		if err != nil {
			return err
		}
		if _, err := p.take(doc); err != nil {
			return err
		}
	}
	return nil
}

// take adds an event (meta restored) to the output, after the skip and
// within the limit; done says the limit is reached.
func (p *PointRead) take(doc bsoncore.Document) (done bool, err error) {
	if p.limited && p.limit == 0 {
		return true, nil
	}
	if p.skip > 0 {
		p.skip--
		return false, nil
	}
	if doc, err = p.proj.Apply(doc); err != nil {
		return false, err
	}
	p.Out = append(p.Out, doc)
	p.OutSize += len(doc)
	if p.limited {
		p.limit--
	}
	return false, nil
}

// eventsInRange are the events of buckets inside the spec's time bounds,
// each with its bucket's meta.
func (p *PointRead) eventsInRange(buckets []bsoncore.Document) ([]pointEvent, error) {
	var evs []pointEvent
	for _, b := range buckets {
		if !p.Spec.prune.MayMatch(b) {
			continue
		}
		meta, err := b.LookupErr(bucket.FieldMeta)
		if err != nil {
			meta = bsoncore.Value{Type: bsoncore.TypeNull}
		}
		vals, err := bucketEvents(b, p.ns)
		if err != nil {
			return nil, err
		}
		for _, v := range vals {
			ev, ok := v.DocumentOK()
			if !ok {
				continue
			}
			// A stored time that is not a date (never written by the
			// proxy) cannot match a date range, as in MongoDB.
			ms, ok := ev.Lookup(p.timeField).DateTimeOK()
			if !ok || !p.Spec.inRange(ms) {
				continue
			}
			evs = append(evs, pointEvent{ev: ev, ms: ms, meta: meta})
		}
	}
	return evs, nil
}

func (p *PointRead) compare(a, b pointEvent) int {
	c := 0
	switch {
	case a.ms < b.ms:
		c = -1
	case a.ms > b.ms:
		c = 1
	}
	if c == 0 && p.Spec.idDir != 0 {
		return p.Spec.idDir * bsonutil.Compare(a.ev.Lookup("_id"), b.ev.Lookup("_id"))
	}
	return p.Spec.sortDir * c
}

// Batch builds the reply: a find's firstBatch the first time, a getMore's
// nextBatch after, with cursor id id while documents remain (0 when
// exhausted or single-batch). more tells whether the proxy must keep the
// cursor.
func (p *PointRead) Batch(id int64) (reply []byte, more bool) {
	n, size := cursor.BatchLen(p.Out, p.want)
	batch := p.Out[:n]
	more = !p.single && (n < len(p.Out) || !p.Exhausted())
	if !more {
		id = 0
	}
	key := "nextBatch"
	if !p.started {
		key = "firstBatch"
	}
	p.started = true
	d := cursor.Reply{Key: key, Batch: batch, NS: p.ns}.WithID(id)
	p.Out = append(p.Out[:0:0], p.Out[n:]...)
	p.OutSize -= size
	return d, more
}

// explainPoint is what explain shows of a point plan: what the proxy
// sends upstream, and what it does itself.
func (p *PointRead) Explain() bsoncore.Document {
	if p.Ids != nil {
		return p.idExplain()
	}
	if p.Scan != nil {
		return p.scanExplain()
	}
	nb := bsoncore.NewDocumentBuilder
	metas := bsoncore.NewArrayBuilder()
	for _, m := range p.Spec.Metas {
		metas.AppendValue(m)
	}
	tp := nb().AppendString("stage", "TSPROXY_BUCKET_ID_LOOKUPS").
		AppendString("bucketCollection", p.bucketNS).
		AppendArray("metas", metas.Build()).
		AppendInt64("windows", int64(len(p.Spec.Windows))).
		AppendInt64("keys", int64(len(p.keys))).
		AppendString("lookup", "find {_id: BucketID(meta, window, seq)} for seq 0, 1, ... until the first missing id").
		AppendString("eventFilter", "time range, applied by the proxy").
		AppendInt32("sortTime", int32(p.Spec.sortDir)).
		AppendInt32("sortID", int32(p.Spec.idDir))
	if len(p.keys) > 0 {
		tp.AppendDocument("firstLookup", p.lookupCommand(p.keys[0], 0))
	}
	return nb().AppendDocument("queryPlanner", nb().
		AppendString("namespace", p.ns).
		AppendDocument("winningPlan", tp.Build()).Build()).
		AppendDouble("ok", 1).Build()
}

// ExplainTarget is the explain command of the first command the plan
// sends upstream (the first lookup, or the scan's find), so that explain
// can show the upstream's own plan of it; nil when nothing is sent.
func (p *PointRead) ExplainTarget() []byte {
	var cmd []byte
	switch {
	case p.Ids != nil:
		cmd = p.idFind()
	case p.Scan != nil:
		cmd = p.ScanFind()
	case len(p.keys) > 0:
		cmd = p.lookupCommand(p.keys[0], 0)
	default:
		return nil
	}
	inner := bsoncore.Document(cmd)
	idx, d := bsoncore.AppendDocumentStart(nil)
	elems, _ := inner.Elements()
	iidx, d := bsoncore.AppendDocumentElementStart(d, "explain")
	for _, e := range elems {
		if e.Key() != "$db" {
			d = append(d, e...)
		}
	}
	d, _ = bsoncore.AppendDocumentEnd(d, iidx)
	d = bsoncore.AppendStringElement(d, "verbosity", "queryPlanner")
	d = bsoncore.AppendStringElement(d, "$db", p.db)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}
