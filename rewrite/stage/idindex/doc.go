// Package idindex is what a merge writes of a rule's event-id index
// (rules.Rule.IDIndexCollection, described in rewrite/bucket): the
// marker that starts it on an empty bucket collection, the series
// entries, each bucket's entry and id-time filters before the bucket,
// the marker's new version, and the deletes of the entries top-ups left
// stale. The merge (rewrite/stage/merge) calls a Writer at each of those
// points; what is written and in which order is what lets a read by
// event _id or of a series' latest events trust the index.
package idindex
