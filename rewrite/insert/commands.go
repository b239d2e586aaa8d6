package insert

import (
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// Limits of one upstream command. The server accepts command bodies up to
// 16 MiB plus a small allowance and at most 100,000 statements; a client
// batch (up to 48 MB in document sequences) can exceed that once it is
// moved into a body, so statements are spread over several commands, each
// with room left for the carried arguments.
const (
	maxCommandStatementBytes = 15 << 20
	maxCommandStatements     = 100_000
)

// statementDoc is one statement (a bucket to insert or an update) and the
// events it carries.
type statementDoc struct {
	doc  bsoncore.Document
	plan plannedStatement
}

func eventIndexes(chunk []bucket.Event) []int {
	idx := make([]int, len(chunk))
	for i, ev := range chunk {
		idx[i] = ev.Index
	}
	return idx
}

// splitStatements cuts statements, in order, into batches that fit one
// upstream command each.
func splitStatements(stmts []statementDoc, maxStatements, maxBytes int) [][]statementDoc {
	var batches [][]statementDoc
	var cur []statementDoc
	size := 0
	for _, st := range stmts {
		if len(cur) > 0 && (len(cur) >= maxStatements || size+len(st.doc) > maxBytes) {
			batches = append(batches, cur)
			cur, size = nil, 0
		}
		cur = append(cur, st)
		size += len(st.doc)
	}
	if len(cur) > 0 {
		batches = append(batches, cur)
	}
	return batches
}
