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
// Merging (Merge). One merge of a rule runs at a time (the proxy holds
// the rule's writer lease and a lock). A staging collection is first
// renamed to a retired name, <stage>_m<token>, which freezes it: inserts
// that arrive later create a fresh staging collection. A retired
// collection is then merged (FerretDB's rename changes only its catalog:
// an insert already past its catalog lookup still lands in the renamed
// table, so the proxy runs the freeze while no insert of its own into the
// rule is in flight, and only then reads the retired collection): its
// staged documents read, the events
// grouped by series and window, sorted by time, cut into buckets of at
// most maxEvents and maxBytes, and inserted after the highest seq of
// their key in the bucket collection (with TopUp, the key's last bucket
// is filled first); then it is dropped. Every step is
// repeatable, so a merge cut by a crash is finished by the next one: the
// seqs a merge uses are recorded in the retired collection (its "plan"
// document) before any bucket is inserted, and a duplicate key on a
// merged bucket is accepted only when the stored bucket holds the same
// events.
//
// Retries across a merge. A retry that arrives after its first attempt
// was merged lands in a new staging collection. So each merge records the
// deterministic ids it merged (tsproxy_stage_<hash>_txns, one
// document per merge, kept for the rule's retry horizon), and a later
// merge leaves out staged documents whose id an earlier merge recorded.
//
// Reads. Reads and deletes of a staged rule merge everything staged first
// (the proxy runs Merge with All before them), so every read path sees
// only complete buckets and an acknowledged event exactly once; a read
// bounded in time before every staging period listed needs no merge
// (WorkThrough).
package stage
