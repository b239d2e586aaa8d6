// Package source says where a rule's stored events are: the collections
// that hold its buckets (the bucket collection, or for a partitioned rule
// the partitions that exist), listed by a plan. Every path that reads,
// counts, deletes, expires or drops stored events starts from it, so a
// new place for events (a second storage tier) is added here once.
package source
