package rewrite

import (
	"fmt"
	"math"

	"github.com/tsproxy/tsproxy/rewrite/query"

	"github.com/tsproxy/tsproxy/rewrite/bucket"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// A scan read answers a find whose filter is only a time range (bounded
// on one side at least) over every series, sorted by nothing or by time
// (then _id). The aggregate path costs FerretDB v1.24 two decodings of
// every bucket (the meta prefetch, as its $unwind drops the meta, then the
// aggregate); the scan is one find on the bucket collection,
//
//	{start: {$gte: floor(lo), $lt|$lte: hi}} sorted by {start: ±1},
//
// read with getMores, whose buckets the proxy unwinds itself. A bucket
// holds the events of [start, start+span) only, so the start bounds select
// every bucket that can hold a matching event; the proxy then keeps the
// events whose time is in range, which is exact because the insert path
// stores a BSON date in every event's timeField. Buckets of different
// windows are disjoint in time and come in window order, so the proxy
// holds one window's buckets at a time and sorts that window's events (the
// point read's machinery: PointRead with a scan source).
//
// Meta conditions are not taken (the aggregate path keeps them): the win
// is for all-series scans, and a meta condition the point path cannot name
// would need MongoDB's full equality semantics on the proxy.

// scanBatchBuckets is the batchSize of the upstream find and getMores: a
// batch is at most this many buckets (each at most the rule's maxBytes)
// on top of the window being collected.
const scanBatchBuckets = 64

// bucketScan is the upstream side of a scan read.
type bucketScan struct {
	// Bucket start bounds of the upstream filter.
	startLo, startHi       int64
	hasStartLo, hasStartHi bool
	startHiStrict          bool
	dir                    int // the upstream sort on start: 1 or -1

	sent   bool  // the find was sent
	done   bool  // the upstream cursor is exhausted (or never needed)
	cursor int64 // the upstream cursor while it is open

	hasWin bool
	win    int64               // the start of the window being collected
	cur    []bsoncore.Document // its buckets so far
}

// planScan returns the spec and the upstream bounds of a scan read, or
// why the find has none (then the aggregate path serves it).
func planScan(rc *query.Ctx, filter, sortDoc bsoncore.Document) (*pointSpec, *bucketScan, string) {
	if rc.Caps.UnwindKeepsFields {
		// The aggregate reads each bucket once there, with the upstream's
		// own indexes and sort.
		return nil, nil, "the upstream's $unwind keeps the meta"
	}
	if len(filter) == 0 {
		return nil, nil, "no filter"
	}
	conj, err := rc.Conjuncts(filter, 0, nil)
	if err != nil {
		return nil, nil, err.Error()
	}
	s := &pointSpec{}
	var hasLo, hasHi bool
	for _, e := range conj {
		if e.Key() != rc.TimeField {
			return nil, nil, fmt.Sprintf("a condition on %q", e.Key())
		}
		if why := s.addTimeBounds(e.Value(), &hasLo, &hasHi); why != "" {
			return nil, nil, why
		}
	}
	if !hasLo && !hasHi {
		return nil, nil, "the time range is not bounded"
	}
	if why := s.setSort(sortDoc, rc.TimeField); why != "" {
		return nil, nil, why
	}
	sc := &bucketScan{dir: 1}
	if s.sortDir < 0 {
		sc.dir = -1
	}
	if hasLo {
		if f, ok := rc.Floor(s.lo); ok {
			sc.startLo, sc.hasStartLo = f, true
		}
	} else {
		s.lo = math.MinInt64
	}
	if hasHi {
		sc.startHi, sc.hasStartHi, sc.startHiStrict = s.hi, true, s.hiStrict
	} else {
		s.hi = math.MaxInt64
	}
	if s.lo > s.hi || (s.lo == s.hi && (s.loStrict || s.hiStrict)) {
		sc.done = true // an empty range: nothing to read
	}
	return s, sc, ""
}

// scanFilter is the bucket-level filter of the upstream find.
func (sc *bucketScan) scanFilter() bsoncore.Document {
	nb := bsoncore.NewDocumentBuilder
	if !sc.hasStartLo && !sc.hasStartHi {
		return nb().Build()
	}
	b := nb()
	if sc.hasStartLo {
		b.AppendDateTime("$gte", sc.startLo)
	}
	if sc.hasStartHi {
		op := "$lte"
		if sc.startHiStrict {
			op = "$lt"
		}
		b.AppendDateTime(op, sc.startHi)
	}
	return nb().AppendDocument(bucket.FieldStart, b.Build()).Build()
}

// scanFind is the upstream find of a scan read.
func (p *PointRead) scanFind() []byte {
	sc := p.scan
	nb := bsoncore.NewDocumentBuilder
	return nb().AppendString("find", p.coll).
		AppendDocument("filter", sc.scanFilter()).
		AppendDocument("sort", nb().AppendInt32(bucket.FieldStart, int32(sc.dir)).Build()).
		AppendInt32("batchSize", scanBatchBuckets).
		AppendString("$db", p.db).Build()
}

func (p *PointRead) scanGetMore() []byte {
	return bsoncore.NewDocumentBuilder().AppendInt64("getMore", p.scan.cursor).
		AppendString("collection", p.coll).
		AppendInt32("batchSize", scanBatchBuckets).
		AppendString("$db", p.db).Build()
}

// scanLookups is Lookups of a scan: the find, then one getMore at a time.
func (p *PointRead) scanLookups() [][]byte {
	sc := p.scan
	if sc.done {
		return nil
	}
	if !sc.sent {
		sc.sent = true
		p.LookupsSent++
		return [][]byte{p.scanFind()}
	}
	p.LookupsSent++
	return [][]byte{p.scanGetMore()}
}

// scanFeed takes the reply to the find or a getMore: each bucket joins
// its window, and a window is emitted once the next one starts (or the
// upstream cursor ends).
func (p *PointRead) scanFeed(replies [][]byte) error {
	sc := p.scan
	if len(replies) != 1 {
		return mongoerr.Errorf(mongoerr.InternalError, "tsproxy rule %s: %d replies to one bucket scan command", p.ns, len(replies))
	}
	doc := bsoncore.Document(replies[0])
	if err := doc.Validate(); err != nil {
		return mongoerr.Errorf(mongoerr.InternalError, "tsproxy rule %s: upstream reply is not valid BSON: %v", p.ns, err)
	}
	if !mongoerr.IsOK(doc) {
		sc.done, sc.cursor = true, 0
		return scanError(p.ns, doc)
	}
	id, ok := doc.Lookup("cursor", "id").AsInt64OK()
	if !ok {
		sc.done, sc.cursor = true, 0
		return mongoerr.Errorf(mongoerr.InternalError, "tsproxy rule %s: upstream bucket scan reply has no cursor id", p.ns)
	}
	sc.cursor = id
	for _, b := range batchDocs(doc) {
		start, ok := b.Lookup(bucket.FieldStart).DateTimeOK()
		if !ok {
			return mongoerr.Errorf(mongoerr.InternalError, "tsproxy rule %s: bucket %s has no date start", p.ns, b.Lookup(bucket.FieldID).String())
		}
		p.BucketsRead++
		if sc.hasWin && start != sc.win {
			if (start-sc.win > 0) != (sc.dir > 0) {
				return mongoerr.Errorf(mongoerr.InternalError, "tsproxy rule %s: upstream returned buckets out of start order", p.ns)
			}
			if err := p.emitScanWindow(); err != nil {
				return err
			}
		}
		sc.hasWin, sc.win = true, start
		sc.cur = append(sc.cur, b)
	}
	if id == 0 {
		sc.done = true
		if sc.hasWin {
			return p.emitScanWindow()
		}
	}
	return nil
}

func (p *PointRead) emitScanWindow() error {
	sc := p.scan
	err := p.emitBuckets(sc.cur)
	sc.cur, sc.hasWin = nil, false
	return err
}

// scanExhausted: the upstream is read to the end and the last window
// emitted.
func (sc *bucketScan) exhausted() bool { return sc.done && !sc.hasWin }

// OpenUpstreamCursor is the upstream cursor a scan read still holds open
// (0 if none): the proxy kills it when the read ends before the upstream
// cursor does (a limit, a single batch, killCursors).
func (p *PointRead) OpenUpstreamCursor() int64 {
	if p.scan == nil || p.scan.done {
		return 0
	}
	return p.scan.cursor
}

// UpstreamCursorClosed records that the proxy killed the upstream cursor:
// the read is over, and the cursor is not killed twice.
func (p *PointRead) UpstreamCursorClosed() {
	if p.scan != nil {
		p.scan.done, p.scan.cursor = true, 0
	}
}

// scanError is an upstream's error reply to the scan as the proxy's own.
func scanError(ns string, reply bsoncore.Document) error {
	e := mongoerr.FromReply(reply, "")
	return mongoerr.Errorf(e.Code, "tsproxy rule %s: bucket scan failed upstream: %s", ns, e.Msg)
}

// scanExplain is what explain shows of a scan read.
func (p *PointRead) scanExplain() bsoncore.Document {
	nb := bsoncore.NewDocumentBuilder
	tp := nb().AppendString("stage", "TSPROXY_BUCKET_SCAN").
		AppendString("bucketCollection", p.bucketNS).
		AppendDocument("find", p.scanFind()).
		AppendString("eventFilter", "time range, applied by the proxy").
		AppendString("order", "buckets by start, each window's events sorted by the proxy").
		AppendInt32("sortTime", int32(p.spec.sortDir)).
		AppendInt32("sortID", int32(p.spec.idDir))
	return nb().AppendDocument("queryPlanner", nb().
		AppendString("namespace", p.ns).
		AppendDocument("winningPlan", tp.Build()).Build()).
		AppendDouble("ok", 1).Build()
}
