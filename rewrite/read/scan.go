package read

import (
	"fmt"
	"math"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/query"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

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

	// How buckets are sorted and cut into runs (event_scan.go): on
	// metaKeys first, then on start; a run ends where the keys change,
	// and, with byStart, where start does. oneRun: the whole scan is one.
	metaKeys eventOrder
	byStart  bool
	oneRun   bool
	// metaIn, when set, narrows the find to these metas.
	metaIn []bsoncore.Value

	hasWin   bool
	run      runKey              // the run being collected
	cur      []bsoncore.Document // its buckets so far
	curBytes int
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
	sc := &bucketScan{dir: 1, byStart: true}
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
	f := nb()
	switch {
	case len(sc.metaIn) == 1:
		// An equality FerretDB pushes down to its storage.
		f.AppendValue(bucket.FieldMeta, sc.metaIn[0])
	case sc.metaIn != nil:
		in := bsoncore.NewArrayBuilder()
		for _, m := range sc.metaIn {
			in.AppendValue(m)
		}
		f.AppendDocument(bucket.FieldMeta, nb().AppendArray("$in", in.Build()).Build())
	}
	if !sc.hasStartLo && !sc.hasStartHi {
		return f.Build()
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
func (sc *bucketScan) exhausted() bool { return sc.done && !sc.hasWin }

// scanError is an upstream's error reply to the scan as the proxy's own.
func scanError(ns string, reply bsoncore.Document) error {
	e := mongoerr.FromReply(reply, "")
	return mongoerr.Errorf(e.Code, "tsproxy rule %s: bucket scan failed upstream: %s", ns, e.Msg)
}
