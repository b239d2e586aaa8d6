package read

import (
	"slices"
	"strings"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/agg"
	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/cursor"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/query"
	"github.com/tsproxy/tsproxy/rewrite/read/point"
)

// The aggregates the proxy runs itself, over the events of one of its own
// reads (an event scan, an event-id index read): count-shaped and
// find-shaped pipelines whose filter the upstream cannot run on unwound
// events, or that name event _ids.

// countBy plans a count-shaped pipeline, [$match...] [$skip] [$limit]
// then a count $group or $count (what drivers send for countDocuments),
// as a read of the proxy's own (an event scan, an index read) that it
// counts; nil when the pipeline has another shape or read cannot serve
// the filter.
func (a *aggregateRewrite) countBy(read func(rc *query.Ctx, filter, sortDoc bsoncore.Document, proj *query.Projection, pg query.Paging) *point.PointRead) *Command {
	filters, i, err := a.leadingMatches()
	if err != nil {
		return nil
	}
	var skip, limit int64
	for ; i < len(a.stages)-1; i++ {
		n, ok := bsonutil.WholeNumber(a.stages[i].Value)
		switch {
		case !ok || n < 0:
			return nil
		case a.stages[i].Name == "$skip" && limit == 0:
			skip += n
		case a.stages[i].Name == "$limit" && n > 0:
			if limit == 0 || n < limit {
				limit = n
			}
		default:
			return nil
		}
	}
	if i != len(a.stages)-1 {
		return nil
	}
	last := a.stages[i]
	var id bsoncore.Value
	var key string
	switch last.Name {
	case "$count":
		k, ok := last.Value.StringValueOK()
		if !ok || k == "" || strings.HasPrefix(k, "$") || strings.Contains(k, ".") {
			return nil
		}
		key = k
	case "$group":
		k, ok := CountGroup(last.Value)
		if !ok {
			return nil
		}
		v := last.Value.Document().Lookup("_id")
		key, id = k, bsoncore.Value{Type: v.Type, Data: slices.Clone(v.Data)} // outlives the request
	default:
		return nil
	}
	pr := read(a.rc, query.AndOf(filters), nil, nil, query.Paging{Skip: skip, Limit: limit})
	if pr == nil {
		return nil
	}
	ns := a.rc.NS
	c := &countDrain{}
	reply := func() bsoncore.Document {
		n := c.n
		var batch []bsoncore.Document
		if n > 0 { // no input, no group: an empty batch, as from the server
			idx, d := bsoncore.AppendDocumentStart(nil)
			if id.Type != 0 {
				d = bsoncore.AppendValueElement(d, "_id", id)
			}
			d = query.AppendCount(d, key, n)
			d, _ = bsoncore.AppendDocumentEnd(d, idx)
			batch = append(batch, d)
		}
		return cursor.Reply{Key: "firstBatch", Batch: batch, NS: ns}.WithID(0)
	}
	return &Command{rc: a.rc, Point: pr, PointDrain: c.pointDrain(reply)}
}

// findShaped plans a pipeline a find can express, [$match...] [$sort]
// [$skip] [$limit] [$project or $unset], as an event scan the proxy runs
// (for a filter the upstream cannot run on unwound events: the metaField
// inside $or or $nor); nil for any other pipeline, or one the scan cannot
// serve.
func (a *aggregateRewrite) findShaped() *Command {
	if a.explain {
		return nil
	}
	filters, i, err := a.leadingMatches()
	if err != nil {
		return nil
	}
	var sortDoc bsoncore.Document
	if i < len(a.stages) && a.stages[i].Name == "$sort" {
		d, ok := a.stages[i].Value.DocumentOK()
		if !ok {
			return nil
		}
		sortDoc = d
		i++
	}
	pg := query.Paging{BatchSize: a.batchSize}
	for _, name := range []string{"$skip", "$limit"} {
		if i < len(a.stages) && a.stages[i].Name == name {
			n, ok := bsonutil.WholeNumber(a.stages[i].Value)
			if !ok || n < 0 || (name == "$limit" && n == 0) {
				return nil
			}
			if name == "$skip" {
				pg.Skip = n
			} else {
				pg.Limit = n
			}
			i++
		}
	}
	var proj *query.Projection
	if i == len(a.stages)-1 && (a.stages[i].Name == "$project" || a.stages[i].Name == "$unset") {
		spec, err := projectSpec(a.rc, a.stages[i])
		if err != nil {
			return nil
		}
		if proj, err = a.rc.ParseProjection(spec, a.stages[i].Name); err != nil {
			return nil
		}
		i++
	}
	if i != len(a.stages) {
		return nil
	}
	pr := point.EventScanRead(a.rc, query.AndOf(filters), sortDoc, proj, pg)
	if pr == nil {
		return nil
	}
	pr.Want(pg.FirstBatch())
	return &Command{rc: a.rc, Point: pr}
}

// proxyOnly plans an aggregate on an upstream that cannot see the events
// (caps.Upstream.PackedEvents): a count by event _id from the index, a
// find-shaped pipeline as the proxy's find, any other by the proxy's
// engine over an event scan. Its explain is the scan's.
func (a *aggregateRewrite) proxyOnly() (*Command, error) {
	stages, err := pipelineStages(a.rc, a.body)
	if err != nil {
		return nil, err
	}
	a.stages = stages
	if p := a.countBy(point.IDIndexRead); p != nil {
		return p, nil
	}
	if p := a.countBy(point.EventScanRead); p != nil {
		return p, nil
	}
	if p := a.findShaped(); p != nil {
		return p, nil
	}
	filters, _, err := a.leadingMatches()
	if err != nil {
		return nil, err
	}
	if a.explain || a.forExplain {
		pr, err := scanOrRefuse(a.rc, "aggregate", query.AndOf(filters), nil, nil, query.Paging{})
		if err != nil {
			return nil, err
		}
		return &Command{rc: a.rc, Point: pr}, nil
	}
	p, err := a.engineShaped()
	if p == nil && err == nil {
		_, err = scanOrRefuse(a.rc, "aggregate", query.AndOf(filters), nil, nil, query.Paging{})
	}
	return p, err
}

// engineShaped plans a pipeline the upstream cannot run as the proxy's
// own aggregation (rewrite/agg): an event scan of the leading $match
// stages' filter, every event it yields pushed through the rest of the
// pipeline, the output answered in batches from a cursor the proxy holds
// (or written by a last $out or $merge stage). It returns nil, nil when
// the event scan cannot serve the filter (the caller's refusal stands),
// and the engine's error, which names the stage or operator, when the
// engine does not run the rest.
func (a *aggregateRewrite) engineShaped() (*Command, error) {
	if a.explain || a.forExplain {
		return nil, nil
	}
	filters, i, err := a.leadingMatches()
	if err != nil {
		return nil, nil
	}
	filters, i = scanMatches(filters, i)
	rest := a.stages[i:]
	var output *agg.Output
	if n := len(rest); n > 0 && (rest[n-1].Name == "$out" || rest[n-1].Name == "$merge") {
		if output, err = agg.ReadOutput(rest[n-1].Name, rest[n-1].Value, a.rc.Rule.DB); err != nil {
			return nil, mongoerr.Errorf(mongoerr.CodeOf(err), "tsproxy rule %s: %s", a.rc.NS, err.Error())
		}
		if err := a.checkOutputTarget(output); err != nil {
			return nil, err
		}
		rest = rest[:n-1]
	}
	stages := make([]agg.Stage, 0, len(rest))
	for _, st := range rest {
		// The compiled pipeline outlives the request's buffer.
		stages = append(stages, agg.Stage{Name: st.Name, Value: bsoncore.Value{Type: st.Value.Type, Data: slices.Clone(st.Value.Data)}})
	}
	var foreign *agg.Foreign
	froms := agg.ForeignCollections(stages)
	for _, from := range froms {
		if a.isBucketed(a.rc.Rule.DB, from) {
			return nil, a.rc.Unsupported("$lookup from %s.%s, a bucketed namespace (or its buckets), is not supported", a.rc.Rule.DB, from)
		}
	}
	if len(froms) > 0 {
		foreign = &agg.Foreign{Docs: map[string][]bsoncore.Document{}}
	}
	p, err := agg.Compile(stages, agg.Options{MaxMemory: a.opts.AggregateMemory, Foreign: foreign})
	if err != nil {
		return nil, mongoerr.Errorf(mongoerr.CodeOf(err), "tsproxy rule %s: %s", a.rc.NS, err.Error())
	}
	// The engine reads whole buckets even where the upstream's $unwind
	// would serve event reads (the scan is otherwise kept for upstreams
	// whose $unwind drops the meta).
	scanRC := *a.rc
	scanRC.Caps.UnwindKeepsFields = false
	pr := point.EventScanRead(&scanRC, query.AndOf(filters), nil, nil, query.Paging{})
	if pr == nil {
		return nil, nil
	}
	ns := a.rc.NS
	take := func(ev bsoncore.Document) error {
		if err := p.Push(ev); err != nil {
			return err // the scan stops; the client gets the error
		}
		if p.Done() {
			return errEnough
		}
		return nil
	}
	d := &PointDrain{take: take}
	if foreign != nil {
		db, budget := a.rc.Rule.DB, a.opts.AggregateMemory
		d.prepare = func(x *rewrite.Exec) error { return readForeign(x, db, froms, foreign, budget) }
	}
	batchSize := a.batchSize
	d.answer = func(newID func() int64) rewrite.Result {
		docs, err := p.Finish()
		if err != nil {
			return rewrite.Result{Reply: mongoerr.Reply(err)}
		}
		return point.HeldResult(docs, ns, batchSize, newID)
	}
	if output != nil {
		maxUpdates := a.opts.Caps.MaxUpdateStatements
		d.finish = func(x *rewrite.Exec) (bsoncore.Document, error) {
			docs, err := p.Finish()
			if err != nil {
				return nil, err
			}
			return writeOutput(x, output, docs, ns, maxUpdates)
		}
	}
	return &Command{rc: a.rc, Point: pr, PointDrain: d}, nil
}

// scanMatches are the leading $match filters the event scan takes: those
// before the first one with a top-level $expr, which the engine
// evaluates from there on (the scan's query language has no $expr).
func scanMatches(filters []bsoncore.Document, end int) ([]bsoncore.Document, int) {
	for k, f := range filters {
		if _, err := f.LookupErr("$expr"); err == nil {
			return filters[:k], end - len(filters) + k
		}
	}
	return filters, end
}
