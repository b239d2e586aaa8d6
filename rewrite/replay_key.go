package rewrite

import (
	"fmt"
	"strconv"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// MongoDB recognises a driver's retry of a write by its session's
// transaction table: one record per session (lsid) holding the last
// txnNumber and what it wrote. The proxy keeps the same in memory for the
// writes it rewrites; these functions read the
// parts of a command and a reply that table needs.

// RetryKey names one retryable write: its session (lsid.id and, when
// present, lsid.uid, as bytes) and its txnNumber.
type RetryKey struct {
	// Session is lsid.id's length, ":", its bytes, then "\x00" without a
	// uid or "\x01" and uid's bytes: no two lsids share it.
	Session   string
	TxnNumber int64
	id        string // lsid.id's bytes, for messages
}

// OwnedBy is the key of the same write by the client identity names:
// MongoDB's sessions belong to the users who started them (the server
// adds their uid to the lsid), so one user's record never answers
// another's write, nor delays it.
func (k RetryKey) OwnedBy(identity string) RetryKey {
	k.Session += "\x02" + identity
	return k
}

// SessionHex is the session id as MongoDB prints it in its errors (the
// UUID's hex).
func (k RetryKey) SessionHex() string { return fmt.Sprintf("%x", k.id) }

// ReadRetryKey is what RetryKeyOf returned for a command, without an
// error: kept by a caller that read it, so a rewrite need not read it
// again.
type ReadRetryKey struct {
	Key       RetryKey
	Retryable bool
}

// RetryKeyOf returns the key of a retryable write: a command with lsid and
// txnNumber outside a multi-document transaction (autocommit is there).
// ok is false for anything else. A txnNumber without a usable lsid is an
// error, as on MongoDB.
func RetryKeyOf(body bsoncore.Document) (key RetryKey, ok bool, err error) {
	txn, has := bsonutil.Lookup(body, "txnNumber")
	if !has || InTransaction(body) {
		return RetryKey{}, false, nil
	}
	n, isNum := txn.AsInt64OK()
	if !isNum || n < 0 {
		return RetryKey{}, false, &mongoerr.Error{Code: mongoerr.InvalidOptions,
			Msg: fmt.Sprintf("txnNumber must be a non-negative integer, not %s", txn)}
	}
	lsid, has := bsonutil.Lookup(body, "lsid")
	if !has {
		return RetryKey{}, false, &mongoerr.Error{Code: mongoerr.InvalidOptions,
			Msg: "Transaction number requires a session ID to also be specified"}
	}
	doc, isDoc := lsid.DocumentOK()
	if !isDoc {
		return RetryKey{}, false, &mongoerr.Error{Code: mongoerr.InvalidOptions,
			Msg: fmt.Sprintf("lsid must be a document, not %s", lsid.Type)}
	}
	id, err := doc.LookupErr("id")
	if err != nil {
		return RetryKey{}, false, &mongoerr.Error{Code: mongoerr.InvalidOptions, Msg: "lsid has no id"}
	}
	_, idBytes, isBin := id.BinaryOK()
	if !isBin {
		return RetryKey{}, false, &mongoerr.Error{Code: mongoerr.InvalidOptions,
			Msg: fmt.Sprintf("lsid.id must be binary (a UUID), not %s", id.Type)}
	}
	// "<len(id)>:<id>\x00", or "<len(id)>:<id>\x01<uid>" with a uid; built
	// without fmt, as every retryable write computes it.
	session := strconv.AppendInt(make([]byte, 0, 4+len(idBytes)), int64(len(idBytes)), 10)
	session = append(append(session, ':'), idBytes...)
	if uid, err := doc.LookupErr("uid"); err == nil {
		_, uidBytes, isBin := uid.BinaryOK()
		if !isBin {
			return RetryKey{}, false, &mongoerr.Error{Code: mongoerr.InvalidOptions,
				Msg: fmt.Sprintf("lsid.uid must be binary, not %s", uid.Type)}
		}
		session = append(append(session, 1), uidBytes...)
	} else {
		session = append(session, 0)
	}
	return RetryKey{Session: string(session), TxnNumber: n, id: string(idBytes)}, true, nil
}

// ReplyRecordable says whether a reply to a retryable write is the
// write's outcome, to give its retry: a command that succeeded (ok: 1),
// with its write errors and write concern error as they were. A failed
// command (ok: 0) is not recorded; its retry runs again, and what it finds
// stored decides (see WithoutStored).
func ReplyRecordable(reply []byte) bool {
	ok, isNum := bson.Raw(reply).Lookup("ok").AsFloat64OK()
	return isNum && ok == 1
}

// TransactionTooOld is MongoDB's answer to a retryable write older than
// the last one its session started.
func TransactionTooOld(key RetryKey, last int64) error {
	return &mongoerr.Error{Code: mongoerr.TransactionTooOld, Msg: fmt.Sprintf(
		"Retryable write with txnNumber %d is prohibited on session %s because a newer retryable write with txnNumber %d has already started on this session.",
		key.TxnNumber, key.SessionHex(), last)}
}
