// Package expr compiles and evaluates MongoDB aggregation expressions
// ($add, $dateTrunc, $cond, $let, $filter, ...) and $group's
// accumulators over bsoncore values, for the proxy's aggregation engine
// (rewrite/agg) and the joins that run beside it (rewrite/join).
//
// Values are bsoncore values (a zero Type is a missing field), so the
// BSON types of MongoDB's answers are kept: $sum of int32 values stays
// int32 until it overflows, $avg is a double, $dateTrunc a date. Doubles
// are summed in double-double precision, as MongoDB's
// DoubleDoubleSummation does. An operator outside the supported set is
// refused at compile time with an error naming it.
//
// It does no I/O.
package expr
