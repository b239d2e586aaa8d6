package deletes

import (
	"slices"
	"strconv"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/insert"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/query"
	"github.com/tsproxy/tsproxy/rewrite/read/point"
	"github.com/tsproxy/tsproxy/rules"
)

// DeleteOptions are what PlanDelete needs besides the command.
type Options struct {
	Caps caps.Upstream
}

// DeletePlan is a parsed delete command on a bucketed namespace.
type Request struct {
	rule    *rules.Rule
	lim     bucket.Limits
	ordered bool
	args    []bsoncore.Element // generic arguments carried to upstream writes
	reads   []bsoncore.Element // generic arguments carried to upstream reads
	more    []bsoncore.Element // ... and to their getMores
	wce     bsoncore.Value     // the last upstream writeConcernError
	// Statements in the app's order.
	Statements []*Statement
}

// DeleteStatement is one entry of the delete's "deletes".
type Statement struct {
	Index int
	// LimitOne: deleteOne (limit: 1) removes at most one matching event.
	LimitOne bool
	// Err is why the statement cannot run; it is reported as the
	// statement's write error without reaching the upstream.
	Err error
	// Whole: the filter holds for whole buckets (only metaField
	// conditions), so every event of a candidate bucket matches.
	Whole bool
	// Match is the upstream command that lists the candidates: an
	// aggregate whose documents are {_id: bucket id, events: event} for
	// each matching event or, when Whole, {_id, meta, start} per bucket.
	Match []byte
	// IDs and Events are set for a filter that names event _ids, on an
	// upstream whose aggregate decodes every bucket (FerretDB): the
	// candidates then come from the event-id index where it answers, Match
	// where it does not.
	IDs    *bucket.IDSet
	Events *point.EventMatcher
	// Scan: Match lists whole buckets, whose events Events matches
	// (an upstream that cannot see events, caps.Upstream.PackedEvents).
	Scan bool
}

// writeCarried, readCarriedDelete and getMoreCarried are the generic
// arguments a rewritten delete carries. txnNumber is not: the rewrite
// runs several upstream writes, which one txnNumber would make retries of
// each other. A getMore does not carry maxTimeMS: the server refuses it
// on a cursor that is not awaitData (the aggregate that opened the
// cursor carries it).
var (
	writeCarried      = []string{"lsid", "writeConcern", "comment", "maxTimeMS", "$clusterTime", "apiVersion", "apiStrict", "apiDeprecationErrors"}
	readCarriedDelete = []string{"lsid", "comment", "maxTimeMS", "$clusterTime", "apiVersion", "apiStrict", "apiDeprecationErrors"}
	getMoreCarried    = []string{"lsid", "comment", "$clusterTime", "apiVersion", "apiStrict", "apiDeprecationErrors"}
)

// deleteMatchBatch is the batch size of the match aggregate;
// scanMatchBatch of a scan's, whose documents are whole buckets.
const (
	deleteMatchBatch = 10_000
	scanMatchBatch   = 16
)

// PlanDelete parses a delete command (statements in the body or in a
// "deletes" document sequence).
func NewRequest(cmd rewrite.Command, rule *rules.Rule, opts Options) (*Request, error) {
	lim, err := bucket.LimitsOf(rule)
	if err != nil {
		return nil, err
	}
	lim.Packed = opts.Caps.PackedEvents
	if err := query.CheckTarget(cmd.Body, rule, "delete"); err != nil {
		return nil, err
	}
	if rewrite.InTransaction(cmd.Body) {
		return nil, query.RuleErrorf(rule, mongoerr.NotImplemented, "delete inside a transaction is not supported on a bucketed namespace")
	}
	if err := checkLet(cmd.Body); err != nil {
		return nil, err
	}
	ordered, err := bsonutil.Bool(cmd.Body, "ordered", true)
	if err != nil {
		return nil, err
	}
	docs, err := rewrite.CommandDocuments(cmd, "deletes")
	if err != nil {
		return nil, err
	}
	p := &Request{
		rule: rule, lim: lim, ordered: ordered,
		args:  bsonutil.Pick(cmd.Body, writeCarried),
		reads: bsonutil.Pick(cmd.Body, readCarriedDelete),
		more:  bsonutil.Pick(cmd.Body, getMoreCarried),
	}
	for i, d := range docs {
		st, err := p.planStatement(i, d, opts.Caps)
		if err != nil {
			return nil, err
		}
		p.Statements = append(p.Statements, st)
	}
	return p, nil
}

// Ordered: the first failed statement stops the command.
func (p *Request) Ordered() bool { return p.ordered }

// Rule is the plan's rule.
func (p *Request) Rule() *rules.Rule { return p.rule }

// planStatement parses one delete statement. A malformed statement fails
// the command (as the server's parser does); a filter the rewrite cannot
// run is the statement's write error.
func (p *Request) planStatement(i int, d bsoncore.Document, caps caps.Upstream) (*Statement, error) {
	st := &Statement{Index: i}
	q, ok := bsonutil.Lookup(d, "q")
	if !ok {
		return nil, mongoerr.Errorf(mongoerr.FailedToParse, "delete statement %d: missing field \"q\"", i)
	}
	filter, ok := q.DocumentOK()
	if !ok {
		return nil, mongoerr.Errorf(mongoerr.TypeMismatch, "delete statement %d: \"q\" must be a document, got %s", i, bsonutil.TypeName(q.Type))
	}
	lv, ok := bsonutil.Lookup(d, "limit")
	if !ok {
		return nil, mongoerr.Errorf(mongoerr.FailedToParse, "delete statement %d: missing field \"limit\"", i)
	}
	limit, ok := lv.AsFloat64OK()
	if !ok || (limit != 0 && limit != 1) {
		return nil, mongoerr.Errorf(mongoerr.FailedToParse, "delete statement %d: \"limit\" must be 0 (all) or 1 (one), got %s", i, lv.String())
	}
	st.LimitOne = limit == 1
	simple, err := p.checkStatementFields(i, d)
	if err != nil {
		return nil, err
	}
	if err := jsonSchemaError(filter); err != nil {
		st.Err = err
		return st, nil
	}
	if v, ok := bsonutil.Lookup(d, "hint"); ok {
		if st.Err = query.CheckHint(p.rule, v); st.Err != nil {
			return st, nil
		}
	}
	if !simple {
		if st.Err = collationRefusal(p.rule, filter); st.Err != nil {
			return st, nil
		}
	}
	rc, err := query.NewCtx(p.rule)
	if err != nil {
		return nil, err
	}
	rc.Caps = caps
	if caps.PackedEvents {
		return p.planScanStatement(st, rc, filter)
	}
	sf, err := rc.Split(filter)
	if err != nil {
		st.Err = err
		return st, nil
	}
	st.Whole = sf.Event == nil
	st.Match = p.matchCommand(sf, st.Whole, st.LimitOne, caps)
	if ids := point.EventIDs(rc, filter); ids != nil && !caps.UnwindKeepsFields && !st.Whole {
		if m, err := point.NewEventMatcher(rc, filter); err == nil {
			st.IDs, st.Events = bucket.NewIDSet(ids), m
		}
	}
	return st, nil
}

// checkStatementFields checks a statement's fields besides q and limit,
// as the server's parser does, and says whether its collation (if any)
// is the simple one.
func (p *Request) checkStatementFields(i int, d bsoncore.Document) (simpleCollation bool, err error) {
	simpleCollation = true
	elems, _ := d.Elements()
	for _, e := range elems {
		switch e.Key() {
		case "q", "limit", "hint":
		case "collation":
			if simpleCollation, err = statementCollation(i, e.Value()); err != nil {
				return false, err
			}
		default:
			return false, mongoerr.Errorf(mongoerr.FailedToParse, "delete statement %d: unknown field %q", i, e.Key())
		}
	}
	return simpleCollation, nil
}

// planScanStatement plans a statement on an upstream that cannot see the
// events (caps.Upstream.PackedEvents): the match command lists whole
// buckets, narrowed by the filter's bucket part where it has one, and the
// proxy matches their events itself (Candidates.Feed).
//
// The upstream gets only the conditions that select buckets exactly on
// every upstream (point.BucketPushDown): FerretDB evaluates other
// operators on a bucket's meta unlike MongoDB, and a delete that let it
// choose the buckets (whole, by the split filter's bucket part) deleted
// events MongoDB keeps ({"sensor.tags.k": {$ne: "a"}} over arrays, a
// $elemMatch range, a regex with $ before a final newline) and kept others.
func (p *Request) planScanStatement(st *Statement, rc *query.Ctx, filter bsoncore.Document) (*Statement, error) {
	safe, whole := point.BucketPushDown(rc, filter)
	var sf query.SplitFilter
	if len(safe) > 5 {
		sf.Bucket = safe
	}
	if whole {
		st.Whole = true
		st.Match = p.matchCommand(sf, true, st.LimitOne, rc.Caps)
		return st, nil
	}
	m, err := point.NewEventMatcher(rc, filter)
	if err != nil {
		st.Err = query.RuleErrorf(p.rule, mongoerr.NotImplemented, "delete filter: %v", err)
		return st, nil
	}
	st.Events, st.Scan = m, true
	if ids := point.EventIDs(rc, filter); ids != nil {
		st.IDs = bucket.NewIDSet(ids)
	}
	st.Match = p.scanCommand(sf, st.LimitOne)
	return st, nil
}

// scanCommand lists the whole buckets the filter's bucket part selects.
func (p *Request) scanCommand(sf query.SplitFilter, limitOne bool) []byte {
	var pipeline []bsoncore.Document
	if sf.Bucket != nil {
		pipeline = append(pipeline, bsonutil.Stage("$match", bsonutil.DocValue(sf.Bucket)))
	}
	if len(pipeline) == 0 {
		// FerretDB refuses an empty pipeline as nothing else: a $match of
		// everything reads the same.
		pipeline = append(pipeline, bsonutil.Stage("$match", bsonutil.DocValue(bsoncore.NewDocumentBuilder().Build())))
	}
	return p.aggregateCommand(pipeline, scanMatchBatch)
}

// holdsEvents is {count: {$gt: 0}}: a bucket with an event.
var holdsEvents = bsoncore.NewDocumentBuilder().
	AppendDocument(bucket.FieldCount, bsoncore.NewDocumentBuilder().AppendInt32("$gt", 0).Build()).
	Build()

// matchCommand lists matching events as {_id: bucket, events: event}
// ($unwind keeps the bucket _id on every upstream; on one that keeps the
// other fields too, meta and start come along and spare a read of each
// bucket's key), or whole buckets.
func (p *Request) matchCommand(sf query.SplitFilter, whole, limitOne bool, caps caps.Upstream) []byte {
	var pipeline []bsoncore.Document
	if whole {
		match := sf.Bucket
		if limitOne {
			// The first bucket must hold an event: a shell (bucket.Shell)
			// matches any filter of meta alone and holds none, and a
			// deleteOne that took it removed nothing.
			match = query.AndOf(slices.DeleteFunc([]bsoncore.Document{sf.Bucket, holdsEvents}, func(d bsoncore.Document) bool { return d == nil }))
		}
		if match != nil {
			pipeline = append(pipeline, bsonutil.Stage("$match", bsonutil.DocValue(match)))
		}
		proj := bsoncore.NewDocumentBuilder().
			AppendInt32(bucket.FieldMeta, 1).
			AppendInt32(bucket.FieldStart, 1).
			Build()
		pipeline = append(pipeline, bsonutil.Stage("$project", bsonutil.DocValue(proj)))
	} else {
		pipeline = query.EventPipeline(sf, caps)
		pb := bsoncore.NewDocumentBuilder()
		if caps.UnwindKeepsFields {
			pb.AppendInt32(bucket.FieldMeta, 1).AppendInt32(bucket.FieldStart, 1)
		}
		proj := pb.AppendInt32(bucket.FieldEvents, 1).Build()
		pipeline = append(pipeline, bsonutil.Stage("$project", bsonutil.DocValue(proj)))
	}
	if limitOne {
		pipeline = append(pipeline, bsonutil.Stage("$limit", bsonutil.Int64Value(1)))
	}
	return p.aggregateCommand(pipeline, deleteMatchBatch)
}

// aggregateCommand is an aggregate of the bucket collection.
func (p *Request) aggregateCommand(pipeline []bsoncore.Document, batch int32) []byte {
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendStringElement(d, "aggregate", p.rule.BucketCollection)
	aidx, a := bsoncore.AppendArrayElementStart(d, "pipeline")
	for i, s := range pipeline {
		a = bsoncore.AppendDocumentElement(a, strconv.Itoa(i), s)
	}
	d, _ = bsoncore.AppendArrayEnd(a, aidx)
	cidx, c := bsoncore.AppendDocumentElementStart(d, "cursor")
	c = bsoncore.AppendInt32Element(c, "batchSize", batch)
	d, _ = bsoncore.AppendDocumentEnd(c, cidx)
	d = bsonutil.AppendElems(d, p.reads)
	d = bsoncore.AppendStringElement(d, "$db", p.rule.DB)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

// GetMoreCommand continues an upstream cursor on the bucket collection.
func (p *Request) GetMoreCommand(id int64) []byte {
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendInt64Element(d, "getMore", id)
	d = bsoncore.AppendStringElement(d, "collection", p.rule.BucketCollection)
	d = bsoncore.AppendInt32Element(d, "batchSize", deleteMatchBatch)
	d = bsonutil.AppendElems(d, p.more)
	d = bsoncore.AppendStringElement(d, "$db", p.rule.DB)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

// FindBucketCommand reads one bucket by _id (a point read on every
// upstream): whole, or without its events when whole is false (a bucket
// deleted whole needs only its key and count).
func (p *Request) FindBucketCommand(id bson.ObjectID, whole bool) []byte {
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendStringElement(d, "find", p.rule.BucketCollection)
	fidx, f := bsoncore.AppendDocumentElementStart(d, "filter")
	f = bsoncore.AppendObjectIDElement(f, bucket.FieldID, id)
	d, _ = bsoncore.AppendDocumentEnd(f, fidx)
	if !whole {
		pidx, pr := bsoncore.AppendDocumentElementStart(d, "projection")
		pr = bsoncore.AppendInt32Element(pr, bucket.FieldEvents, 0)
		pr = bsoncore.AppendInt32Element(pr, bucket.FieldPacked, 0)
		d, _ = bsoncore.AppendDocumentEnd(pr, pidx)
	}
	d = bsoncore.AppendInt32Element(d, "limit", 1)
	d = bsoncore.AppendBooleanElement(d, "singleBatch", true)
	d = bsonutil.AppendElems(d, p.reads)
	d = bsoncore.AppendStringElement(d, "$db", p.rule.DB)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

// NewCandidates collects the match results of st.
func (st *Statement) NewCandidates() *Candidates {
	c := &Candidates{whole: st.Whole, byID: map[bson.ObjectID]*Candidate{}}
	if st.Scan {
		c.scan, c.limitOne = st.Events, st.LimitOne
	}
	return c
}

// Edit computes the bucket that remains of bucket once the candidate's
// matched events are removed; limitOne removes at most one.
func (p *Request) Edit(c *Candidate, bdoc bsoncore.Document, limitOne bool) (BucketEdit, error) {
	meta, start, err := bucket.KeyFields(bdoc)
	if err != nil {
		return BucketEdit{}, err
	}
	key := bucket.KeyOf(meta, start)
	seq, ok := bucket.SeqOf(p.rule.BucketNamespace(), key, c.ID)
	if !ok {
		return BucketEdit{}, query.RuleErrorf(p.rule, mongoerr.NotImplemented, "bucket %s is not one the proxy wrote (its _id is not of its series and window); delete it directly", c.ID.Hex())
	}
	if c.all && !limitOne {
		// Every event goes: the bucket may have been read without them.
		n := bucket.CountOf(bdoc)
		return BucketEdit{ID: c.ID, Key: key, Seq: seq, Removed: n, OldCount: n, Replacement: bucket.Shell(meta, start)}, nil
	}
	stored, err := bucket.EventDocs(bdoc)
	if err != nil {
		return BucketEdit{}, query.RuleErrorf(p.rule, mongoerr.InternalError, "bucket %s: %v", c.ID.Hex(), err)
	}
	left := make(map[string]int, len(c.match))
	for k, n := range c.match {
		left[k] = n
	}
	var keep []bucket.Event
	removed := 0
	for _, d := range stored {
		if limitOne && removed == 1 {
			keep = append(keep, p.storedToEvent(d, meta, start))
			continue
		}
		if c.all {
			removed++
			continue
		}
		if k := string(d); left[k] > 0 {
			left[k]--
			removed++
			continue
		}
		keep = append(keep, p.storedToEvent(d, meta, start))
	}
	e := BucketEdit{ID: c.ID, Key: key, Seq: seq, Removed: removed, Remaining: len(keep), OldCount: len(stored)}
	if len(keep) == 0 {
		e.Replacement = bucket.Shell(meta, start)
	} else {
		e.Replacement = withoutID(bucket.Complete(c.ID, keep, p.rule, p.lim))
	}
	return e, nil
}

// storedToEvent reads back what summarize needs of a stored event. The
// insert path validated it: a missing time reads as 0, which a stored
// event never has; a non-number aggregate marks the bucket mixed again.
func (p *Request) storedToEvent(d bsoncore.Document, meta bsoncore.Value, start int64) bucket.Event {
	ev := bucket.Event{Meta: meta, Start: start, Stored: d}
	if t, ok := bsonutil.Lookup(d, p.rule.TimeField); ok {
		ev.Time, _ = t.DateTimeOK()
	}
	for _, name := range p.lim.Aggregates {
		v, _ := bsonutil.Lookup(d, name)
		ev.Aggs = append(ev.Aggs, v)
	}
	return ev
}

// ReplaceCommand is an update replacing each edited bucket by _id.
func (p *Request) ReplaceCommand(edits []BucketEdit) []byte {
	return p.byIDCommand("update", "updates", len(edits), func(i int) bson.ObjectID { return edits[i].ID },
		func(s []byte, i int) []byte { return bsoncore.AppendDocumentElement(s, "u", edits[i].Replacement) })
}

// RemoveCommand deletes buckets by _id, in the order given (the proxy
// gives the highest seq first, so a failure part way leaves no gap).
func (p *Request) RemoveCommand(ids []bson.ObjectID) []byte {
	return p.byIDCommand("delete", "deletes", len(ids), func(i int) bson.ObjectID { return ids[i] },
		func(s []byte, _ int) []byte { return bsoncore.AppendInt32Element(s, "limit", 1) })
}

// byIDCommand is an ordered write on the bucket collection of n
// statements, each {q: {_id: id(i)}, ...rest(i)}.
func (p *Request) byIDCommand(command, field string, n int, id func(int) bson.ObjectID, rest func([]byte, int) []byte) []byte {
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendStringElement(d, command, p.rule.BucketCollection)
	aidx, a := bsoncore.AppendArrayElementStart(d, field)
	for i := 0; i < n; i++ {
		sidx, s := bsoncore.AppendDocumentElementStart(a, strconv.Itoa(i))
		qidx, q := bsoncore.AppendDocumentElementStart(s, "q")
		q = bsoncore.AppendObjectIDElement(q, bucket.FieldID, id(i))
		s, _ = bsoncore.AppendDocumentEnd(q, qidx)
		s = rest(s, i)
		a, _ = bsoncore.AppendDocumentEnd(s, sidx)
	}
	d, _ = bsoncore.AppendArrayEnd(a, aidx)
	d = bsoncore.AppendBooleanElement(d, "ordered", true)
	d = bsonutil.AppendElems(d, p.args)
	d = bsoncore.AppendStringElement(d, "$db", p.rule.DB)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

// WriteOutcome reads the reply of a ReplaceCommand or RemoveCommand: how
// many statements took effect before the first failure (all of them when
// err is nil). A write concern error is kept for the app's reply.
func (p *Request) WriteOutcome(reply []byte, statements int) (done int, err error) {
	doc := bsoncore.Document(reply)
	if err := mongoerr.ReplyError(doc); err != nil {
		return 0, err
	}
	if wce, ok := bsonutil.Lookup(doc, "writeConcernError"); ok {
		p.wce = wce
	}
	v, ok := bsonutil.Lookup(doc, "writeErrors")
	if !ok {
		return statements, nil
	}
	arr, ok := v.ArrayOK()
	if !ok {
		return 0, mongoerr.Errorf(mongoerr.InternalError, "upstream writeErrors is a %s", bsonutil.TypeName(v.Type))
	}
	vals, _ := arr.Values()
	if len(vals) == 0 {
		return statements, nil
	}
	first, _ := vals[0].DocumentOK()
	idx, _ := bsonutil.Lookup(first, "index")
	i, _ := idx.AsInt64OK()
	return int(i), upstreamWriteError(first)
}

// Reply is the app's delete reply: {n, writeErrors?, writeConcernError?,
// ok: 1}. A statement error's code is its *mongoerr.Error's.
func (p *Request) Reply(n int, errs []StatementError) []byte {
	var werrs []bucket.WriteError
	for _, e := range errs {
		code := mongoerr.InternalError
		if ce, ok := e.Err.(*mongoerr.Error); ok {
			code = ce.Code
		}
		werrs = append(werrs, bucket.WriteError{Index: e.Index, Code: code, Msg: e.Err.Error()})
	}
	return insert.WriteReply(n, werrs, p.wce, bsoncore.Value{})
}
