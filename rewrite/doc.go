// Package rewrite turns a command on a bucketed namespace into the
// commands to run upstream on the bucket collection, and maps their
// replies back to the reply the client expects from a plain collection.
//
// It is pure: no I/O, no clock, no randomness except what the caller
// injects (ObjectId generation), so every case has a table test.
//
// The command families and layouts are sub-packages (admin, read,
// summary, insert, deletes, layout, fanout, rollup, hello), each exporting
// plans; this package holds what they share: the Command as the client
// sent it, the Plan seam and its combinators (Script, Drain,
// Then), the retry key of a retryable write and the authorization probe.
// It must not import a family package.
package rewrite
