// Package bsonutil holds the BSON helpers every rewrite shares: MongoDB's
// comparison of values (Compare, as $min/$max and sorts order them), deep
// validation of hostile documents, top-level field lookups, and small
// builders of values and pipeline stages.
//
// It knows nothing of buckets, rules or commands, and does no I/O.
package bsonutil
