// Package agg runs aggregation pipelines at the proxy, over the events a
// bucketed read yields, for upstreams that cannot run them (FerretDB
// v1.24 lacks $group accumulators other than $sum and $count, $dateTrunc,
// computed $project fields, $bucket and more, and answers a $group with
// two accumulators wrongly).
//
// Values are bsoncore values throughout (a zero Type is a missing
// field), so the BSON types of MongoDB's answers are kept: $sum of int32
// values stays int32 until it overflows, $avg is a double, $dateTrunc a
// date. Doubles are summed in double-double precision, as MongoDB's
// DoubleDoubleSummation does, so sums of ordinary decimal readings come
// out as MongoDB's do, not as a naive loop's.
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
