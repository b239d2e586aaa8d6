// Package catalog keeps the catalog of time-series collections apps
// created (rewrite/admin has its documents) and serves MongoDB's
// time-series API on them: create with the timeseries option, collMod,
// drop and dropDatabase (ServeCreate, ServeCollMod, ServeDrop,
// ServeDropDatabase), each run on the client's connection as the handler
// gives it (Client). Every proxy on one upstream reads the catalog, and
// the rules it holds join the config's.
//
// The promise: no event inserted through any proxy after a create was
// acknowledged is stored unbucketed, and none inserted after a drop was
// acknowledged lands in the dropped buckets. How:
//
//  1. A proxy routes a command on a namespace by a catalog snapshot read
//     less than CatalogLease ago (the lease counts from when the read was
//     sent). A staler snapshot is read again before the command goes on.
//  2. A create writes its entry as "creating", then waits CatalogLease
//     plus a margin: every snapshot read before the entry was written has
//     expired by then, so every proxy has seen "creating", and commands
//     on the namespace wait while it is. Only then does it check that no
//     plain collection of the name appeared meanwhile, create the bucket
//     collection, mark the entry "ready" and answer ok.
//  3. A drop marks the entry "dropping" and waits the same way before it
//     drops the collections and deletes the entry.
//
// The bound this leaves: a command a proxy sent upstream before its lease
// ran out, that reaches the upstream more than the margin later. The
// margin is CatalogLease (at least 1s); the check in step 2 catches such
// a late insert when it lands before the check.
//
// Each change of an entry is a compare-and-set on its nonce. An entry
// left "creating" by a proxy that died is deleted by the next proxy that
// sees it unchanged for catalogStuckAfter (its create was never
// acknowledged); one left "dropping" waits for the app to drop again.
package catalog
