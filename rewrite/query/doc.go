// Package query maps a MongoDB query onto bucket documents, for every
// command family that reads stored events: the rule's read context (Ctx),
// the translation of a filter to the bucket collection and its split into
// a bucket-level and an event-level part (with the time bounds that name
// windows), projections, the prune of buckets by their summaries (Prune), the
// paging options of find and count, and the upstream
// commands every read shares (the unwinding aggregate, getMore,
// killCursors).
//
// It does no I/O and holds no state between commands.
package query
