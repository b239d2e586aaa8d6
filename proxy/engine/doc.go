// Package engine is what a proxy's client connections share (Vitess's
// split of a connection from the engine behind it): the upstream's
// abilities, the rules and the catalog of created time-series
// collections, the cursor registry, the reply cache, the open buckets'
// fills, the writer leases, the staging tier (proxy/tier) with the host
// it asks, retention (proxy/retention), and the background loops that
// follow the rule set. Everything here is safe for concurrent use; each
// connection's own state is proxy/handler's.
package engine
