// Package read plans the reads of events on a bucketed namespace: find,
// aggregate, count, distinct and explain become an aggregate on the bucket
// collection that unwinds the matching buckets' events, and the reply is
// reshaped back into events (meta restored, projection applied). Reads that
// name whole series and windows use point lookups by bucket id, and
// those a filter bounds may scan the buckets at the proxy
// (rewrite/read/point).
//
// It does no I/O: every read is a rewrite.Plan whose cursor plans its
// getMore. It must not decide where events are stored (rewrite/source and
// rewrite/fanout do) and must refuse, by name, what an upstream cannot run
// (rewrite/caps) rather than answer wrongly.
package read
