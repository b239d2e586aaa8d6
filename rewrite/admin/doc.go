// Package admin plans the administrative commands on a bucketed
// namespace: create, drop (with partitions and rollups), createIndexes,
// listIndexes, dropIndexes (index keys mapped between event fields and
// bucket fields), collStats and $collStats (reported for the events), and
// listCollections (bucket collections shown under the app's name, as
// MongoDB lists a time-series collection). It also reads and checks
// MongoDB's time-series API on namespaces without a config rule (create
// with the timeseries option, collMod) and builds the
// commands of the catalog those rules are kept in.
//
// It does no I/O: each command is a rewrite.Plan. It must not write or
// read stored events; those are the read, insert and deletes packages'.
package admin
