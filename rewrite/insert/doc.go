// Package insert plans insert on a bucketed namespace (events layout):
// events are validated and prepared (rewrite/bucket), grouped by series
// and window, and written as upserts and $push updates into open buckets,
// with deterministic bucket ids so that a retried write finds its own
// earlier work. It reads replies back per statement: write errors mapped
// to the client's documents, full buckets retried in the next bucket, and
// retries detected.
//
// It does no I/O: an insert is a rewrite.Plan over the Commands
// of each round. It must not change the
// stored format (rewrite/bucket's).
package insert
