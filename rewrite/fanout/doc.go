// Package fanout runs every read and write of a rule over the collections
// that hold its events: the one bucket collection, or the time partitions
// of a partitioned rule. Reads run each collection's ordinary plan and merge
// (finds merged in sort order, counts summed, distinct values united,
// summaries fed from all); inserts and deletes split by partition and
// merge the replies.
//
// It does no I/O, and knows of no storage other than what
// rewrite/source lists: a new place for events is added there.
package fanout
