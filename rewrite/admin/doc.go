// Package admin plans the administrative commands on a bucketed
// namespace: create, drop (with partitions and rollups), createIndexes,
// listIndexes, dropIndexes (index keys mapped between event fields and
// bucket fields), collStats and $collStats (reported for the events), and
// listCollections (bucket collections shown under the app's name, with
// their options).
//
// It does no I/O: each command is a rewrite.Plan. It must not write or
// read stored events; those are the read, insert and deletes packages'.
package admin
