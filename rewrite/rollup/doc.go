// Package rollup keeps a rule's rollups: after an insert, the events
// the upstream accepted are added to each rollup's per-window aggregates
// (an upsert with $inc and per-field extremes); rollups expire by their own
// TTL; and on a sharded upstream (mongos) the bucket collections are
// sharded on their series key.
//
// It does no I/O: the rollup writes are a rewrite.Plan run after the
// insert's reply.
package rollup
