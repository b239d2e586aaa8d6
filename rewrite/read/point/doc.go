// Package point is the reads the proxy serves itself on a bucketed
// namespace, and the shaping of the events every read returns: point
// lookups of whole series and windows by their buckets' deterministic
// _ids (PointRead), scans of the buckets a filter bounds (BucketScan,
// EventScanRead), reads through the event-id index (IDIndexRead), the
// meta of series an upstream's $unwind drops (MetaResolver), and the
// shape of each event in a cursor's batches (CursorShape). rewrite/read
// chooses among them and the upstream's own aggregate.
//
// It does no I/O: each read is a rewrite.Plan.
package point
