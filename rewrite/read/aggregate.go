package read

import (
	"errors"
	"strings"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/query"
	"github.com/tsproxy/tsproxy/rewrite/read/point"
)

// planAggregate rewrites an aggregate on the app's namespace. A pipeline
// of $match, $sort, $skip, $limit, then optionally one $count, $project,
// $unset or countDocuments' $group as its last stage, is translated to an
// event read (the leading $match stages feed the bucket-level filter). Any
// other stage needs an upstream that runs full aggregation (MongoDB): the
// events are rebuilt upstream with $replaceWith and the app's pipeline
// runs unchanged after it; elsewhere it is refused by name.
func planAggregate(rc *query.Ctx, body bsoncore.Document, opts Options, forExplain bool) (*Command, error) {
	body, err := point.NaturalAggregate(rc, body)
	if err != nil {
		return nil, err
	}
	a := &aggregateRewrite{rc: rc, body: body, opts: opts, forExplain: forExplain}
	if err := a.readOptions(); err != nil {
		return nil, err
	}
	if opts.Caps.PackedEvents {
		return a.proxyOnly()
	}
	p, err := a.translate()
	if err != nil && mongoerr.CodeOf(err) == mongoerr.NotImplemented {
		// What the event read cannot express, the proxy runs itself over
		// an event scan: an operator the translation does not carry
		// upstream is refused there even on an upstream that runs full
		// aggregation (FerretDB 2.x, MongoDB).
		if ep, eerr := a.engineShaped(); ep != nil || eerr != nil {
			return ep, eerr
		}
	}
	return p, err
}

// translate is the aggregate as an event read (and the stages after it)
// the upstream runs.
func (a *aggregateRewrite) translate() (*Command, error) {
	rc, body, opts, forExplain := a.rc, a.body, a.opts, a.forExplain
	stages, err := pipelineStages(rc, body)
	if err != nil {
		return nil, err
	}
	a.stages = stages
	// countDocuments by event _id: from the index.
	if p := a.countBy(point.IDIndexRead); p != nil {
		return p, nil
	}
	i, err := a.splitLeadingMatches()
	if err != nil {
		// countDocuments of what the upstream cannot filter on unwound
		// events: counted by the proxy.
		if p := a.countBy(point.EventScanRead); p != nil {
			return p, nil
		}
		// A find-shaped pipeline: the proxy runs it as a find.
		if p := a.findShaped(); p != nil {
			return p, nil
		}
		return nil, err
	}
	for ; i < len(stages); i++ {
		if err := a.addStage(i); err == errNeedsFullAggregation && opts.Caps.FullAggregation && !opts.Caps.InexactSums {
			return a.fullAggregate(), nil
		} else if err == errNeedsFullAggregation {
			return nil, a.refusal(i)
		} else if err != nil {
			return nil, err
		}
	}
	p := aggregatePlan(rc, body, a.pipeline, a.batchSize, a.shape, a.explain, forExplain)
	p.bucketFilter = a.split.Bucket
	return p, nil
}

// errNeedsFullAggregation marks a stage the event read cannot express:
// the whole pipeline then runs upstream, where the upstream can.
var errNeedsFullAggregation = errors.New("stage needs full aggregation")

// aggregateRewrite is one aggregate's translation, stage by stage.
type aggregateRewrite struct {
	rc                  *query.Ctx
	body                bsoncore.Document
	opts                Options
	forExplain, explain bool
	batchSize           int64
	stages              []PipelineStage
	split               query.SplitFilter
	pipeline            []bsoncore.Document
	shape               *point.CursorShape
	// last is the stage that ends what the event read can express.
	last string
}

func (a *aggregateRewrite) readOptions() error {
	rc, body := a.rc, a.body
	const cmd = "aggregate"
	if err := rc.CheckOptions(body, cmd, "pipeline", "cursor", "allowDiskUse", "explain", "bypassDocumentValidation"); err != nil {
		return err
	}
	explain, err := bsonutil.Bool(body, "explain", false)
	if err != nil {
		return rc.BadValue(mongoerr.TypeMismatch, "aggregate option \"explain\" must be a boolean")
	}
	a.explain, a.batchSize = explain, -1
	cursor, err := rc.ReadDoc(body, "cursor", cmd)
	if err != nil {
		return err
	}
	if cursor == nil {
		if !explain && !a.forExplain {
			return rc.BadValue(mongoerr.FailedToParse, "The 'cursor' option is required, except for aggregate with the explain argument")
		}
		return nil
	}
	elems, _ := cursor.Elements()
	for _, e := range elems {
		if e.Key() != "batchSize" {
			return rc.Unsupported("aggregate cursor option %q is not supported on a bucketed namespace", e.Key())
		}
	}
	n, has, err := rc.ReadInt(cursor, "batchSize", "aggregate cursor")
	if err != nil {
		return err
	}
	if n < 0 {
		return rc.BadValue(mongoerr.BadValue, "aggregate cursor batchSize must be non-negative")
	}
	if has {
		a.batchSize = n
	}
	return nil
}

// leadingMatches reads the filters of the pipeline's leading $match
// stages and returns the index of the first stage after them.
func (a *aggregateRewrite) leadingMatches() ([]bsoncore.Document, int, error) {
	var filters []bsoncore.Document
	i := 0
	for ; i < len(a.stages) && a.stages[i].Name == "$match"; i++ {
		d, ok := a.stages[i].Value.DocumentOK()
		if !ok {
			return nil, 0, a.rc.BadValue(mongoerr.TypeMismatch, "the match filter must be an expression in an object")
		}
		filters = append(filters, d)
	}
	return filters, i, nil
}

// splitLeadingMatches turns the leading $match stages into the bucket
// filter and the event pipeline's start; it returns the first stage after.
func (a *aggregateRewrite) splitLeadingMatches() (int, error) {
	filters, i, err := a.leadingMatches()
	if err != nil {
		return 0, err
	}
	sf, err := a.rc.Split(query.AndOf(filters))
	if err != nil {
		return 0, err
	}
	a.split = sf
	a.pipeline = query.EventPipeline(sf, a.rc.Caps)
	a.shape = &point.CursorShape{Ns: a.rc.NS, MetaField: a.rc.MetaField, Mode: point.ShapeEvent, Metas: point.NewMetaResolver(a.rc)}
	return i, nil
}

// refusal names the stage an upstream without full aggregation cannot run.
func (a *aggregateRewrite) refusal(i int) error {
	st := a.stages[i]
	switch {
	case a.last != "":
		return a.rc.Unsupported("aggregation stage %q after %q is not supported on a bucketed namespace on this upstream (only $match, $sort, $skip, $limit, then one $count, $project, $unset or count $group as the last stage)", st.Name, a.last)
	case st.Name == "$project" || st.Name == "$unset":
		return a.rc.Unsupported("aggregation stage %q is supported on a bucketed namespace only as the last stage on this upstream", st.Name)
	case st.Name == "$group":
		return a.rc.Unsupported("aggregation stage \"$group\" is supported on a bucketed namespace on this upstream only as a last-stage count ({_id: <constant>, n: {$sum: 1}})")
	}
	return a.rc.Unsupported("aggregation stage %q is not supported on a bucketed namespace on this upstream (FerretDB); supported: $match, $sort, $skip, $limit, and as the last stage $count, $project, $unset, or a count $group", st.Name)
}

// addStage appends stage i's event-read form to the pipeline.
func (a *aggregateRewrite) addStage(i int) error {
	rc, st := a.rc, a.stages[i]
	if a.last != "" {
		return errNeedsFullAggregation
	}
	lastStage := i == len(a.stages)-1
	switch st.Name {
	case "$match":
		d, ok := st.Value.DocumentOK()
		if !ok {
			return rc.BadValue(mongoerr.TypeMismatch, "the match filter must be an expression in an object")
		}
		rc.UsedMeta = false
		t, err := rc.TranslateFilter(d, 1)
		if err != nil {
			return err
		}
		if rc.UsedMeta && !rc.Caps.UnwindKeepsFields {
			return rc.Unsupported("a $match on the metaField %q after other stages is not supported on a bucketed namespace on this upstream (FerretDB)", rc.MetaField)
		}
		a.pipeline = append(a.pipeline, bsonutil.Stage("$match", bsonutil.DocValue(t)))
	case "$sort":
		d, ok := st.Value.DocumentOK()
		if !ok {
			return rc.BadValue(mongoerr.TypeMismatch, "the $sort key specification must be an object")
		}
		s, err := rc.TranslateSort(d, "$sort")
		if err != nil {
			return err
		}
		if s == nil {
			return rc.BadValue(mongoerr.BadValue, "$sort stage must have at least one sort key")
		}
		a.pipeline = append(a.pipeline, bsonutil.Stage("$sort", bsonutil.DocValue(s)))
	case "$skip", "$limit":
		n, ok := bsonutil.WholeNumber(st.Value)
		if !ok || n < 0 || (st.Name == "$limit" && n == 0) {
			return rc.BadValue(mongoerr.BadValue, "%s needs a positive whole number, got %s", st.Name, st.Value.String())
		}
		a.pipeline = append(a.pipeline, bsonutil.Stage(st.Name, bsonutil.Int64Value(n)))
	case "$count":
		name, ok := st.Value.StringValueOK()
		if !ok || name == "" || strings.HasPrefix(name, "$") || strings.Contains(name, ".") || strings.ContainsRune(name, 0) {
			return rc.BadValue(mongoerr.BadValue, "the $count field name must be a non-empty string without '.' or a leading '$'")
		}
		a.pipeline = append(a.pipeline, bsonutil.Stage("$count", bsonutil.StringValue(name)))
		a.shape.Mode = point.ShapeAsIs
	case "$project", "$unset":
		if !lastStage {
			return errNeedsFullAggregation
		}
		spec, err := projectSpec(rc, st)
		if err != nil {
			return err
		}
		proj, err := rc.ParseProjection(spec, "$project")
		if err != nil {
			return err
		}
		a.shape.Proj = proj
	case "$group":
		key, ok := CountGroup(st.Value)
		if !ok || !lastStage {
			return errNeedsFullAggregation
		}
		gid, _ := st.Value.Document().LookupErr("_id")
		a.pipeline = append(a.pipeline, bsonutil.Stage("$count", bsonutil.StringValue(key)))
		a.shape.Mode = point.ShapeGroupCount
		a.shape.GroupID = bsoncore.Value{Type: gid.Type, Data: append([]byte(nil), gid.Data...)}
		a.shape.GroupKey = key
	default:
		return errNeedsFullAggregation
	}
	switch st.Name {
	case "$count", "$project", "$unset", "$group":
		a.last = st.Name
	}
	return nil
}

func aggregatePlan(rc *query.Ctx, body bsoncore.Document, pipeline []bsoncore.Document, batchSize int64, shape *point.CursorShape, explain, forExplain bool) *Command {
	extra := bsonutil.Pick(body, []string{"allowDiskUse"})
	p := &Command{rc: rc, Cursor: shape}
	if explain && !forExplain {
		inner := rc.AggregateCommand(pipeline, batchSize, body, extra, true)
		idx, d := bsoncore.AppendDocumentStart(nil)
		d = bsoncore.AppendDocumentElement(d, "explain", inner)
		d = bsonutil.AppendElems(d, bsonutil.Pick(body, query.Carried))
		d = bsoncore.AppendStringElement(d, "$db", rc.Rule.DB)
		d, _ = bsoncore.AppendDocumentEnd(d, idx)
		p.Command, p.Passthrough, p.Cursor = d, true, nil
		return p
	}
	p.Command = rc.AggregateCommand(pipeline, batchSize, body, extra, forExplain)
	return p
}

// fullAggregate runs the app's pipeline upstream on the events rebuilt
// there: for upstreams with full aggregation only.
func (a *aggregateRewrite) fullAggregate() *Command {
	rc := a.rc
	var pipeline []bsoncore.Document
	if a.split.Bucket != nil {
		pipeline = append(pipeline, bsonutil.Stage("$match", bsonutil.DocValue(a.split.Bucket)))
	}
	pipeline = append(append(pipeline, query.UnwindStages(rc.Caps)...), replaceWithEvent(rc))
	for _, st := range a.stages {
		pipeline = append(pipeline, st.Doc)
	}
	shape := &point.CursorShape{Ns: rc.NS, MetaField: rc.MetaField, Mode: point.ShapeAsIs}
	return aggregatePlan(rc, a.body, pipeline, a.batchSize, shape, a.explain, a.forExplain)
}

// replaceWithEvent rebuilds the event upstream (MongoDB 4.2+):
// {$replaceWith: {$mergeObjects: ["$events", {$cond: [marker missing, {},
// {<metaField>: "$meta"}]}]}}; $mergeObjects keeps the marker's position.
func replaceWithEvent(rc *query.Ctx) bsoncore.Document {
	if rc.MetaField == "" {
		return bsonutil.Stage("$replaceWith", bsonutil.StringValue("$"+bucket.FieldEvents))
	}
	b := bsoncore.NewDocumentBuilder
	a := bsoncore.NewArrayBuilder
	typeOf := b().AppendString("$type", "$"+rc.MarkerPath()).Build()
	eq := b().AppendArray("$eq", a().AppendDocument(typeOf).AppendString("missing").Build()).Build()
	metaDoc := b().AppendString(rc.MetaField, "$"+bucket.FieldMeta).Build()
	cond := b().AppendArray("$cond", a().AppendDocument(eq).AppendDocument(b().Build()).AppendDocument(metaDoc).Build()).Build()
	merge := b().AppendArray("$mergeObjects", a().AppendString("$"+bucket.FieldEvents).AppendDocument(cond).Build()).Build()
	return bsonutil.Stage("$replaceWith", bsonutil.DocValue(merge))
}

type PipelineStage struct {
	Name  string
	Value bsoncore.Value
	Doc   bsoncore.Document
}

func pipelineStages(rc *query.Ctx, body bsoncore.Document) ([]PipelineStage, error) {
	v, ok := bsonutil.Lookup(body, "pipeline")
	if !ok {
		return nil, rc.BadValue(mongoerr.FailedToParse, "aggregate needs a \"pipeline\"")
	}
	arr, ok := v.ArrayOK()
	if !ok {
		return nil, rc.BadValue(mongoerr.TypeMismatch, "aggregate \"pipeline\" must be an array, got %s", bsonutil.TypeName(v.Type))
	}
	vals, err := arr.Values()
	if err != nil {
		return nil, rc.BadValue(mongoerr.InvalidBSON, "pipeline is not valid BSON: %v", err)
	}
	out := make([]PipelineStage, 0, len(vals))
	for i, item := range vals {
		d, ok := item.DocumentOK()
		if !ok {
			return nil, rc.BadValue(mongoerr.TypeMismatch, "pipeline stage %d must be a document", i)
		}
		elems, err := d.Elements()
		if err != nil || len(elems) != 1 {
			return nil, rc.BadValue(mongoerr.BadValue, "a pipeline stage specification object must contain exactly one field (stage %d)", i)
		}
		out = append(out, PipelineStage{Name: elems[0].Key(), Value: elems[0].Value(), Doc: d})
	}
	return out, nil
}

// projectSpec is a $project's document, or $unset's fields as an
// exclusion projection.
func projectSpec(rc *query.Ctx, st PipelineStage) (bsoncore.Document, error) {
	if st.Name == "$project" {
		d, ok := st.Value.DocumentOK()
		if !ok {
			return nil, rc.BadValue(mongoerr.TypeMismatch, "$project specification must be an object")
		}
		return d, nil
	}
	var names []string
	if s, ok := st.Value.StringValueOK(); ok {
		names = []string{s}
	} else if arr, ok := st.Value.ArrayOK(); ok {
		vals, _ := arr.Values()
		for _, v := range vals {
			s, ok := v.StringValueOK()
			if !ok {
				return nil, rc.BadValue(mongoerr.BadValue, "$unset specification must be a string or an array of strings")
			}
			names = append(names, s)
		}
	}
	if len(names) == 0 {
		return nil, rc.BadValue(mongoerr.BadValue, "$unset specification must be a string or a non-empty array of strings")
	}
	b := bsoncore.NewDocumentBuilder()
	for _, n := range names {
		b.AppendInt32(n, 0)
	}
	return b.Build(), nil
}

// CountGroup recognises {_id: <constant>, <key>: {$sum: 1}}, the stage
// drivers end countDocuments with, and returns key.
func CountGroup(v bsoncore.Value) (string, bool) {
	d, ok := v.DocumentOK()
	if !ok {
		return "", false
	}
	elems, err := d.Elements()
	if err != nil || len(elems) != 2 || elems[0].Key() != "_id" {
		return "", false
	}
	id := elems[0].Value()
	switch id.Type {
	case bsoncore.TypeInt32, bsoncore.TypeInt64, bsoncore.TypeDouble, bsoncore.TypeNull, bsoncore.TypeBoolean:
	case bsoncore.TypeString:
		if s := id.StringValue(); strings.HasPrefix(s, "$") {
			return "", false
		}
	default:
		return "", false
	}
	key := elems[1].Key()
	if key == "" || strings.HasPrefix(key, "$") || strings.Contains(key, ".") {
		return "", false
	}
	acc, ok := elems[1].Value().DocumentOK()
	if !ok {
		return "", false
	}
	ae, err := acc.Elements()
	if err != nil || len(ae) != 1 || ae[0].Key() != "$sum" {
		return "", false
	}
	// {$sum: 1} as an int32 alone (countDocuments' form): the count it
	// is answered with is an int32, and MongoDB's $sum of 1.0 or
	// NumberLong(1) is a double or a long.
	n, ok := ae[0].Value().Int32OK()
	return key, ok && n == 1
}
