package admin

import (
	"strings"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/cursor"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/query"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// CollStatsPlan answers collStats on the app's namespace from the bucket
// collection: the upstream's statistics of the buckets, with ns the app's,
// count the number of events, and tsproxy: {bucketCollection, buckets}.
// It answers an aggregate that begins with $collStats (mongosh's stats(),
// dataSize(), totalIndexSize() ...) the same way, document by document.
type CollStatsPlan struct {
	// Stats is collStats, or the client's aggregate, on the bucket
	// collection.
	Stats []byte
	// Count counts the events: an aggregate summing the buckets' counts;
	// CountFallback unwinds and counts (for upstreams without $group $sum).
	Count, CountFallback []byte
	rc                   *query.Ctx
	stage                bool // an aggregate with $collStats, not the command
}

// BeginsWithCollStats reports whether body is an aggregate whose first
// stage is $collStats.
func BeginsWithCollStats(body []byte) bool {
	doc := bsoncore.Document(body)
	if cmd, err := doc.IndexErr(0); err != nil || cmd.Key() != "aggregate" {
		return false
	}
	v, ok := bsonutil.Lookup(doc, "pipeline")
	if !ok {
		return false
	}
	arr, ok := v.ArrayOK()
	if !ok {
		return false
	}
	first, err := arr.IndexErr(0)
	if err != nil {
		return false
	}
	st, ok := first.DocumentOK()
	if !ok {
		return false
	}
	e, err := st.IndexErr(0)
	return err == nil && e.Key() == "$collStats"
}

// PlanCollStats rewrites a collStats command, or an aggregate that begins
// with $collStats.
func PlanCollStats(body []byte, rule *rules.Rule) (*CollStatsPlan, error) {
	rc, err := query.NewCtx(rule)
	if err != nil {
		return nil, err
	}
	doc := bsoncore.Document(body)
	if err := doc.Validate(); err != nil {
		return nil, rc.BadValue(mongoerr.InvalidBSON, "collStats is not valid BSON: %v", err)
	}
	p := &CollStatsPlan{rc: rc, stage: BeginsWithCollStats(body)}
	if p.stage {
		if p.Stats, err = planCollStatsStage(rc, doc); err != nil {
			return nil, err
		}
	} else {
		if err := rc.CheckOptions(doc, "collStats", "scale", "verbose"); err != nil {
			return nil, err
		}
		b := bsoncore.NewDocumentBuilder().AppendString("collStats", rule.BucketCollection)
		for _, e := range bsonutil.Pick(doc, []string{"scale", "verbose", "comment", "lsid", "$readPreference", "$clusterTime", "apiVersion", "apiStrict", "apiDeprecationErrors"}) {
			b.AppendValue(e.Key(), e.Value())
		}
		p.Stats = b.AppendString("$db", rule.DB).Build()
	}
	nb := bsoncore.NewDocumentBuilder
	group := nb().AppendDocument("$group", nb().AppendNull("_id").
		AppendDocument("n", nb().AppendString("$sum", "$"+bucket.FieldCount).Build()).Build()).Build()
	p.Count = rc.AggregateCommand([]bsoncore.Document{group}, -1, doc, nil, false)
	p.CountFallback = rc.AggregateCommand(append(query.UnwindStages(rc.Caps), bsonutil.Stage("$count", bsonutil.StringValue("n"))), -1, doc, nil, false)
	return p, nil
}

// CountFrom reads the event count from the reply to Count or
// CountFallback; ok is false when the upstream refused it.
func (p *CollStatsPlan) CountFrom(reply []byte) (int64, bool) {
	doc := bsoncore.Document(reply)
	if doc.Validate() != nil || !mongoerr.IsOK(doc) {
		return 0, false
	}
	v, err := doc.LookupErr("cursor", "firstBatch")
	if err != nil {
		return 0, false
	}
	arr, ok := v.ArrayOK()
	if !ok {
		return 0, false
	}
	vals, _ := arr.Values()
	if len(vals) == 0 {
		return 0, true
	}
	d, ok := vals[0].DocumentOK()
	if !ok {
		return 0, false
	}
	n, err := d.LookupErr("n")
	if err != nil {
		return 0, false
	}
	return n.AsInt64OK()
}

// planCollStatsStage sends the client's aggregate to the bucket
// collection. Its documents are the bucket collection's statistics, which
// are the namespace's but for ns and the document count, which Reply maps;
// a later stage that read either would compute from the bucket figures,
// so such a pipeline is refused.
func planCollStatsStage(rc *query.Ctx, doc bsoncore.Document) ([]byte, error) {
	arr, _ := doc.Lookup("pipeline").ArrayOK()
	stages, err := arr.Values()
	if err != nil {
		return nil, rc.BadValue(mongoerr.InvalidBSON, "aggregate pipeline is not valid BSON: %v", err)
	}
	for _, st := range stages[1:] {
		if d, ok := st.DocumentOK(); ok && readsCountOrNS(d) {
			return nil, rc.Unsupported("a stage after $collStats that reads \"count\" or \"ns\" is not supported on a bucketed namespace "+
				"(the upstream's statistics are those of the bucket collection %s; the proxy maps them only in $collStats's own output): run $collStats alone", rc.Rule.BucketNamespace())
		}
	}
	renamed, err := query.RenameTarget(doc, rc.Rule, "aggregate", "aggregate")
	if err != nil {
		return nil, err
	}
	// The proxy keeps no cursor for this aggregate and maps the first batch
	// only, so the client's batchSize (0 would leave everything for a
	// getMore) is not passed on: the server's default first batch holds
	// $collStats's output, one document per shard.
	return bsonutil.ReplaceField(renamed, "cursor", func(dst []byte) []byte {
		return bsoncore.AppendDocumentElement(dst, "cursor", bsoncore.NewDocumentBuilder().Build())
	}), nil
}

// readsCountOrNS reports whether a stage names a field "count" or "ns"
// anywhere: in a key or in a field path ("$storageStats.count").
func readsCountOrNS(d bsoncore.Document) bool {
	named := func(path string) bool {
		for _, seg := range strings.Split(strings.TrimLeft(path, "$"), ".") {
			if seg == "count" || seg == "ns" {
				return true
			}
		}
		return false
	}
	elems, _ := d.Elements()
	for _, e := range elems {
		if named(e.Key()) {
			return true
		}
		v := e.Value()
		switch v.Type {
		case bsoncore.TypeString:
			if str := v.StringValue(); strings.HasPrefix(str, "$") && named(str) {
				return true
			}
		case bsoncore.TypeEmbeddedDocument, bsoncore.TypeArray:
			if readsCountOrNS(v.Data) {
				return true
			}
		}
	}
	return false
}

// Reply maps the bucket collection's statistics to the app's namespace.
// count < 0: unknown (left as the upstream's bucket count).
func (p *CollStatsPlan) Reply(stats []byte, count int64) []byte {
	doc := bsoncore.Document(stats)
	if doc.Validate() != nil || !mongoerr.IsOK(doc) {
		return stats
	}
	if p.stage {
		return p.stageReply(doc, count)
	}
	elems, _ := doc.Elements()
	var buckets bsoncore.Value
	idx, out := bsoncore.AppendDocumentStart(nil)
	for _, e := range elems {
		switch e.Key() {
		case "ns":
			out = bsoncore.AppendStringElement(out, "ns", p.rc.NS)
		case "count":
			buckets = e.Value()
			if count >= 0 {
				out = appendCountAs(out, "count", count, e.Value().Type)
			} else {
				out = append(out, e...)
			}
		case "ok":
			ts := bsoncore.NewDocumentBuilder().
				AppendString("bucketCollection", p.rc.Rule.BucketNamespace())
			if buckets.Type != 0 {
				ts.AppendValue("buckets", buckets)
			}
			out = bsoncore.AppendDocumentElement(out, "tsproxy", ts.Build())
			if native := p.timeseriesStats(buckets, doc.Lookup("size")); native != nil {
				out = bsoncore.AppendDocumentElement(out, "timeseries", native)
			}
			out = append(out, e...)
		default:
			out = append(out, e...)
		}
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return out
}

// stageReply maps the reply to a $collStats aggregate: the cursor's and
// each document's ns become the app's, and the document counts
// (storageStats.count, and the top-level count that $collStats's count
// option gives) the number of events. A result that did not fit the first
// batch (later stages multiplying documents) is refused: the proxy holds
// no cursor to serve the rest from.
func (p *CollStatsPlan) stageReply(doc bsoncore.Document, count int64) []byte {
	mapDoc := func(d bsoncore.Document) bsoncore.Document {
		elems, _ := d.Elements()
		idx, out := bsoncore.AppendDocumentStart(nil)
		for _, e := range elems {
			switch {
			case e.Key() == "ns" && e.Value().Type == bsoncore.TypeString:
				out = bsoncore.AppendStringElement(out, "ns", p.rc.NS)
			case e.Key() == "count" && count >= 0 && bsonutil.IsNumber(e.Value().Type):
				out = appendCountAs(out, "count", count, e.Value().Type)
			case e.Key() == "storageStats" && count >= 0 && e.Value().Type == bsoncore.TypeEmbeddedDocument:
				storage := e.Value().Document()
				buckets := storage.Lookup("count")
				stats := bsonutil.ReplaceField(storage, "count", func(dst []byte) []byte { return appendCountAs(dst, "count", count, buckets.Type) })
				if native := p.timeseriesStats(buckets, storage.Lookup("size")); native != nil {
					stats = bsonutil.AppendField(stats, "timeseries", bsoncore.Value{Type: bsoncore.TypeEmbeddedDocument, Data: native})
				}
				out = bsoncore.AppendDocumentElement(out, "storageStats", stats)
			default:
				out = append(out, e...)
			}
		}
		out, _ = bsoncore.AppendDocumentEnd(out, idx)
		return out
	}
	cur, ok := doc.Lookup("cursor").DocumentOK()
	if !ok {
		return doc
	}
	if id, _ := cur.Lookup("id").AsInt64OK(); id != 0 {
		return mongoerr.Reply(p.rc.Unsupported("a $collStats aggregate whose result does not fit one batch is not supported on a bucketed namespace"))
	}
	var batch []bsoncore.Document
	for _, key := range []string{"firstBatch", "nextBatch"} {
		arr, ok := cur.Lookup(key).ArrayOK()
		if !ok {
			continue
		}
		vals, _ := arr.Values()
		for _, v := range vals {
			if d, ok := v.DocumentOK(); ok {
				batch = append(batch, mapDoc(d))
			}
		}
		return cursor.Reply{Key: key, Batch: batch, NS: p.rc.NS}.WithID(0)
	}
	return doc
}

// timeseriesStats is the "timeseries" statistics MongoDB gives a
// time-series collection (the events layout), from what the upstream
// says of the bucket collection: bucketsNs, bucketCount and
// avgBucketSize. nil for the other layouts, or without a bucket count.
// MongoDB's counters of its own bucket catalog (numBucketInserts, ...)
// have no counterpart here and are left out.
func (p *CollStatsPlan) timeseriesStats(buckets, size bsoncore.Value) bsoncore.Document {
	rule := p.rc.Rule
	if rule.Layout != rules.LayoutEvents && rule.Layout != "" {
		return nil
	}
	n, ok := buckets.AsInt64OK()
	if !ok {
		return nil
	}
	b := bsoncore.NewDocumentBuilder().
		AppendString("bucketsNs", rule.BucketNamespace()).
		AppendValue("bucketCount", buckets)
	if bytes, ok := size.AsInt64OK(); ok && n > 0 {
		b.AppendInt64("avgBucketSize", bytes/n)
	} else if n == 0 {
		b.AppendInt64("avgBucketSize", 0)
	}
	return b.Build()
}

// PlanDrop rewrites drop of the app's namespace into drop of the bucket
// collection.
func PlanDrop(body []byte, rule *rules.Rule) ([]byte, error) {
	return query.RenameTarget(body, rule, "drop", "drop")
}

// DropReply maps a drop reply's ns to the app's namespace.
func DropReply(reply []byte, rule *rules.Rule) []byte {
	doc := bsoncore.Document(reply)
	if doc.Validate() != nil {
		return reply
	}
	if _, err := doc.LookupErr("ns"); err != nil {
		return reply
	}
	return bsonutil.ReplaceField(doc, "ns", func(dst []byte) []byte {
		return bsoncore.AppendStringElement(dst, "ns", rule.Namespace)
	})
}

// appendCountAs appends the number of events n in the BSON type of the
// bucket count it replaces, which is the type the same upstream gives a
// plain collection's count (an int64 on FerretDB).
func appendCountAs(dst []byte, key string, n int64, like bsoncore.Type) []byte {
	switch like {
	case bsoncore.TypeInt64:
		return bsoncore.AppendInt64Element(dst, key, n)
	case bsoncore.TypeDouble:
		return bsoncore.AppendDoubleElement(dst, key, float64(n))
	}
	return query.AppendCount(dst, key, n)
}
