package rewrite

import (
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// CollStatsPlan answers collStats on the app's namespace from the bucket
// collection: the upstream's statistics of the buckets, with ns the app's,
// count the number of events, and tsproxy: {bucketCollection, buckets}.
type CollStatsPlan struct {
	// Stats is collStats on the bucket collection.
	Stats []byte
	// Count counts the events: an aggregate summing the buckets' counts;
	// CountFallback unwinds and counts (for upstreams without $group $sum).
	Count, CountFallback []byte
	rc                   *readCtx
}

// PlanCollStats rewrites a collStats command.
func PlanCollStats(body []byte, rule *rules.Rule) (*CollStatsPlan, error) {
	rc, err := newReadCtx(rule)
	if err != nil {
		return nil, err
	}
	doc := bsoncore.Document(body)
	if err := doc.Validate(); err != nil {
		return nil, rc.badValue(CodeInvalidBSON, "collStats is not valid BSON: %v", err)
	}
	if err := rc.checkOptions(doc, "collStats", "scale", "verbose"); err != nil {
		return nil, err
	}
	b := bsoncore.NewDocumentBuilder().AppendString("collStats", rule.BucketCollection)
	for _, e := range lookupElements(doc, []string{"scale", "verbose", "comment", "lsid", "$readPreference", "$clusterTime", "apiVersion", "apiStrict", "apiDeprecationErrors"}) {
		b.AppendValue(e.Key(), e.Value())
	}
	p := &CollStatsPlan{rc: rc, Stats: b.AppendString("$db", rule.DB).Build()}
	nb := bsoncore.NewDocumentBuilder
	group := nb().AppendDocument("$group", nb().AppendNull("_id").
		AppendDocument("n", nb().AppendString("$sum", "$"+rules.BucketCount).Build()).Build()).Build()
	p.Count = rc.aggregateCommand([]bsoncore.Document{group}, -1, doc, nil, false)
	p.CountFallback = rc.aggregateCommand([]bsoncore.Document{unwindStage(), stage("$count", stringValue("n"))}, -1, doc, nil, false)
	return p, nil
}

// CountFrom reads the event count from the reply to Count or
// CountFallback; ok is false when the upstream refused it.
func (p *CollStatsPlan) CountFrom(reply []byte) (int64, bool) {
	doc := bsoncore.Document(reply)
	if doc.Validate() != nil || !replyOK(doc) {
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

// Reply maps the bucket collection's statistics to the app's namespace.
// count < 0: unknown (left as the upstream's bucket count).
func (p *CollStatsPlan) Reply(stats []byte, count int64) []byte {
	doc := bsoncore.Document(stats)
	if doc.Validate() != nil || !replyOK(doc) {
		return stats
	}
	elems, _ := doc.Elements()
	var buckets bsoncore.Value
	idx, out := bsoncore.AppendDocumentStart(nil)
	for _, e := range elems {
		switch e.Key() {
		case "ns":
			out = bsoncore.AppendStringElement(out, "ns", p.rc.ns)
		case "count":
			buckets = e.Value()
			if count >= 0 {
				out = appendCount(out, "count", count)
			} else {
				out = append(out, e...)
			}
		case "ok":
			ts := bsoncore.NewDocumentBuilder().
				AppendString("bucketCollection", p.rc.rule.BucketNamespace())
			if buckets.Type != 0 {
				ts.AppendValue("buckets", buckets)
			}
			out = bsoncore.AppendDocumentElement(out, "tsproxy", ts.Build())
			out = append(out, e...)
		default:
			out = append(out, e...)
		}
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return out
}

// PlanDrop rewrites drop of the app's namespace into drop of the bucket
// collection.
func PlanDrop(body []byte, rule *rules.Rule) ([]byte, error) {
	return renameTarget(body, rule, "drop", "drop")
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
	elems, _ := doc.Elements()
	idx, out := bsoncore.AppendDocumentStart(nil)
	for _, e := range elems {
		if e.Key() == "ns" {
			out = bsoncore.AppendStringElement(out, "ns", rule.Namespace)
			continue
		}
		out = append(out, e...)
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return out
}
