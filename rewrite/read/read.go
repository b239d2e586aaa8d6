package read

import (
	"strings"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/query"
	"github.com/tsproxy/tsproxy/rewrite/read/point"
	"github.com/tsproxy/tsproxy/rules"
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
type Command struct {
	Command     []byte
	Drain       bool
	Passthrough bool
	Cursor      *point.CursorShape
	// Point, when set, serves the find from bucket point lookups instead
	// of Command (see PointRead).
	Point *point.PointRead
	// PointDrain, when set, makes Point serve a count or a distinct:
	// every event it yields goes to PointDrain.take, then
	// PointDrain.result answers.
	PointDrain *PointDrain
	// Local, when set, is the whole answer (explain of a point read).
	Local []byte
	// LocalExplain, with Local, is the upstream explain of the command a
	// point or scan read sends first; the proxy runs it and adds its
	// reply to Local with WithUpstreamPlan.
	LocalExplain []byte

	rc    *query.Ctx
	drain drainer
	metas *point.MetaResolver
	// bucketFilter is the bucket-level filter, for MetaPrefetch.
	bucketFilter bsoncore.Document
}

// MetaPrefetch is the find that learns the metas of the buckets the read
// selects (nil when the upstream's $unwind keeps them, or the rule has no
// metaField). Send it before Command, feeding each reply to AddPrefetched
// and sending the getMore it returns until nil.
func (p *Command) MetaPrefetch() []byte {
	if p.rc == nil || p.rc.Caps.UnwindKeepsFields || p.Passthrough {
		return nil
	}
	m := p.metas
	if p.Cursor != nil {
		if p.Cursor.Mode != point.ShapeEvent {
			return nil
		}
		m = p.Cursor.Metas
	}
	return m.Prefetch(p.bucketFilter)
}

// AddPrefetched learns a reply to MetaPrefetch (or its getMore) and
// returns the next getMore, or nil.
func (p *Command) AddPrefetched(reply []byte) []byte {
	if p.Cursor != nil {
		return p.Cursor.Metas.AddPrefetched(reply)
	}
	return p.metas.AddPrefetched(reply)
}

// MetaQuery and AddMetas: as CursorShape's, for a Drain plan's replies.
func (p *Command) MetaQuery(reply []byte) [][]byte {
	if p.Cursor != nil {
		return p.Cursor.MetaQuery(reply)
	}
	return p.metas.Query(reply)
}

// AddMetas learns the metas from the reply to MetaQuery.
func (p *Command) AddMetas(reply []byte) error {
	if p.Cursor != nil {
		return p.Cursor.AddMetas(reply)
	}
	return p.metas.Add(reply)
}

// drainer accumulates the batches of a count or distinct.
type drainer interface {
	feed(doc bsoncore.Document) error
	result() bsoncore.Document
}

// ReadOptions are the inputs of PlanRead that do not come from the client.
type Options struct {
	Caps caps.Upstream
	// IDLookups is what a find {_id: X} on a bucket collection costs;
	// where it scans, the finds the point lookups could serve take one
	// event scan instead (see pointOrScan).
	IDLookups IDLookupCost
	// IDIndex, when set, keeps the event-id indexes reads by event _id
	// read.
	IDIndex bucket.IDIndexCache
	// AggregateMemory bounds each blocking stage of an aggregation the
	// proxy runs itself (0: agg.DefaultMaxMemory).
	AggregateMemory int
	// Bucketed says whether db.coll is a rule's namespace or buckets: an
	// aggregation's $out or $merge must not write there.
	Bucketed func(db, coll string) bool
}

// IDLookupCost is what a find by _id costs on an upstream.
type IDLookupCost int

const (
	// IDLookupIndexed: an index lookup (MongoDB; the embedded FerretDB,
	// whose SQLite index the proxy adds).
	IDLookupIndexed IDLookupCost = iota
	// IDLookupScansFiltered: a scan the storage filters itself, without
	// decoding the documents (FerretDB on PostgreSQL: a jsonb test per
	// row). A few such lookups still beat one scan whose documents
	// FerretDB decodes.
	IDLookupScansFiltered
	// IDLookupScansParsed: a scan that parses every document (FerretDB on
	// SQLite: the JSON of each row), as costly as an event scan.
	IDLookupScansParsed
)

// maxFilteredLookups is how many lookups that scan but filter in storage
// a point read may send before one event scan is cheaper: measured on
// FerretDB over PostgreSQL, a lookup costs about 1/60 of a scan whose
// buckets FerretDB decodes.
const maxFilteredLookups = 32

// OneScanBeats says whether one scan of a collection finds n documents
// by _id more cheaply than n lookups by _id do.
func (c IDLookupCost) OneScanBeats(n int) bool {
	switch c {
	case IDLookupScansParsed:
		return n > 1
	case IDLookupScansFiltered:
		return n > maxFilteredLookups
	}
	return false
}

// pointOrScan picks, for a find the point lookups can serve, between
// them and one event scan, by what a lookup costs on the upstream.
func pointOrScan(rc *query.Ctx, spec *point.PointSpec, filter, sortDoc bsoncore.Document, opts Options) (*point.PointSpec, *point.BucketScan) {
	if opts.IDLookups == IDLookupIndexed {
		return spec, nil
	}
	es, sc, _ := point.PlanEventScan(rc, filter, sortDoc)
	switch {
	case es == nil:
		return spec, nil
	case opts.IDLookups == IDLookupScansParsed, len(sc.MetaIn) == 1, len(spec.Windows) == 1, spec.Keys() > maxFilteredLookups:
		// One meta, or one window: the scan's equality on it is filtered
		// in storage too.
		return es, sc
	}
	return spec, nil
}

// PlanRead rewrites a find, aggregate, count, distinct or explain command
// body on rule's namespace. Errors are *mongoerr.Error: answer with
// ErrorReply.
func PlanRead(body []byte, rule *rules.Rule, opts Options) (p *Command, err error) {
	rc, err := query.NewCtx(rule)
	if err != nil {
		return nil, err
	}
	rc.Caps = opts.Caps
	rc.IDIndex = opts.IDIndex
	doc := bsoncore.Document(body)
	elems, _ := doc.Elements()
	if len(elems) == 0 {
		return nil, rc.BadValue(mongoerr.BadValue, "empty command")
	}
	name := elems[0].Key()
	switch name {
	case "find":
		return planFind(rc, doc, opts, false)
	case "aggregate":
		return planAggregate(rc, doc, opts, false)
	case "count":
		return planCount(rc, doc, false)
	case "distinct":
		return planDistinct(rc, doc, false)
	case "explain":
		return planExplain(rc, doc, opts)
	}
	return nil, rc.Unsupported("command %q is not supported on a bucketed namespace", name)
}

// planFind rewrites find into an aggregate of events.
func planFind(rc *query.Ctx, body bsoncore.Document, opts Options, forExplain bool) (*Command, error) {
	const cmd = "find"
	body, err := point.NaturalFind(rc, body)
	if err != nil {
		return nil, err
	}
	if err := rc.CheckOptions(body, cmd, "filter", "sort", "projection", "skip", "limit", "batchSize", "singleBatch", "allowDiskUse", "maxScan"); err != nil {
		return nil, err
	}
	if _, ok := bsonutil.Lookup(body, "maxScan"); ok {
		return nil, rc.Unsupported("find option %q is not supported on a bucketed namespace", "maxScan")
	}
	filter, err := rc.ReadDoc(body, "filter", cmd)
	if err != nil {
		return nil, err
	}
	sortDoc, err := rc.ReadDoc(body, "sort", cmd)
	if err != nil {
		return nil, err
	}
	pg, err := rc.ReadFindPaging(body)
	if err != nil {
		return nil, err
	}
	skip, limit, single, batchSize := pg.Skip, pg.Limit, pg.Single, pg.BatchSize
	projDoc, err := rc.ReadDoc(body, "projection", cmd)
	if err != nil {
		return nil, err
	}
	proj, err := rc.ParseProjection(projDoc, "find option \"projection\"")
	if err != nil {
		return nil, err
	}
	if pr := point.IDIndexRead(rc, filter, sortDoc, proj, pg); pr != nil {
		pr.Want(pg.FirstBatch())
		return &Command{rc: rc, Point: pr}, nil
	}
	if rc.Caps.PackedEvents {
		return planFindScan(rc, filter, sortDoc, proj, pg, opts)
	}
	pipeline, sf, err := findPipeline(rc, filter, sortDoc, pg)
	if err != nil {
		// What the upstream cannot run on unwound events, the proxy may
		// run itself on whole buckets.
		pr := point.EventScanRead(rc, filter, sortDoc, proj, pg)
		if pr == nil {
			return nil, err
		}
		pr.Want(pg.FirstBatch())
		return &Command{rc: rc, Point: pr}, nil
	}
	if single && limit > 0 && (batchSize < 0 || batchSize > limit) {
		batchSize = limit
	}
	extra := bsonutil.Pick(body, []string{"allowDiskUse"})
	p := &Command{rc: rc, bucketFilter: sf.Bucket}
	if spec, _ := point.PlanPoint(rc, filter, sortDoc); spec != nil {
		if spec, sc := pointOrScan(rc, spec, filter, sortDoc, opts); sc != nil {
			p.Point = point.NewScanRead(rc, spec, sc, proj, skip, limit, single)
		} else {
			p.Point = point.NewPointRead(rc, spec, proj, skip, limit, single)
		}
	} else if spec, sc, _ := point.PlanScan(rc, filter, sortDoc); spec != nil {
		p.Point = point.NewScanRead(rc, spec, sc, proj, skip, limit, single)
	}
	if p.Point == nil {
		if pr := point.StagedScanRead(rc, filter, sortDoc, proj, pg); pr != nil {
			pr.Want(pg.FirstBatch())
			return &Command{rc: rc, Point: pr}, nil
		}
	}
	if p.Point != nil {
		p.Point.Want(pg.FirstBatch())
	}
	p.Command = rc.AggregateCommand(pipeline, batchSize, body, extra, forExplain)
	p.Cursor = &point.CursorShape{Ns: rc.NS, MetaField: rc.MetaField, Mode: point.ShapeEvent, Proj: proj, SingleBatch: single, Metas: point.NewMetaResolver(rc)}
	return p, nil
}

// findPipeline is the upstream pipeline of a find: the event filter split
// into its bucket and event parts, the sort, skip and limit.
func findPipeline(rc *query.Ctx, filter, sortDoc bsoncore.Document, pg query.Paging) ([]bsoncore.Document, query.SplitFilter, error) {
	sf, err := rc.Split(filter)
	if err != nil {
		return nil, sf, err
	}
	pipeline := query.EventPipeline(sf, rc.Caps)
	if sortDoc != nil {
		s, err := rc.TranslateSort(sortDoc, "find")
		if err != nil {
			return nil, sf, err
		}
		if s != nil {
			pipeline = append(pipeline, bsonutil.Stage("$sort", bsonutil.DocValue(s)))
		}
	}
	if pg.Skip > 0 {
		pipeline = append(pipeline, bsonutil.Stage("$skip", bsonutil.Int64Value(pg.Skip)))
	}
	if pg.Limit > 0 {
		pipeline = append(pipeline, bsonutil.Stage("$limit", bsonutil.Int64Value(pg.Limit)))
	}
	return pipeline, sf, nil
}

// planCount rewrites count into [..events.., $skip, $limit, $count].
func planCount(rc *query.Ctx, body bsoncore.Document, forExplain bool) (*Command, error) {
	const cmd = "count"
	if err := rc.CheckOptions(body, cmd, "query", "skip", "limit", "fields"); err != nil {
		return nil, err
	}
	filter, err := rc.ReadDoc(body, "query", cmd)
	if err != nil {
		return nil, err
	}
	skip, limit, err := rc.ReadCountPaging(body)
	if err != nil {
		return nil, err
	}
	pg := query.Paging{Skip: skip, Limit: limit}
	// By event _id, from the index; else what the upstream cannot filter
	// on unwound events, counted by the proxy as a find's.
	sf, err := rc.Split(filter)
	pr := point.IDIndexRead(rc, filter, nil, nil, pg)
	if pr == nil && rc.Caps.PackedEvents {
		if pr, err = scanOrRefuse(rc, cmd, filter, nil, nil, pg); err != nil {
			return nil, err
		}
	}
	if pr == nil && err != nil {
		if pr = point.EventScanRead(rc, filter, nil, nil, pg); pr == nil {
			return nil, err
		}
	}
	if pr != nil {
		c := &countDrain{}
		return &Command{rc: rc, Point: pr, PointDrain: c.pointDrain(c.result)}, nil
	}
	pipeline := query.EventPipeline(sf, rc.Caps)
	if skip > 0 {
		pipeline = append(pipeline, bsonutil.Stage("$skip", bsonutil.Int64Value(skip)))
	}
	if limit > 0 {
		pipeline = append(pipeline, bsonutil.Stage("$limit", bsonutil.Int64Value(limit)))
	}
	pipeline = append(pipeline, bsonutil.Stage("$count", bsonutil.StringValue("n")))
	p := &Command{rc: rc, Drain: true, drain: &countDrain{}}
	p.Command = rc.AggregateCommand(pipeline, -1, body, nil, forExplain)
	return p, nil
}

// planDistinct rewrites distinct into an event read whose values the
// proxy collects.
func planDistinct(rc *query.Ctx, body bsoncore.Document, forExplain bool) (*Command, error) {
	const cmd = "distinct"
	if err := rc.CheckOptions(body, cmd, "key", "query"); err != nil {
		return nil, err
	}
	kv, ok := bsonutil.Lookup(body, "key")
	if !ok {
		return nil, rc.BadValue(mongoerr.FailedToParse, "distinct needs a \"key\"")
	}
	key, ok := kv.StringValueOK()
	if !ok {
		return nil, rc.BadValue(mongoerr.TypeMismatch, "distinct \"key\" must be a string, got %s", bsonutil.TypeName(kv.Type))
	}
	if key == "" || strings.HasPrefix(key, "$") || strings.Contains(key, "..") || strings.HasPrefix(key, ".") || strings.HasSuffix(key, ".") {
		return nil, rc.BadValue(mongoerr.BadValue, "distinct \"key\" %q is not a field path", key)
	}
	filter, err := rc.ReadDoc(body, "query", cmd)
	if err != nil {
		return nil, err
	}
	// As a count's: by event _id from the index, or collected by the
	// proxy where the upstream cannot filter.
	sf, err := rc.Split(filter)
	pr := point.IDIndexRead(rc, filter, nil, nil, query.Paging{})
	if pr == nil && rc.Caps.PackedEvents {
		if pr, err = scanOrRefuse(rc, cmd, filter, nil, nil, query.Paging{}); err != nil {
			return nil, err
		}
	}
	if pr == nil && err != nil {
		if pr = point.EventScanRead(rc, filter, nil, nil, query.Paging{}); pr == nil {
			return nil, err
		}
	}
	if pr != nil {
		d := &distinctDrain{path: strings.Split(key, ".")}
		return &Command{rc: rc, Point: pr, PointDrain: d.pointDrain()}, nil
	}
	metas := point.NewMetaResolver(rc)
	p := &Command{rc: rc, Drain: true, metas: metas, bucketFilter: sf.Bucket, drain: &distinctDrain{path: strings.Split(key, "."), metaField: rc.MetaField, metas: metas}}
	p.Command = rc.AggregateCommand(query.EventPipeline(sf, rc.Caps), -1, body, nil, forExplain)
	return p, nil
}

// planExplain explains the rewritten aggregate, so the user sees the
// upstream's plan on the bucket collection.
func planExplain(rc *query.Ctx, body bsoncore.Document, opts Options) (*Command, error) {
	if err := rc.CheckOptions(body, "explain", "verbosity"); err != nil {
		return nil, err
	}
	v, _ := bsonutil.Lookup(body, "explain")
	inner, ok := v.DocumentOK()
	if !ok {
		return nil, rc.BadValue(mongoerr.TypeMismatch, "explain needs a command document")
	}
	elems, _ := inner.Elements()
	if len(elems) == 0 {
		return nil, rc.BadValue(mongoerr.BadValue, "explain of an empty command")
	}
	var ip *Command
	var err error
	switch name := elems[0].Key(); name {
	case "find":
		ip, err = planFind(rc, inner, opts, true)
	case "aggregate":
		ip, err = planAggregate(rc, inner, opts, true)
	case "count":
		ip, err = planCount(rc, inner, true)
	case "distinct":
		ip, err = planDistinct(rc, inner, true)
	default:
		return nil, rc.Unsupported("explain of %q is not supported on a bucketed namespace", name)
	}
	if err != nil {
		return nil, err
	}
	if ip.Point != nil {
		return &Command{rc: rc, Local: ip.Point.Explain(), LocalExplain: ip.Point.ExplainTarget()}, nil
	}
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendDocumentElement(d, "explain", ip.Command)
	d = bsonutil.AppendElems(d, bsonutil.Pick(body, []string{"verbosity"}))
	d = bsonutil.AppendElems(d, bsonutil.Pick(body, query.Carried))
	d = bsoncore.AppendStringElement(d, "$db", rc.Rule.DB)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return &Command{rc: rc, Passthrough: true, Command: d}, nil
}

// Feed takes one upstream reply of a Drain plan and returns the getMore to
// send next, or nil when the plan has all it needs (then call Result).
func (p *Command) Feed(reply []byte) []byte {
	doc := bsoncore.Document(reply)
	if p.drain == nil {
		return nil
	}
	if !mongoerr.IsOK(doc) {
		p.drain = &errorDrain{reply: doc}
		return nil
	}
	cur, err := doc.LookupErr("cursor")
	if err != nil {
		p.drain = &errorDrain{reply: mongoerr.Reply(mongoerr.Errorf(mongoerr.InternalError, "tsproxy rule %s: upstream reply has no cursor", p.rc.NS))}
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
	return query.GetMoreCommand(p.rc, id)
}

// DrainCursor is the upstream cursor a Drain plan left open (after an
// error or a refusal), to be killed; 0 if none.
func (p *Command) Result() []byte {
	if p.drain == nil {
		return mongoerr.Reply(mongoerr.Errorf(mongoerr.InternalError, "not a drained read"))
	}
	return p.drain.result()
}

type errorDrain struct{ reply bsoncore.Document }

func (e *errorDrain) feed(bsoncore.Document) error { return nil }

func (e *errorDrain) result() bsoncore.Document { return e.reply }

type countDrain struct{ n int64 }

// PointDrain is what a count or distinct served by a point read does
// with its events (see Command.PointDrain).
type PointDrain struct {
	take   func(ev bsoncore.Document) error
	result func() bsoncore.Document
	// finish, when set, answers instead of result, after more upstream
	// steps of its own (an aggregation's $out or $merge).
	finish func(x *rewrite.Exec) (bsoncore.Document, error)
	// answer, when set, answers instead of result, with a cursor the
	// proxy holds (named by newID) when the answer takes more than one
	// batch.
	answer func(newID func() int64) rewrite.Result
	// prepare, when set, runs before the read (the collections an
	// aggregation's $lookup joins).
	prepare func(x *rewrite.Exec) error
}

// pointDrain counts the events, answering with reply.
func (c *countDrain) pointDrain(reply func() bsoncore.Document) *PointDrain {
	return &PointDrain{take: func(bsoncore.Document) error { c.n++; return nil }, result: reply}
}

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
	d = query.AppendCount(d, "n", c.n)
	d = bsoncore.AppendDoubleElement(d, "ok", 1)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}
