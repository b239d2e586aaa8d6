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
// instants [from, to] (ms, inclusive) its events can have, from the
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
				switch op.Key() {
				case "$eq":
					*from, *to = max(*from, ms), min(*to, ms)
				case "$gte", "$gt":
					*from = max(*from, ms)
				case "$lte", "$lt":
					*to = min(*to, ms)
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
