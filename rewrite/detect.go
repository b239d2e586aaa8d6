package rewrite

import "go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

// DetectCaps reads what the upstream supports from its buildInfo reply.
// FerretDB (which answers with "ferretdbVersion") rejects stmtIds and does
// not implement retryable writes; MongoDB 4.4+ has both.
func DetectCaps(buildInfo []byte) Caps {
	doc := bsoncore.Document(buildInfo)
	if _, err := doc.LookupErr("ferretdbVersion"); err == nil {
		return Caps{}
	}
	return Caps{StmtIDs: true, FullAggregation: true}
}

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
