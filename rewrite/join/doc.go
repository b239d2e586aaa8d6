// Package join runs the aggregation stages that read another namespace,
// $lookup (every form: localField/foreignField, pipeline with let,
// both), $graphLookup and $unionWith, for pipelines the proxy evaluates
// itself: those on a plain collection that join a bucketed one, and
// those on a bucketed collection. The other stages run in the proxy's
// engine (rewrite/agg), segment by segment between the join stages.
//
// The namespaces are read through a Reader: the proxy's bucketed read
// path for a time-series collection (so its events are answered from
// buckets), a plain find for the others, both on the client's own
// connection, inside a script (rewrite.Script). Foreign reads are
// batched: a $lookup's localField/foreignField reads once per batch of
// input documents, with {foreignField: {$in: <their distinct keys>}}; a
// $graphLookup once per depth of a batch. What the upstream returns is a
// superset of what joins; matching happens here, with MongoDB's rules
// (lookup_equijoin_semantics.js: a missing or empty local value matches
// null and missing foreign ones, local arrays match by element, foreign
// arrays by element and as a whole).
//
// $lookup's let variables reach its pipeline as literals: each "$$name"
// in an expression is replaced by {$literal: value} before the pipeline
// is compiled for one binding (results are kept per distinct binding),
// so the engine needs no variable scope; a $match's query outside $expr
// keeps "$$name" as the string it is there.
//
// It does no I/O of its own.
package join
