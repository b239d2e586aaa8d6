// Package stage is the staging tier of a rule's stored events: where small
// groups of events are written at the cost of a plain insert, and how they
// are merged into complete buckets later (rules.Rule.Staged says which
// rules stage).
//
// Why: FerretDB rewrites a whole document on every update, so joining an
// open bucket with $push costs more the fuller the bucket is (DESIGN.md,
// "Write path"). Inserting into a staging collection per period and
// later merging it (read it, insert complete buckets, drop it) costs
// about what a plain insert of the events costs, and ends in the same
// compact buckets as a large batch.
//
// Stored form. A staged document (bucket.StagedDoc) holds the events of
// one insert that go to one staging collection, grouped by series and
// window, without a bucket's summaries (the merge computes them): {_id,
// more} with every group packed in "more" (bucket.StagedPacked), or, in
// the form every version of the proxy reads, {_id, meta, start, packed}
// for its first group and the others in "more" (bucket.StagedKeyed). The
// rule's format record says which. The staging collection of the events whose
// window starts in
// staging period P (a day, or the span if longer) is
// tsproxy_stage_<hash of the bucket collection>_<P's start in ms> (no
// dots: FerretDB renames only such names). Its _id is random, or, for a
// retryable write (lsid and txnNumber), derived from the session, its
// owner, the txnNumber and the document's position, so that a driver's retry
// of a write whose reply was lost meets a duplicate key and is
// acknowledged without storing its events twice.
//
// What the proxy keeps between merges is here too: the records of merged
// retryable writes (RecordCache), the directory of a rule's buckets
// (Known), stale event-id index entries, the marker of what the proxy
// kept of its own inserts, spare collections, and the step timings. The
// merge itself is rewrite/stage/merge.
package stage
