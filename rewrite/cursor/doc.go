// Package cursor builds and reads cursor replies: a batch of documents
// under firstBatch or nextBatch with the cursor's id and namespace, cut to
// the client's batch size and MongoDB's 16 MiB reply, the documents and id
// of an upstream cursor reply, and the killCursors reply that mixes
// upstream cursors with those the proxy holds.
//
// It does no I/O.
package cursor
