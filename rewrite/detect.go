package rewrite

import (
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
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
