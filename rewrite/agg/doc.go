// Package agg runs aggregation pipelines at the proxy, over the events a
// bucketed read yields, for upstreams that cannot run them (FerretDB
// v1.24 lacks $group accumulators other than $sum and $count, $dateTrunc,
// computed $project fields, $bucket and more, and answers a $group with
// two accumulators wrongly).
//
// The stages are here; expressions and $group's accumulators are
// rewrite/expr, the values they compute with (MongoDB's numeric
// widening, comparison order and double-double sums) rewrite/expr/value,
// and $project/$addFields specs rewrite/agg/projection.
//
// A stage, operator or option outside the supported set is refused at
// Compile with an error naming it: the engine never answers what it does
// not implement. $group and $sort hold their input in memory up to
// Options.MaxMemory and fail past it with MongoDB's
// QueryExceededMemoryLimitNoDiskUseAllowed (292): the proxy does not
// spill to disk.
//
// It does no I/O.
package agg
