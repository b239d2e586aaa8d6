package rewrite

import (
	"github.com/tsproxy/tsproxy/rewrite/bsonutil"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// session is what of the client's session the rewrite uses.
type session struct {
	hasTxnNumber  bool
	inTransaction bool
}

func readSession(body bsoncore.Document) session {
	var s session
	if v, ok := bsonutil.Lookup(body, "txnNumber"); ok && (v.Type == bsoncore.TypeInt64 || v.Type == bsoncore.TypeInt32) {
		_, s.hasTxnNumber = v.AsInt64OK()
	}
	s.inTransaction = inTransaction(body)
	return s
}

// retryable: a retryable write (not a transaction statement), the only case
// where the server may see the same statements twice and must recognise
// them by their stmtIds.
func (s session) retryable() bool { return s.hasTxnNumber && !s.inTransaction }
