// Package upstream dials the server the proxy fronts: a standalone mongod,
// the primary of a replica set, a list of mongos routers, or the embedded
// FerretDB. It knows nothing of bucketing.
//
// It must not parse or rewrite commands: it moves frames.
package upstream
