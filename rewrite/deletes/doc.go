// Package deletes plans delete on a bucketed namespace: it finds the
// candidate buckets (through rewrite/source), removes the matched events
// from each, and rewrites or removes the bucket under a lock on its key, so
// a concurrent insert into the same bucket is not lost.
//
// It does no I/O: a delete is a rewrite.Script; the lock is the caller's
// (Env.Lock). It must not change the stored format (rewrite/bucket's).
package deletes
