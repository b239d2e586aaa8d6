// Package layout holds the layouts other than events: counter (one count
// per series and window, per field) and slots (one value per fixed-cadence
// slot, preallocated). It plans their writes (increments and $set into
// preallocated documents, with a write id for retries) and their reads
// (find, count and aggregate answered by expanding the stored documents).
//
// It does no I/O: every command is a rewrite.Plan.
package layout
