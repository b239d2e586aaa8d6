package point

import (
	"fmt"
	"math"
	"strconv"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/query"
	"github.com/tsproxy/tsproxy/rules"
)

// scanBatchBuckets is the batchSize of the upstream find and getMores: a
// batch is at most this many buckets (each at most the rule's maxBytes)
// on top of the window being collected.
const scanBatchBuckets = 64

// BucketScan is the upstream side of a scan read.
type BucketScan struct {
	// Bucket start bounds of the upstream filter.
	startLo, startHi       int64
	hasStartLo, hasStartHi bool
	startHiStrict          bool
	dir                    int // the upstream sort on start: 1 or -1

	sent   bool  // the find was sent
	done   bool  // the upstream cursor is exhausted (or never needed)
	cursor int64 // the upstream cursor while it is open

	// How buckets are sorted and cut into runs: on
	// metaKeys first, then on start; a run ends where the keys change,
	// and, with byStart, where start does. oneRun: the whole scan is one.
	metaKeys eventOrder
	byStart  bool
	oneRun   bool
	// metaIn, when set, narrows the find to these metas.
	MetaIn []bsoncore.Value
	// prune, when set, narrows it by the buckets' summaries.
	prune *query.Prune

	hasWin   bool
	run      runKey              // the run being collected
	cur      []bsoncore.Document // its buckets so far
	curBytes int
}

// PlanScan returns the spec and the upstream bounds of a scan read, or
// why the find has none (then the aggregate path serves it).
func PlanScan(rc *query.Ctx, filter, sortDoc bsoncore.Document) (*PointSpec, *BucketScan, string) {
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
	s := &PointSpec{}
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
	sc := &BucketScan{dir: 1, byStart: true}
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

// oneStart is the only window start the scan's bounds admit, when they
// admit one (an exact time, or a range inside one window): an equality
// on start, which FerretDB on PostgreSQL filters in storage, where a
// range is filtered by FerretDB after decoding every bucket.
func (sc *BucketScan) oneStart(span int64) (int64, bool) {
	if !sc.hasStartLo || !sc.hasStartHi || span <= 0 {
		return 0, false
	}
	last := rules.FloorMillis(sc.startHi, span)
	if sc.startHiStrict && last == sc.startHi {
		last -= span
	}
	return sc.startLo, last == sc.startLo
}

// scanFilter is the bucket-level filter of the upstream find: the
// conditions on meta and start at its top level (where FerretDB pushes
// an equality down to its storage), and the prune's after them.
func (sc *BucketScan) scanFilter(span int64) bsoncore.Document {
	f := sc.startFilter(span)
	pf := sc.prune.BucketFilters()
	if len(pf) == 0 {
		return f
	}
	elems, _ := f.Elements()
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = bsonutil.AppendElems(d, elems)
	if len(pf) == 1 {
		d = append(d, pf[0][4:len(pf[0])-1]...) // its one $or
	} else {
		aidx, a := bsoncore.AppendArrayElementStart(d, "$and")
		for i, x := range pf {
			a = bsoncore.AppendDocumentElement(a, strconv.Itoa(i), x)
		}
		d, _ = bsoncore.AppendArrayEnd(a, aidx)
	}
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

// startFilter is scanFilter's conditions on meta and start.
func (sc *BucketScan) startFilter(span int64) bsoncore.Document {
	nb := bsoncore.NewDocumentBuilder
	f := nb()
	switch {
	case len(sc.MetaIn) == 1:
		// An equality FerretDB pushes down to its storage.
		f.AppendValue(bucket.FieldMeta, sc.MetaIn[0])
	case sc.MetaIn != nil:
		in := bsoncore.NewArrayBuilder()
		for _, m := range sc.MetaIn {
			in.AppendValue(m)
		}
		f.AppendDocument(bucket.FieldMeta, nb().AppendArray("$in", in.Build()).Build())
	}
	if !sc.hasStartLo && !sc.hasStartHi {
		return f.Build()
	}
	if start, ok := sc.oneStart(span); ok {
		return f.AppendDateTime(bucket.FieldStart, start).Build()
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
	return f.AppendDocument(bucket.FieldStart, b.Build()).Build()
}

// scanExhausted: the upstream is read to the end and the last window
// emitted.
func (sc *BucketScan) Exhausted() bool { return sc.done && !sc.hasWin }

// scanError is an upstream's error reply to the scan as the proxy's own.
func scanError(ns string, reply bsoncore.Document) error {
	e := mongoerr.FromReply(reply, "")
	return mongoerr.Errorf(e.Code, "tsproxy rule %s: bucket scan failed upstream: %s", ns, e.Msg)
}

// ScanFind is the upstream find of a scan read.
func (p *PointRead) ScanFind() []byte {
	sc := p.Scan
	nb := bsoncore.NewDocumentBuilder
	return nb().AppendString("find", p.coll).
		AppendDocument("filter", sc.scanFilter(p.span)).
		AppendDocument("sort", sc.upstreamSort()).
		AppendInt32("batchSize", scanBatchBuckets).
		AppendString("$db", p.db).Build()
}

func (p *PointRead) scanGetMore() []byte {
	return bsoncore.NewDocumentBuilder().AppendInt64("getMore", p.Scan.cursor).
		AppendString("collection", p.coll).
		AppendInt32("batchSize", scanBatchBuckets).
		AppendString("$db", p.db).Build()
}

// scanLookups is Lookups of a scan: the find, then one getMore at a time.
func (p *PointRead) scanLookups() [][]byte {
	sc := p.Scan
	if sc.done {
		return nil
	}
	if !sc.sent {
		sc.sent = true
		p.LookupsSent++
		return [][]byte{p.ScanFind()}
	}
	p.LookupsSent++
	return [][]byte{p.scanGetMore()}
}

// scanFeed takes the reply to the find or a getMore: each bucket joins
// its window, and a window is emitted once the next one starts (or the
// upstream cursor ends).
func (p *PointRead) scanFeed(replies [][]byte) error {
	sc := p.Scan
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
		k, err := sc.runKeyOf(b, p.ns)
		if err != nil {
			return err
		}
		p.BucketsRead++
		if sc.hasWin && !sc.oneRun {
			switch sc.step(k) {
			case -1:
				return mongoerr.Errorf(mongoerr.InternalError, "tsproxy rule %s: upstream returned buckets out of the order of %s", p.ns, sc.upstreamSort())
			case 1:
				if err := p.emitScanWindow(); err != nil {
					return err
				}
			}
		}
		sc.hasWin, sc.run = true, k
		sc.cur = append(sc.cur, b)
		if sc.curBytes += len(b); sc.curBytes > maxRunBytes {
			return runTooLarge(p.ns, sc)
		}
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
	sc := p.Scan
	err := p.emitBuckets(sc.cur)
	sc.cur, sc.hasWin, sc.curBytes = nil, false, 0
	return err
}

// OpenUpstreamCursor is the upstream cursor a scan read still holds open
// (0 if none): the proxy kills it when the read ends before the upstream
// cursor does (a limit, a single batch, killCursors).
func (p *PointRead) OpenUpstreamCursor() int64 {
	if p.Scan == nil || p.Scan.done {
		return 0
	}
	return p.Scan.cursor
}

// UpstreamCursorClosed records that the proxy killed the upstream cursor:
// the read is over, and the cursor is not killed twice.
func (p *PointRead) UpstreamCursorClosed() {
	if p.Scan != nil {
		p.Scan.done, p.Scan.cursor = true, 0
	}
}

// scanExplain is what explain shows of a scan read.
func (p *PointRead) scanExplain() bsoncore.Document {
	nb := bsoncore.NewDocumentBuilder
	tp := nb().AppendString("stage", "TSPROXY_BUCKET_SCAN").
		AppendString("bucketCollection", p.bucketNS).
		AppendDocument("find", p.ScanFind()).
		AppendString("eventFilter", p.Spec.filterExplain()).
		AppendString("order", p.Scan.OrderExplain())
	if p.Spec.Order == nil {
		tp.AppendInt32("sortTime", int32(p.Spec.sortDir)).AppendInt32("sortID", int32(p.Spec.idDir))
	}
	return nb().AppendDocument("queryPlanner", nb().
		AppendString("namespace", p.ns).
		AppendDocument("winningPlan", tp.Build()).Build()).
		AppendDouble("ok", 1).Build()
}
