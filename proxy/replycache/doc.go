// Package replycache is the proxy's version of MongoDB's session transaction
// table, for the writes it rewrites. A driver retries a retryable write
// (same lsid and txnNumber) when it did not read the reply, often on
// another connection: the reply may have been lost after the proxy wrote
// it, with the upstream's write done. FerretDB does not recognise retries,
// and the proxy, knowing the buckets' fills, would not check what is
// stored: the events would be stored (or counted) twice. So the proxy
// keeps, per session, the last txnNumber it rewrote and the reply it
// gave, and answers a retry with that reply, as MongoDB does.
//
// The table is in memory: after a restart, the check of what is stored
// (rewrite/insert, rewrite/layout) recognises retries. A
// session's write that is still running makes the next write of that
// session wait for its outcome (MongoDB checks a session out to one
// operation at a time), so a retry that overtakes its first attempt never
// runs beside it.
//
// It is a data structure of the proxy's: it does no I/O.
package replycache
