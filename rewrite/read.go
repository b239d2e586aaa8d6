package rewrite

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/tsproxy/tsproxy/rewrite/bucket"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// ReadPlan is the rewrite of one read command on a bucketed namespace: an
// aggregate on the bucket collection (only $match, $unwind, $sort, $skip,
// $limit and $count upstream, so it runs on every upstream), and how to
// turn its reply into the reply the app expects.
//
// The proxy sends Command. Then:
//   - Drain (count, distinct): it feeds every reply to Feed, sending the
//     getMore Feed returns until it returns nil, and answers with Result.
//   - Passthrough (explain): it answers with the upstream reply unchanged.
//   - otherwise (a cursor): it answers with Cursor.MapReply of the reply,
//     remembering the upstream cursor (unless Cursor.SingleBatch, when it
//     kills it with KillCursorsCommand instead).
type ReadPlan struct {
	Command     []byte
	Drain       bool
	Passthrough bool
	Cursor      *CursorShape
	// Point, when set, serves the find from bucket point lookups instead
	// of Command (see PointRead).
	Point *PointRead
	// Local, when set, is the whole answer (explain of a point read).
	Local []byte
	// LocalExplain, with Local, is the upstream explain of the command a
	// point or scan read sends first; the proxy runs it and adds its
	// reply to Local with WithUpstreamPlan.
	LocalExplain []byte

	rc    *readCtx
	drain drainer
	metas *metaResolver
	// bucketFilter is the bucket-level filter, for MetaPrefetch.
	bucketFilter bsoncore.Document
}

// MetaPrefetch is the find that learns the metas of the buckets the read
// selects (nil when the upstream's $unwind keeps them, or the rule has no
// metaField). Send it before Command, feeding each reply to AddPrefetched
// and sending the getMore it returns until nil.
func (p *ReadPlan) MetaPrefetch() []byte {
	if p.rc == nil || p.rc.caps.UnwindKeepsFields || p.Passthrough {
		return nil
	}
	m := p.metas
	if p.Cursor != nil {
		if p.Cursor.mode != shapeEvent {
			return nil
		}
		m = p.Cursor.metas
	}
	return m.prefetch(p.bucketFilter)
}

// AddPrefetched learns a reply to MetaPrefetch (or its getMore) and
// returns the next getMore, or nil.
func (p *ReadPlan) AddPrefetched(reply []byte) []byte {
	if p.Cursor != nil {
		return p.Cursor.metas.addPrefetched(reply)
	}
	return p.metas.addPrefetched(reply)
}

// MetaQuery and AddMetas: as CursorShape's, for a Drain plan's replies.
func (p *ReadPlan) MetaQuery(reply []byte) [][]byte {
	if p.Cursor != nil {
		return p.Cursor.MetaQuery(reply)
	}
	return p.metas.query(reply)
}

// AddMetas learns the metas from the reply to MetaQuery.
func (p *ReadPlan) AddMetas(reply []byte) error {
	if p.Cursor != nil {
		return p.Cursor.AddMetas(reply)
	}
	return p.metas.add(reply)
}

// drainer accumulates the batches of a count or distinct.
type drainer interface {
	feed(doc bsoncore.Document) error
	result() bsoncore.Document
}

// ReadOptions are the inputs of PlanRead that do not come from the client.
type ReadOptions struct {
	Caps Caps
}

// PlanRead rewrites a find, aggregate, count, distinct or explain command
// body on rule's namespace. Errors are *mongoerr.Error: answer with
// ErrorReply.
func PlanRead(body []byte, rule *rules.Rule, opts ReadOptions) (p *ReadPlan, err error) {
	rc, err := newReadCtx(rule)
	if err != nil {
		return nil, err
	}
	rc.caps = opts.Caps
	doc := bsoncore.Document(body)
	if err := bsonutil.Validate(doc, 0); err != nil {
		return nil, mongoerr.Errorf(mongoerr.InvalidBSON, "tsproxy rule %s: command is not valid BSON: %v", rc.ns, err)
	}
	elems, _ := doc.Elements()
	if len(elems) == 0 {
		return nil, rc.badValue(mongoerr.BadValue, "empty command")
	}
	name := elems[0].Key()
	switch name {
	case "find":
		return rc.planFind(doc, opts, false)
	case "aggregate":
		return rc.planAggregate(doc, opts, false)
	case "count":
		return rc.planCount(doc, false)
	case "distinct":
		return rc.planDistinct(doc, false)
	case "explain":
		return rc.planExplain(doc, opts)
	}
	return nil, rc.unsupported("command %q is not supported on a bucketed namespace", name)
}

// readCarried are the generic arguments a rewritten read carries.
var readCarried = []string{
	"maxTimeMS", "comment", "readConcern",
	"lsid", "txnNumber", "autocommit", "startTransaction",
	"$readPreference", "$clusterTime",
	"apiVersion", "apiStrict", "apiDeprecationErrors",
}

var readCarriedSet = func() map[string]bool {
	m := map[string]bool{"$db": true}
	for _, k := range readCarried {
		m[k] = true
	}
	return m
}()

// refusedReadOptions explains why an option has no bucketed equivalent.
var refusedReadOptions = map[string]string{
	"hint":                "the bucket collection has other indexes",
	"collation":           "comparisons run on the bucket collection without it",
	"min":                 "index bounds name the bucket collection's indexes",
	"max":                 "index bounds name the bucket collection's indexes",
	"returnKey":           "index keys are the bucket collection's",
	"showRecordId":        "record ids are the buckets'",
	"tailable":            "bucketed reads are not tailable",
	"awaitData":           "bucketed reads are not tailable",
	"oplogReplay":         "not an oplog",
	"let":                 "variables are not supported",
	"allowPartialResults": "not supported",
	"noCursorTimeout":     "not supported",
	"writeConcern":        "reads through the proxy do not write",
}

// boolFalseOK: options that are harmless when false.
var boolFalseOK = map[string]bool{"tailable": true, "awaitData": true, "allowPartialResults": true, "noCursorTimeout": true, "returnKey": true, "showRecordId": true, "oplogReplay": true}

// checkOptions refuses every field of body not in known (nor carried).
func (rc *readCtx) checkOptions(body bsoncore.Document, cmd string, known ...string) error {
	elems, _ := body.Elements()
	for i, e := range elems {
		k := e.Key()
		if i == 0 || readCarriedSet[k] {
			continue
		}
		ok := false
		for _, kn := range known {
			if kn == k {
				ok = true
				break
			}
		}
		if ok {
			continue
		}
		if boolFalseOK[k] {
			if b, isBool := e.Value().BooleanOK(); isBool && !b {
				continue
			}
		}
		if why, found := refusedReadOptions[k]; found {
			return rc.unsupported("%s option %q is not supported on a bucketed namespace (%s)", cmd, k, why)
		}
		return rc.unsupported("%s option %q is not supported on a bucketed namespace", cmd, k)
	}
	return nil
}

// readInt reads a whole number argument (int32, int64 or an integral
// double), as the server accepts them.
func (rc *readCtx) readInt(body bsoncore.Document, key, cmd string) (int64, bool, error) {
	v, ok := bsonutil.Lookup(body, key)
	if !ok || v.Type == bsoncore.TypeNull {
		return 0, false, nil
	}
	switch v.Type {
	case bsoncore.TypeInt32:
		return int64(v.Int32()), true, nil
	case bsoncore.TypeInt64:
		return v.Int64(), true, nil
	case bsoncore.TypeDouble:
		f := v.Double()
		if f == math.Trunc(f) && f >= -9.2e18 && f <= 9.2e18 {
			return int64(f), true, nil
		}
	}
	return 0, false, rc.badValue(mongoerr.TypeMismatch, "%s option %q must be a whole number, got %s", cmd, key, bsonutil.TypeName(v.Type))
}

// findPaging is a find's skip, limit, singleBatch and batchSize, read and
// checked as MongoDB does; a negative limit asks for one batch of -limit.
type findPaging struct {
	skip, limit int64
	single      bool
	batchSize   int64 // -1 when the command gives none
}

func (rc *readCtx) readFindPaging(body bsoncore.Document) (findPaging, error) {
	const cmd = "find"
	var pg findPaging
	var err error
	if pg.skip, _, err = rc.readInt(body, "skip", cmd); err != nil {
		return pg, err
	}
	if pg.skip < 0 {
		return pg, rc.badValue(mongoerr.BadValue, "find option \"skip\" must be non-negative")
	}
	if pg.limit, _, err = rc.readInt(body, "limit", cmd); err != nil {
		return pg, err
	}
	if pg.single, err = bsonutil.Bool(body, "singleBatch", false); err != nil {
		return pg, rc.badValue(mongoerr.TypeMismatch, "find option \"singleBatch\" must be a boolean")
	}
	if pg.limit < 0 {
		if pg.limit == math.MinInt64 {
			return pg, rc.badValue(mongoerr.BadValue, "find option \"limit\" is out of range")
		}
		pg.limit, pg.single = -pg.limit, true
	}
	bs, hasBatch, err := rc.readInt(body, "batchSize", cmd)
	if err != nil {
		return pg, err
	}
	if bs < 0 {
		return pg, rc.badValue(mongoerr.BadValue, "find option \"batchSize\" must be non-negative")
	}
	pg.batchSize = -1
	if hasBatch {
		pg.batchSize = bs
	}
	return pg, nil
}

// firstBatch is how many documents the first batch of a cursor the proxy
// holds carries: the batchSize or the server's default, at most the limit.
func (pg findPaging) firstBatch() int64 {
	first := int64(defaultFirstBatch)
	if pg.batchSize >= 0 {
		first = pg.batchSize
	}
	if pg.limit > 0 && (pg.single || first > pg.limit) {
		first = pg.limit
	}
	return first
}

// readCountPaging reads a count's skip and limit; a negative limit counts
// as its absolute value, as on MongoDB.
func (rc *readCtx) readCountPaging(body bsoncore.Document) (skip, limit int64, err error) {
	const cmd = "count"
	if skip, _, err = rc.readInt(body, "skip", cmd); err != nil {
		return 0, 0, err
	}
	if skip < 0 {
		return 0, 0, rc.badValue(mongoerr.BadValue, "count option \"skip\" must be non-negative")
	}
	if limit, _, err = rc.readInt(body, "limit", cmd); err != nil {
		return 0, 0, err
	}
	if limit < 0 && limit != math.MinInt64 {
		limit = -limit
	}
	return skip, limit, nil
}

func (rc *readCtx) readDoc(body bsoncore.Document, key, cmd string) (bsoncore.Document, error) {
	v, ok := bsonutil.Lookup(body, key)
	if !ok || v.Type == bsoncore.TypeNull {
		return nil, nil
	}
	d, ok := v.DocumentOK()
	if !ok {
		return nil, rc.badValue(mongoerr.TypeMismatch, "%s option %q must be a document, got %s", cmd, key, bsonutil.TypeName(v.Type))
	}
	return d, nil
}

// translateSort renames sort keys as filter paths are renamed.
func (rc *readCtx) translateSort(sort bsoncore.Document, cmd string) (bsoncore.Document, error) {
	elems, err := sort.Elements()
	if err != nil {
		return nil, rc.badValue(mongoerr.InvalidBSON, "sort is not valid BSON: %v", err)
	}
	if len(elems) == 0 {
		return nil, nil
	}
	idx, d := bsoncore.AppendDocumentStart(nil)
	for _, e := range elems {
		k := e.Key()
		if k == "" || strings.HasPrefix(k, "$") {
			return nil, rc.badValue(mongoerr.BadValue, "%s sort key %q is not a field path", cmd, k)
		}
		v := e.Value()
		f, ok := v.AsFloat64OK()
		if !ok || (f != 1 && f != -1) {
			if v.Type == bsoncore.TypeEmbeddedDocument {
				return nil, rc.unsupported("%s sort on %q by %s is not supported on a bucketed namespace", cmd, k, v.String())
			}
			return nil, rc.badValue(mongoerr.BadValue, "%s sort direction of %q must be 1 or -1", cmd, k)
		}
		if _, isMeta := rc.metaPath(k); isMeta && !rc.caps.UnwindKeepsFields {
			return nil, rc.unsupported("%s on the metaField %q is not supported on a bucketed namespace on this upstream (FerretDB's $unwind drops the bucket's meta)", cmd+" sort", k)
		}
		d = bsoncore.AppendInt32Element(d, rc.upstreamPath(k), int32(f))
	}
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d, nil
}

func unwindStage() bsoncore.Document {
	return bsonutil.Stage("$unwind", bsonutil.StringValue("$"+bucket.FieldEvents))
}

// eventPipeline is the upstream pipeline of an event read, before its
// tail: bucket $match, $unwind, event $match.
func eventPipeline(sf splitFilter) []bsoncore.Document {
	var st []bsoncore.Document
	if sf.bdoc != nil {
		st = append(st, bsonutil.Stage("$match", bsonutil.DocValue(sf.bdoc)))
	}
	st = append(st, unwindStage())
	if sf.event != nil {
		st = append(st, bsonutil.Stage("$match", bsonutil.DocValue(sf.event)))
	}
	return st
}

// aggregateCommand builds the upstream aggregate on the bucket
// collection. batchSize < 0: none given. forExplain leaves out $db and the
// generic arguments (the explain wrapper carries them).
func (rc *readCtx) aggregateCommand(pipeline []bsoncore.Document, batchSize int64, body bsoncore.Document, extra []bsoncore.Element, forExplain bool) bsoncore.Document {
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendStringElement(d, "aggregate", rc.rule.BucketCollection)
	aidx, a := bsoncore.AppendArrayElementStart(d, "pipeline")
	for i, s := range pipeline {
		a = bsoncore.AppendDocumentElement(a, strconv.Itoa(i), s)
	}
	d, _ = bsoncore.AppendArrayEnd(a, aidx)
	cidx, c := bsoncore.AppendDocumentElementStart(d, "cursor")
	if batchSize >= 0 {
		c = bsoncore.AppendInt64Element(c, "batchSize", batchSize)
	}
	d, _ = bsoncore.AppendDocumentEnd(c, cidx)
	for _, e := range extra {
		d = append(d, e...)
	}
	if !forExplain {
		for _, e := range bsonutil.Pick(body, readCarried) {
			d = append(d, e...)
		}
		d = bsoncore.AppendStringElement(d, "$db", rc.rule.DB)
	}
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

// planFind rewrites find into an aggregate of events.
func (rc *readCtx) planFind(body bsoncore.Document, opts ReadOptions, forExplain bool) (*ReadPlan, error) {
	const cmd = "find"
	if err := rc.checkOptions(body, cmd, "filter", "sort", "projection", "skip", "limit", "batchSize", "singleBatch", "allowDiskUse", "maxScan"); err != nil {
		return nil, err
	}
	if _, ok := bsonutil.Lookup(body, "maxScan"); ok {
		return nil, rc.unsupported("find option %q is not supported on a bucketed namespace", "maxScan")
	}
	filter, err := rc.readDoc(body, "filter", cmd)
	if err != nil {
		return nil, err
	}
	sf, err := rc.split(filter)
	if err != nil {
		return nil, err
	}
	pipeline := eventPipeline(sf)
	sortDoc, err := rc.readDoc(body, "sort", cmd)
	if err != nil {
		return nil, err
	}
	if sortDoc != nil {
		s, err := rc.translateSort(sortDoc, cmd)
		if err != nil {
			return nil, err
		}
		if s != nil {
			pipeline = append(pipeline, bsonutil.Stage("$sort", bsonutil.DocValue(s)))
		}
	}
	pg, err := rc.readFindPaging(body)
	if err != nil {
		return nil, err
	}
	skip, limit, single, batchSize := pg.skip, pg.limit, pg.single, pg.batchSize
	if skip > 0 {
		pipeline = append(pipeline, bsonutil.Stage("$skip", bsonutil.Int64Value(skip)))
	}
	if limit > 0 {
		pipeline = append(pipeline, bsonutil.Stage("$limit", bsonutil.Int64Value(limit)))
	}
	if single && limit > 0 && (batchSize < 0 || batchSize > limit) {
		batchSize = limit
	}
	projDoc, err := rc.readDoc(body, "projection", cmd)
	if err != nil {
		return nil, err
	}
	proj, err := rc.parseProjection(projDoc, "find option \"projection\"")
	if err != nil {
		return nil, err
	}
	extra := bsonutil.Pick(body, []string{"allowDiskUse"})
	p := &ReadPlan{rc: rc, bucketFilter: sf.bdoc}
	if spec, _ := rc.planPoint(filter, sortDoc); spec != nil {
		p.Point = rc.newPointRead(spec, proj, skip, limit, single)
	} else if spec, sc, _ := rc.planScan(filter, sortDoc); spec != nil {
		p.Point = rc.newScanRead(spec, sc, proj, skip, limit, single)
	}
	if p.Point != nil {
		p.Point.Want(pg.firstBatch())
	}
	p.Command = rc.aggregateCommand(pipeline, batchSize, body, extra, forExplain)
	p.Cursor = &CursorShape{ns: rc.ns, metaField: rc.metaField, mode: shapeEvent, proj: proj, SingleBatch: single, metas: newMetaResolver(rc)}
	return p, nil
}

// planCount rewrites count into [..events.., $skip, $limit, $count].
func (rc *readCtx) planCount(body bsoncore.Document, forExplain bool) (*ReadPlan, error) {
	const cmd = "count"
	if err := rc.checkOptions(body, cmd, "query", "skip", "limit", "fields"); err != nil {
		return nil, err
	}
	query, err := rc.readDoc(body, "query", cmd)
	if err != nil {
		return nil, err
	}
	sf, err := rc.split(query)
	if err != nil {
		return nil, err
	}
	pipeline := eventPipeline(sf)
	skip, limit, err := rc.readCountPaging(body)
	if err != nil {
		return nil, err
	}
	if skip > 0 {
		pipeline = append(pipeline, bsonutil.Stage("$skip", bsonutil.Int64Value(skip)))
	}
	if limit > 0 {
		pipeline = append(pipeline, bsonutil.Stage("$limit", bsonutil.Int64Value(limit)))
	}
	pipeline = append(pipeline, bsonutil.Stage("$count", bsonutil.StringValue("n")))
	p := &ReadPlan{rc: rc, Drain: true, drain: &countDrain{}}
	p.Command = rc.aggregateCommand(pipeline, -1, body, nil, forExplain)
	return p, nil
}

// planDistinct rewrites distinct into an event read whose values the
// proxy collects.
func (rc *readCtx) planDistinct(body bsoncore.Document, forExplain bool) (*ReadPlan, error) {
	const cmd = "distinct"
	if err := rc.checkOptions(body, cmd, "key", "query"); err != nil {
		return nil, err
	}
	kv, ok := bsonutil.Lookup(body, "key")
	if !ok {
		return nil, rc.badValue(mongoerr.FailedToParse, "distinct needs a \"key\"")
	}
	key, ok := kv.StringValueOK()
	if !ok {
		return nil, rc.badValue(mongoerr.TypeMismatch, "distinct \"key\" must be a string, got %s", bsonutil.TypeName(kv.Type))
	}
	if key == "" || strings.HasPrefix(key, "$") || strings.Contains(key, "..") || strings.HasPrefix(key, ".") || strings.HasSuffix(key, ".") {
		return nil, rc.badValue(mongoerr.BadValue, "distinct \"key\" %q is not a field path", key)
	}
	query, err := rc.readDoc(body, "query", cmd)
	if err != nil {
		return nil, err
	}
	sf, err := rc.split(query)
	if err != nil {
		return nil, err
	}
	metas := newMetaResolver(rc)
	p := &ReadPlan{rc: rc, Drain: true, metas: metas, bucketFilter: sf.bdoc, drain: &distinctDrain{path: strings.Split(key, "."), metaField: rc.metaField, metas: metas}}
	p.Command = rc.aggregateCommand(eventPipeline(sf), -1, body, nil, forExplain)
	return p, nil
}

// planExplain explains the rewritten aggregate, so the user sees the
// upstream's plan on the bucket collection.
func (rc *readCtx) planExplain(body bsoncore.Document, opts ReadOptions) (*ReadPlan, error) {
	if err := rc.checkOptions(body, "explain", "verbosity"); err != nil {
		return nil, err
	}
	v, _ := bsonutil.Lookup(body, "explain")
	inner, ok := v.DocumentOK()
	if !ok {
		return nil, rc.badValue(mongoerr.TypeMismatch, "explain needs a command document")
	}
	elems, _ := inner.Elements()
	if len(elems) == 0 {
		return nil, rc.badValue(mongoerr.BadValue, "explain of an empty command")
	}
	var ip *ReadPlan
	var err error
	switch name := elems[0].Key(); name {
	case "find":
		ip, err = rc.planFind(inner, opts, true)
	case "aggregate":
		ip, err = rc.planAggregate(inner, opts, true)
	case "count":
		ip, err = rc.planCount(inner, true)
	case "distinct":
		ip, err = rc.planDistinct(inner, true)
	default:
		return nil, rc.unsupported("explain of %q is not supported on a bucketed namespace", name)
	}
	if err != nil {
		return nil, err
	}
	if ip.Point != nil {
		return &ReadPlan{rc: rc, Local: ip.Point.explain(), LocalExplain: ip.Point.explainTarget()}, nil
	}
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendDocumentElement(d, "explain", ip.Command)
	d = bsonutil.AppendElems(d, bsonutil.Pick(body, []string{"verbosity"}))
	d = bsonutil.AppendElems(d, bsonutil.Pick(body, readCarried))
	d = bsoncore.AppendStringElement(d, "$db", rc.rule.DB)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return &ReadPlan{rc: rc, Passthrough: true, Command: d}, nil
}

// Feed takes one upstream reply of a Drain plan and returns the getMore to
// send next, or nil when the plan has all it needs (then call Result).
func (p *ReadPlan) Feed(reply []byte) []byte {
	doc := bsoncore.Document(reply)
	if p.drain == nil {
		return nil
	}
	if !replyOK(doc) {
		p.drain = &errorDrain{reply: doc}
		return nil
	}
	cur, err := doc.LookupErr("cursor")
	if err != nil {
		p.drain = &errorDrain{reply: mongoerr.Reply(mongoerr.Errorf(mongoerr.InternalError, "tsproxy rule %s: upstream reply has no cursor", p.rc.ns))}
		return nil
	}
	cd, _ := cur.DocumentOK()
	batch, err := cd.LookupErr("firstBatch")
	if err != nil {
		batch, err = cd.LookupErr("nextBatch")
	}
	if err == nil {
		arr, _ := batch.ArrayOK()
		vals, _ := arr.Values()
		for _, v := range vals {
			d, ok := v.DocumentOK()
			if !ok {
				continue
			}
			if err := p.drain.feed(d); err != nil {
				p.drain = &errorDrain{reply: mongoerr.Reply(err)}
				return nil
			}
		}
	}
	id, _ := cd.Lookup("id").AsInt64OK()
	if id == 0 {
		return nil
	}
	return p.rc.getMoreCommand(id)
}

// DrainCursor is the upstream cursor a Drain plan left open (after an
// error or a refusal), to be killed; 0 if none.
func (p *ReadPlan) Result() []byte {
	if p.drain == nil {
		return mongoerr.Reply(mongoerr.Errorf(mongoerr.InternalError, "not a drained read"))
	}
	return p.drain.result()
}

func (rc *readCtx) getMoreCommand(id int64) []byte {
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendInt64Element(d, "getMore", id)
	d = bsoncore.AppendStringElement(d, "collection", rc.rule.BucketCollection)
	d = bsoncore.AppendStringElement(d, "$db", rc.rule.DB)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

type errorDrain struct{ reply bsoncore.Document }

func (e *errorDrain) feed(bsoncore.Document) error { return nil }
func (e *errorDrain) result() bsoncore.Document    { return e.reply }

type countDrain struct{ n int64 }

func (c *countDrain) feed(d bsoncore.Document) error {
	v, err := d.LookupErr("n")
	if err != nil {
		return mongoerr.Errorf(mongoerr.InternalError, "upstream $count gave no n")
	}
	n, ok := v.AsInt64OK()
	if !ok {
		return mongoerr.Errorf(mongoerr.InternalError, "upstream $count gave a %s", bsonutil.TypeName(v.Type))
	}
	c.n += n
	return nil
}

func (c *countDrain) result() bsoncore.Document {
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = appendCount(d, "n", c.n)
	d = bsoncore.AppendDoubleElement(d, "ok", 1)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

// appendCount writes a count as the server does: an int32 when it fits.
func appendCount(dst []byte, key string, n int64) []byte {
	if n >= math.MinInt32 && n <= math.MaxInt32 {
		return bsoncore.AppendInt32Element(dst, key, int32(n))
	}
	return bsoncore.AppendInt64Element(dst, key, n)
}

// getMore / killCursors

// GetMore rewrites a getMore of a cursor a rewritten read opened: the
// collection becomes the bucket collection.
func GetMore(body []byte, rule *rules.Rule) ([]byte, error) {
	return renameTarget(body, rule, "getMore", "collection")
}

// KillCursors rewrites killCursors on the app's namespace to the bucket
// collection and returns the cursor ids it names.
func KillCursors(body []byte, rule *rules.Rule) ([]byte, []int64, error) {
	out, err := renameTarget(body, rule, "killCursors", "killCursors")
	if err != nil {
		return nil, nil, err
	}
	var ids []int64
	if v, err := bsoncore.Document(body).LookupErr("cursors"); err == nil {
		if arr, ok := v.ArrayOK(); ok {
			vals, _ := arr.Values()
			for _, v := range vals {
				if id, ok := v.AsInt64OK(); ok {
					ids = append(ids, id)
				}
			}
		}
	}
	return out, ids, nil
}

// KillCursorsCommand kills one upstream cursor of the bucket collection.
func KillCursorsCommand(rule *rules.Rule, id int64) []byte {
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendStringElement(d, "killCursors", rule.BucketCollection)
	aidx, a := bsoncore.AppendArrayElementStart(d, "cursors")
	a = bsoncore.AppendInt64Element(a, "0", id)
	d, _ = bsoncore.AppendArrayEnd(a, aidx)
	d = bsoncore.AppendStringElement(d, "$db", rule.DB)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

// renameTarget copies body with the string field key set to the bucket
// collection.
func renameTarget(body []byte, rule *rules.Rule, cmd, key string) ([]byte, error) {
	rc, err := newReadCtx(rule)
	if err != nil {
		return nil, err
	}
	doc := bsoncore.Document(body)
	if err := doc.Validate(); err != nil {
		return nil, rc.badValue(mongoerr.InvalidBSON, "%s is not valid BSON: %v", cmd, err)
	}
	elems, _ := doc.Elements()
	if len(elems) == 0 || elems[0].Key() != cmd {
		return nil, rc.badValue(mongoerr.BadValue, "not a %s command", cmd)
	}
	found := false
	idx, d := bsoncore.AppendDocumentStart(make([]byte, 0, len(body)+16))
	for _, e := range elems {
		if e.Key() == key && !found {
			if _, ok := e.Value().StringValueOK(); !ok {
				return nil, rc.badValue(mongoerr.TypeMismatch, "%s field %q must be a string", cmd, key)
			}
			found = true
			d = bsoncore.AppendStringElement(d, key, rule.BucketCollection)
			continue
		}
		d = append(d, e...)
	}
	if !found {
		return nil, rc.badValue(mongoerr.FailedToParse, "%s needs %q", cmd, key)
	}
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d, nil
}

func (rc *readCtx) String() string { return fmt.Sprintf("read %s", rc.ns) }
