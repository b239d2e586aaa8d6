// Package match evaluates an app's filter on documents the proxy holds
// (events it unpacked from buckets, counter and slots documents it made,
// the aggregation engine's $match) with MongoDB's find semantics:
// comparisons with type bracketing and BSON order, $exists, $type, $regex
// (PCRE translated to RE2, refused by name where RE2 cannot follow),
// $mod, $size, $all, $elemMatch, the bit tests and the logical operators,
// element-wise through arrays as MongoDB matches them. Operators it cannot
// evaluate ($where, $expr, $text, geo, $jsonSchema) are refused by name.
//
// It does no I/O; package query, which translates filters for the
// upstream, uses it where the upstream cannot filter.
package match
