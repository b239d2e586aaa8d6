package rewrite

import (
	"github.com/tsproxy/tsproxy/rewrite/bsonutil"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// Sequence is an OP_MSG kind-1 section: documents sent outside the body
// under a field name (drivers send insert's "documents" this way).
type Sequence struct {
	Identifier string
	Documents  []bsoncore.Document
}

// SequenceOf is the sequence of docs (aliased, not copied) under
// identifier.
func SequenceOf(identifier string, docs [][]byte) Sequence {
	out := make([]bsoncore.Document, len(docs))
	for i, d := range docs {
		out[i] = d
	}
	return Sequence{Identifier: identifier, Documents: out}
}

// Command is an OP_MSG command as the client sent it. Its body and every
// sequence document have passed wire.ValidateDocument (wire.Msg.Decode
// checks each section), as have the upstream replies fed to plans: the
// rewrite reads them without validating again, so callers outside the
// proxy (tests, fuzz targets) validate first.
type Command struct {
	Body      bsoncore.Document
	Sequences []Sequence
}

// commandDocuments returns the documents of the array field name, taken
// from the body or from a document sequence of that name (not both).
func CommandDocuments(cmd Command, name string) ([]bsoncore.Document, error) {
	inBody, hasBody := bsonutil.Lookup(cmd.Body, name)
	var seq *Sequence
	for i := range cmd.Sequences {
		s := &cmd.Sequences[i]
		if s.Identifier != name {
			return nil, mongoerr.Errorf(mongoerr.BadValue, "unexpected document sequence %q", s.Identifier)
		}
		if seq != nil {
			return nil, mongoerr.Errorf(mongoerr.BadValue, "duplicate document sequence %q", name)
		}
		seq = s
	}
	switch {
	case hasBody && seq != nil:
		return nil, mongoerr.Errorf(mongoerr.BadValue, "field %q is both in the body and in a document sequence", name)
	case seq != nil:
		return seq.Documents, nil
	case hasBody:
		return ArrayDocuments(inBody, name)
	}
	return nil, mongoerr.Errorf(mongoerr.BadValue, "missing field %q", name)
}

func ArrayDocuments(v bsoncore.Value, name string) ([]bsoncore.Document, error) {
	arr, ok := v.ArrayOK()
	if !ok {
		return nil, mongoerr.Errorf(mongoerr.TypeMismatch, "field %q must be an array, got %s", name, bsonutil.TypeName(v.Type))
	}
	values, err := arr.Values()
	if err != nil {
		return nil, mongoerr.Errorf(mongoerr.InvalidBSON, "field %q is not valid BSON: %v", name, err)
	}
	docs := make([]bsoncore.Document, 0, len(values))
	for i, item := range values {
		doc, ok := item.DocumentOK()
		if !ok {
			return nil, mongoerr.Errorf(mongoerr.TypeMismatch, "%s.%d must be a document, got %s", name, i, bsonutil.TypeName(item.Type))
		}
		docs = append(docs, doc)
	}
	return docs, nil
}

// Fields carried from the client's command to every rewritten command.
// Anything else the client sent is not carried: a field the rewrite does
// not understand could change the meaning of the rewritten command.
var carriedFields = []string{
	"lsid",                     // the session: retryable writes and transactions
	"txnNumber",                // retryable write / transaction number
	"autocommit",               // present (false) inside a transaction
	"writeConcern",             // acknowledged with the client's write concern
	"bypassDocumentValidation", //
	"comment",                  //
	"maxTimeMS",                // the client's time budget for the write
	"$readPreference",          // mongos / routing
	"$clusterTime",             // causal consistency gossip
	"apiVersion",               // Stable API: required by servers that enforce it
	"apiStrict",                //
	"apiDeprecationErrors",     //
}

// Fields carried only to the first rewritten command: the server accepts
// them only on the first statement of a transaction.
var firstCommandFields = []string{
	"startTransaction",
	"readConcern",
}

// carriedArgs holds the client's generic arguments, each as a raw element,
// in the order carriedFields lists them.
type CarriedArgs struct {
	always []bsoncore.Element
	first  []bsoncore.Element
}

func ReadCarriedArgs(body bsoncore.Document) CarriedArgs {
	var c CarriedArgs
	c.always = bsonutil.Pick(body, carriedFields)
	c.first = bsonutil.Pick(body, firstCommandFields)
	return c
}

// WithoutSession is c without the session's fields (lsid, txnNumber,
// $clusterTime): for a command that carries other sessions' documents
// too, on an upstream that keeps no session state (FerretDB).
func (c CarriedArgs) WithoutSession() CarriedArgs {
	out := CarriedArgs{first: c.first}
	for _, e := range c.always {
		switch e.Key() {
		case "lsid", "txnNumber", "$clusterTime":
		default:
			out.always = append(out.always, e)
		}
	}
	return out
}

// WithoutTxnNumber is c without txnNumber: for the commands of a
// retryable write outside a transaction that a server must not take for
// the write's own statements (several commands of one txnNumber without
// stmtIds: the server numbers each command's statements from 0, and
// takes the second command's for retries of the first's).
func (c CarriedArgs) WithoutTxnNumber() CarriedArgs {
	out := CarriedArgs{first: c.first}
	for _, e := range c.always {
		if e.Key() != "txnNumber" {
			out.always = append(out.always, e)
		}
	}
	return out
}

// appendCarried appends the carried arguments to a command under
// construction; first says whether it is the first upstream command.
func (c CarriedArgs) AppendTo(dst []byte, first bool) []byte {
	for _, e := range c.always {
		dst = append(dst, e...)
	}
	if first {
		for _, e := range c.first {
			dst = append(dst, e...)
		}
	}
	return dst
}

// Bytes is the most AppendTo appends (with first), for sizing a buffer.
func (c CarriedArgs) Bytes() int {
	n := 0
	for _, e := range c.always {
		n += len(e)
	}
	for _, e := range c.first {
		n += len(e)
	}
	return n
}

// inTransaction reports whether the command is part of a multi-document
// transaction (drivers send autocommit:false on every statement of one).
func InTransaction(body bsoncore.Document) bool {
	_, ok := bsonutil.Lookup(body, "autocommit")
	return ok
}
