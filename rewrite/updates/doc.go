// Package updates plans update on a bucketed namespace of the events
// layout, as MongoDB 7.0+ updates a time-series collection: each
// statement's events are found as a delete finds them (rewrite/deletes),
// the buckets holding them are locked, read and rewritten with each
// matched event updated (rewrite/updateop); an event whose update moves
// it to another series or window goes to a new bucket of that series
// and window, and an upsert that matched nothing inserts its new event
// there too. Its reply is a plain collection's: n, nModified, upserted,
// writeErrors.
//
// It does no I/O: an update is a rewrite.Script; the locks are the
// caller's (Env.Lock). It must not change the stored format.
package updates
