package rewrite

import (
	"github.com/tsproxy/tsproxy/rewrite/bsonutil"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// session is what of the client's session the rewrite uses.
type Session struct {
	hasTxnNumber  bool
	inTransaction bool
}

func ReadSession(body bsoncore.Document) Session {
	var s Session
	if v, ok := bsonutil.Lookup(body, "txnNumber"); ok && (v.Type == bsoncore.TypeInt64 || v.Type == bsoncore.TypeInt32) {
		_, s.hasTxnNumber = v.AsInt64OK()
	}
	s.inTransaction = InTransaction(body)
	return s
}

// retryable: a retryable write (not a transaction statement), the only case
// where the server may see the same statements twice and must recognise
// them by their stmtIds.
func (s Session) Retryable() bool { return s.hasTxnNumber && !s.inTransaction }
