// Package summary answers aggregations of events from the per-bucket
// summaries (count, sum, min, max, counts), without unwinding events,
// when the pipeline allows it: a $match on meta and time, a $group by
// series and a time truncation or $bucket with $sum, $avg, $min, $max or
// $count, then $sort, $skip, $limit. Buckets that cannot be answered from
// their summary exactly (a window cut by the filter, inexact double sums)
// are read event by event. Anything else falls back to rewrite/read.
//
// It does no I/O: Plan is a rewrite.Plan.
package summary
