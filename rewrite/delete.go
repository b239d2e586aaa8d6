package rewrite

import (
	"fmt"
	"strconv"

	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/query"

	"github.com/tsproxy/tsproxy/rewrite/bucket"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// This file plans a delete on a bucketed namespace. Each statement's
// filter is split as a read's is (readCtx.split): the bucket-level part
// selects candidate buckets, the event-level part, run upstream after
// $unwind, names the matching events. The proxy then rewrites each bucket
// holding matches under the insert path's key locks: a bucket whose events
// all match is removed (when it is the last seq of its key) or left as an
// empty shell, a partial one is replaced by the bucket of its remaining
// events, with count, bytes, min, max and sum recomputed here. A
// replacement rather than $pull: FerretDB v1.24's $pull with a query
// condition ({$pull: {events: {value: {$gt: 5}}}}) matches the bucket and
// silently removes nothing (verified), and the summaries cannot be
// recomputed upstream there anyway.
//
// Matching events are recognised by their stored bytes: two events with
// the same bytes in one bucket (same meta) match a filter alike, so
// removing copies by bytes removes exactly the matching events.

// DeleteOptions are what PlanDelete needs besides the command.
type DeleteOptions struct {
	Caps caps.Upstream
}

// DeletePlan is a parsed delete command on a bucketed namespace.
type DeletePlan struct {
	rule    *rules.Rule
	lim     bucket.Limits
	ordered bool
	args    []bsoncore.Element // generic arguments carried to upstream writes
	reads   []bsoncore.Element // generic arguments carried to upstream reads
	wce     bsoncore.Value     // the last upstream writeConcernError
	// Statements in the app's order.
	Statements []*DeleteStatement
}

// DeleteStatement is one entry of the delete's "deletes".
type DeleteStatement struct {
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
}

// writeCarried and readCarriedDelete are the generic arguments a
// rewritten delete carries. txnNumber is not: the rewrite runs several
// upstream writes, which one txnNumber would make retries of each other.
var (
	writeCarried      = []string{"lsid", "writeConcern", "comment", "maxTimeMS", "$clusterTime", "apiVersion", "apiStrict", "apiDeprecationErrors"}
	readCarriedDelete = []string{"lsid", "comment", "maxTimeMS", "$clusterTime", "apiVersion", "apiStrict", "apiDeprecationErrors"}
)

// deleteMatchBatch is the batch size of the match aggregate.
const deleteMatchBatch = 10_000

// PlanDelete parses a delete command (statements in the body or in a
// "deletes" document sequence).
func PlanDelete(cmd Command, rule *rules.Rule, opts DeleteOptions) (*DeletePlan, error) {
	lim, err := bucket.LimitsOf(rule)
	if err != nil {
		return nil, err
	}
	if err := checkTarget(cmd.Body, rule, "delete"); err != nil {
		return nil, err
	}
	if inTransaction(cmd.Body) {
		return nil, ruleErrorf(rule, mongoerr.NotImplemented, "delete inside a transaction is not supported on a bucketed namespace")
	}
	if _, ok := bsonutil.Lookup(cmd.Body, "let"); ok {
		return nil, ruleErrorf(rule, mongoerr.NotImplemented, "delete option \"let\" is not supported on a bucketed namespace")
	}
	ordered, err := bsonutil.Bool(cmd.Body, "ordered", true)
	if err != nil {
		return nil, err
	}
	docs, err := commandDocuments(cmd, "deletes")
	if err != nil {
		return nil, err
	}
	p := &DeletePlan{
		rule: rule, lim: lim, ordered: ordered,
		args:  bsonutil.Pick(cmd.Body, writeCarried),
		reads: bsonutil.Pick(cmd.Body, readCarriedDelete),
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
func (p *DeletePlan) Ordered() bool { return p.ordered }

// Rule is the plan's rule.
func (p *DeletePlan) Rule() *rules.Rule { return p.rule }

func ruleErrorf(rule *rules.Rule, code mongoerr.Code, format string, args ...any) error {
	return mongoerr.Errorf(code, "tsproxy rule %s: %s", rule.Namespace, fmt.Sprintf(format, args...))
}

// checkTarget makes sure the command names the rule's collection.
func checkTarget(body bsoncore.Document, rule *rules.Rule, name string) error {
	elems, err := body.Elements()
	if err != nil || len(elems) == 0 {
		return mongoerr.Errorf(mongoerr.BadValue, "empty command")
	}
	if elems[0].Key() != name {
		return mongoerr.Errorf(mongoerr.BadValue, "not a %s command: %q", name, elems[0].Key())
	}
	coll, ok := elems[0].Value().StringValueOK()
	if !ok {
		return mongoerr.Errorf(mongoerr.TypeMismatch, "collection name must be a string, got %s", bsonutil.TypeName(elems[0].Value().Type))
	}
	if coll != rule.Collection {
		return mongoerr.Errorf(mongoerr.BadValue, "%s on collection %q does not match the rule's collection %q", name, coll, rule.Collection)
	}
	if v, ok := bsonutil.Lookup(body, "$db"); ok {
		if db, ok := v.StringValueOK(); !ok || db != rule.DB {
			return mongoerr.Errorf(mongoerr.BadValue, "$db %s does not match the rule's database %q", v.String(), rule.DB)
		}
	}
	return nil
}

// planStatement parses one delete statement. A malformed statement fails
// the command (as the server's parser does); a filter the rewrite cannot
// run is the statement's write error.
func (p *DeletePlan) planStatement(i int, d bsoncore.Document, caps caps.Upstream) (*DeleteStatement, error) {
	st := &DeleteStatement{Index: i}
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
	elems, _ := d.Elements()
	for _, e := range elems {
		switch e.Key() {
		case "q", "limit":
		case "hint", "collation":
			st.Err = ruleErrorf(p.rule, mongoerr.NotImplemented, "delete option %q is not supported on a bucketed namespace", e.Key())
			return st, nil
		default:
			return nil, mongoerr.Errorf(mongoerr.FailedToParse, "delete statement %d: unknown field %q", i, e.Key())
		}
	}
	rc, err := query.NewCtx(p.rule)
	if err != nil {
		return nil, err
	}
	rc.Caps = caps
	sf, err := rc.Split(filter)
	if err != nil {
		st.Err = err
		return st, nil
	}
	st.Whole = sf.Event == nil
	st.Match = p.matchCommand(sf, st.Whole, st.LimitOne, caps.UnwindKeepsFields)
	return st, nil
}

// matchCommand lists matching events as {_id: bucket, events: event}
// ($unwind keeps the bucket _id on every upstream; on one that keeps the
// other fields too, meta and start come along and spare a read of each
// bucket's key), or whole buckets.
func (p *DeletePlan) matchCommand(sf query.SplitFilter, whole, limitOne, withKey bool) []byte {
	var pipeline []bsoncore.Document
	if whole {
		if sf.Bucket != nil {
			pipeline = append(pipeline, bsonutil.Stage("$match", bsonutil.DocValue(sf.Bucket)))
		}
		proj := bsoncore.NewDocumentBuilder().
			AppendInt32(bucket.FieldMeta, 1).
			AppendInt32(bucket.FieldStart, 1).
			Build()
		pipeline = append(pipeline, bsonutil.Stage("$project", bsonutil.DocValue(proj)))
	} else {
		pipeline = query.EventPipeline(sf)
		pb := bsoncore.NewDocumentBuilder()
		if withKey {
			pb.AppendInt32(bucket.FieldMeta, 1).AppendInt32(bucket.FieldStart, 1)
		}
		proj := pb.AppendInt32(bucket.FieldEvents, 1).Build()
		pipeline = append(pipeline, bsonutil.Stage("$project", bsonutil.DocValue(proj)))
	}
	if limitOne {
		pipeline = append(pipeline, bsonutil.Stage("$limit", bsonutil.Int64Value(1)))
	}
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendStringElement(d, "aggregate", p.rule.BucketCollection)
	aidx, a := bsoncore.AppendArrayElementStart(d, "pipeline")
	for i, s := range pipeline {
		a = bsoncore.AppendDocumentElement(a, strconv.Itoa(i), s)
	}
	d, _ = bsoncore.AppendArrayEnd(a, aidx)
	cidx, c := bsoncore.AppendDocumentElementStart(d, "cursor")
	c = bsoncore.AppendInt32Element(c, "batchSize", deleteMatchBatch)
	d, _ = bsoncore.AppendDocumentEnd(c, cidx)
	d = bsonutil.AppendElems(d, p.reads)
	d = bsoncore.AppendStringElement(d, "$db", p.rule.DB)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

// GetMoreCommand continues an upstream cursor on the bucket collection.
func (p *DeletePlan) GetMoreCommand(id int64) []byte {
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendInt64Element(d, "getMore", id)
	d = bsoncore.AppendStringElement(d, "collection", p.rule.BucketCollection)
	d = bsoncore.AppendInt32Element(d, "batchSize", deleteMatchBatch)
	d = bsonutil.AppendElems(d, p.reads)
	d = bsoncore.AppendStringElement(d, "$db", p.rule.DB)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

// FindBucketCommand reads one bucket by _id (a point read on every
// upstream): whole, or without its events when whole is false (a bucket
// deleted whole needs only its key and count).
func (p *DeletePlan) FindBucketCommand(id bson.ObjectID, whole bool) []byte {
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendStringElement(d, "find", p.rule.BucketCollection)
	fidx, f := bsoncore.AppendDocumentElementStart(d, "filter")
	f = bsoncore.AppendObjectIDElement(f, bucket.FieldID, id)
	d, _ = bsoncore.AppendDocumentEnd(f, fidx)
	if !whole {
		pidx, pr := bsoncore.AppendDocumentElementStart(d, "projection")
		pr = bsoncore.AppendInt32Element(pr, bucket.FieldEvents, 0)
		d, _ = bsoncore.AppendDocumentEnd(pr, pidx)
	}
	d = bsoncore.AppendInt32Element(d, "limit", 1)
	d = bsoncore.AppendBooleanElement(d, "singleBatch", true)
	d = bsonutil.AppendElems(d, p.reads)
	d = bsoncore.AppendStringElement(d, "$db", p.rule.DB)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}
