package fanout

import (
	"math"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/query"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// PartitionReadRefusal is the error for a read the proxy cannot answer
// across the partitions it spans.
func PartitionReadRefusal(rule *rules.Rule, what string, n int) error {
	return query.RuleErrorf(rule, mongoerr.NotImplemented, "%s is not supported on a read spanning %d partitions (partitionBy %s); bound it in time within one partition", what, n, rule.PartitionBy)
}

// PartitionTimeRange reads the time bounds of a read's event filter (find
// filter, count and distinct query, an aggregate's leading $match): the
// instants [from, to] (ms, inclusive: $lt X is X-1) its events can have, from the
// timeField's date comparisons at the top level or in a top-level $and.
// Without bounds it is [MinInt64, MaxInt64]; a partition that holds no
// window overlapping it need not be read.
func PartitionTimeRange(body []byte, rule *rules.Rule) (from, to int64) {
	from, to = math.MinInt64, math.MaxInt64
	doc := bsoncore.Document(body)
	elems, err := doc.Elements()
	if err != nil || len(elems) == 0 {
		return from, to
	}
	var filter bsoncore.Document
	switch elems[0].Key() {
	case "find":
		filter, _ = doc.Lookup("filter").DocumentOK()
	case "count", "distinct":
		filter, _ = doc.Lookup("query").DocumentOK()
	case "aggregate":
		if arr, ok := doc.Lookup("pipeline").ArrayOK(); ok {
			if v, err := arr.IndexErr(0); err == nil {
				if first, ok := v.DocumentOK(); ok {
					filter, _ = first.Lookup("$match").DocumentOK()
				}
			}
		}
	}
	narrowTime(filter, rule.TimeField, &from, &to)
	return from, to
}

// ReadTimeEnd is the latest instant (ms, inclusive) an event a read
// returns or counts can have, from PartitionTimeRange, when the read
// looks at nothing else of the rule's events: a find, count or distinct,
// or an aggregate without a stage that reads a namespace again ($lookup,
// $unionWith, $graphLookup) or one whose sub-pipelines this does not
// look into ($facet), on the rule's own namespace (not its rollups'). ok
// is false for any other command, and for a read without such a bound.
func ReadTimeEnd(body []byte, rule *rules.Rule) (to int64, ok bool) {
	doc := bsoncore.Document(body)
	elems, err := doc.Elements()
	if err != nil || len(elems) == 0 {
		return 0, false
	}
	if coll, ok := elems[0].Value().StringValueOK(); !ok || coll != rule.Collection {
		return 0, false
	}
	if db, ok := doc.Lookup("$db").StringValueOK(); !ok || db != rule.DB {
		return 0, false
	}
	switch elems[0].Key() {
	case "find", "count", "distinct":
	case "aggregate":
		if !pipelineReadsOnce(doc) {
			return 0, false
		}
	default:
		return 0, false
	}
	_, to = PartitionTimeRange(body, rule)
	return to, to != math.MaxInt64
}

// pipelineReadsOnce says whether an aggregate's pipeline reads its own
// namespace only, once, through its first stage: a well-formed pipeline
// without $lookup, $unionWith, $graphLookup or $facet.
func pipelineReadsOnce(doc bsoncore.Document) bool {
	arr, ok := doc.Lookup("pipeline").ArrayOK()
	if !ok {
		return false
	}
	stages, err := arr.Values()
	if err != nil {
		return false
	}
	for _, v := range stages {
		st, ok := v.DocumentOK()
		if !ok {
			return false
		}
		es, err := st.Elements()
		if err != nil || len(es) != 1 {
			return false
		}
		switch es[0].Key() {
		case "$lookup", "$unionWith", "$graphLookup", "$facet":
			return false
		}
	}
	return true
}

func narrowTime(filter bsoncore.Document, timeField string, from, to *int64) {
	elems, err := filter.Elements()
	if err != nil {
		return
	}
	for _, e := range elems {
		switch e.Key() {
		case "$and":
			arr, _ := e.Value().ArrayOK()
			vals, _ := arr.Values()
			for _, v := range vals {
				if d, ok := v.DocumentOK(); ok {
					narrowTime(d, timeField, from, to)
				}
			}
		case timeField:
			if ms, ok := e.Value().DateTimeOK(); ok {
				*from, *to = max(*from, ms), min(*to, ms)
				continue
			}
			ops, ok := e.Value().DocumentOK()
			if !ok {
				continue
			}
			oe, _ := ops.Elements()
			for _, op := range oe {
				ms, ok := op.Value().DateTimeOK()
				if !ok {
					continue
				}
				// Dates are whole milliseconds: ts < X is ts <= X-1.
				switch op.Key() {
				case "$eq":
					*from, *to = max(*from, ms), min(*to, ms)
				case "$gte":
					*from = max(*from, ms)
				case "$gt":
					if ms < math.MaxInt64 {
						*from = max(*from, ms+1)
					}
				case "$lte":
					*to = min(*to, ms)
				case "$lt":
					if ms > math.MinInt64 {
						*to = min(*to, ms-1)
					}
				}
			}
		}
	}
}

// PartitionOverlaps reports whether the partition starting at start (ms)
// can hold events in [from, to] (PartitionTimeRange): its windows start
// within the period, so hold events from the period start to the last
// window's end.
func PartitionOverlaps(rule *rules.Rule, start, from, to int64) bool {
	if start > to {
		return false
	}
	end := rules.PartitionEnd(rule.PartitionBy, start)
	last := rule.WindowStartMillis(end-1) + rule.SpanMillis() // exclusive
	return from < last
}

// PartitionCommandRefusal is the error for a command the proxy does not
// support on a partitioned rule.
func PartitionCommandRefusal(rule *rules.Rule, what string) error {
	return query.RuleErrorf(rule, mongoerr.NotImplemented, "%s is not supported with partitionBy %s (buckets are in one collection per period)", what, rule.PartitionBy)
}
