package rewrite

import (
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// DetectCaps reads what the upstream supports from its buildInfo reply.
// FerretDB (which answers with "ferretdbVersion") rejects stmtIds and does
// not implement retryable writes, and pushes only {_id: X} filters down to
// its storage; MongoDB 4.4+ has both and indexes any filter.
func DetectCaps(buildInfo []byte) Caps {
	doc := bsoncore.Document(buildInfo)
	if _, err := doc.LookupErr("ferretdbVersion"); err == nil {
		return Caps{IDOnlyFilters: true, CostlyUpdates: true, SingleWriter: true, MaxUpdateStatements: FerretDBMaxUpdateStatements}
	}
	return Caps{StmtIDs: true, FullAggregation: true, UnwindKeepsFields: true}
}

// FerretDBMaxUpdateStatements is Caps.MaxUpdateStatements for FerretDB:
// with at most FerretDBWriteSlots such commands at once, their open queries
// stay well under its 100 SQLite connections.
const (
	FerretDBMaxUpdateStatements = 16
	FerretDBWriteSlots          = 4
)

// docs views raw reply bodies as documents (no copy).
func docs(raw [][]byte) []bsoncore.Document {
	out := make([]bsoncore.Document, len(raw))
	for i, r := range raw {
		out[i] = r
	}
	return out
}

// ReplyFromRaw is Reply for callers outside rewrite, which hold replies as
// plain byte slices (only wire/ and rewrite/ use bsoncore).
func (p *InsertPlan) ReplyFromRaw(replies [][]byte) []byte {
	return p.Reply(docs(replies))
}

// FillsFromRaw is Fills over raw reply bodies.
func (p *InsertPlan) FillsFromRaw(replies [][]byte) []bucket.KeyFill { return p.Fills(docs(replies)) }

// RetriableRaw is Retriable over raw reply bodies.
func (p *InsertPlan) RetriableRaw(replies [][]byte) bool { return p.Retriable(docs(replies)) }

// RetryFromRaw is Retry over raw reply bodies.
func (p *InsertPlan) RetryFromRaw(replies [][]byte, buckets func(bucket.Key) bucket.Fill) *InsertPlan {
	return p.Retry(docs(replies), buckets)
}
