// Package value is what the proxy's aggregation engine computes with:
// BSON values (a zero Value is a missing field), MongoDB's numeric
// widening (int32, int64 on overflow, then double), its comparison order
// and $group's identity of values, and $group's accumulators. Doubles
// are summed in double-double precision, as MongoDB's
// DoubleDoubleSummation does.
//
// It does no I/O.
package value
