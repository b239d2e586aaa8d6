// Package merge merges a rule's staging collections (rewrite/stage) into
// complete buckets.
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
package merge
