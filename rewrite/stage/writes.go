package stage

import (
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// The writes the merges of the staging tier share: unordered inserts and
// chunked update or delete commands, whose duplicate keys are outcomes
// (an earlier run of the same merge wrote the document; a capped upsert
// found its document full) and whose other failures are errors.

// InsertStep is an unordered insert of docs into db.coll.
func InsertStep(db, coll string, docs []bsoncore.Document) rewrite.Upstream {
	body := bsoncore.NewDocumentBuilder().AppendString("insert", coll).AppendBoolean("ordered", false).AppendString("$db", db).Build()
	return rewrite.Upstream{Body: body, Seq: &rewrite.Sequence{Identifier: "documents", Documents: docs}}
}

// WriteOutcome reads a write's reply: the indexes of the statements that
// met a duplicate key, or the first other failure (the reply's error, a
// write error, a write concern error).
func WriteOutcome(reply []byte) ([]int, error) {
	doc := bsoncore.Document(reply)
	if err := mongoerr.ReplyError(doc); err != nil {
		return nil, err
	}
	if wce, err := doc.LookupErr("writeConcernError"); err == nil {
		return nil, mongoerr.Errorf(mongoerr.InternalError, "write concern: %s", wce)
	}
	var dups []int
	arr, ok := doc.Lookup("writeErrors").ArrayOK()
	if !ok {
		return nil, nil
	}
	vals, _ := arr.Values()
	for _, v := range vals {
		e, _ := v.DocumentOK()
		code, _ := e.Lookup("code").AsInt64OK()
		idx, _ := e.Lookup("index").AsInt64OK()
		if mongoerr.Code(code) != mongoerr.DuplicateKey {
			msg, _ := e.Lookup("errmsg").StringValueOK()
			return nil, mongoerr.Errorf(mongoerr.Code(code), "%s", msg)
		}
		dups = append(dups, int(idx))
	}
	return dups, nil
}

// InsertOne inserts doc into db.coll; a duplicate key is no failure.
func InsertOne(x *rewrite.Exec, db, coll string, doc bsoncore.Document) error {
	reply, ok := x.Do(rewrite.Step{InsertStep(db, coll, []bsoncore.Document{doc})})
	if !ok {
		return rewrite.ErrAborted
	}
	_, err := WriteOutcome(reply[0])
	return err
}

// Statements sends stmts as unordered commands cmd ("update" or
// "delete") on db.coll, per statements a command (FerretDB keeps each
// statement's query open until its command ends, one pool connection
// each), and returns the indexes (in stmts) of those that met a
// duplicate key, or the first failure.
func Statements(x *rewrite.Exec, db, cmd, coll string, per int, stmts []bsoncore.Document) ([]int, error) {
	var dups []int
	for at := 0; at < len(stmts); {
		n := min(len(stmts)-at, per)
		body := bsoncore.NewDocumentBuilder().AppendString(cmd, coll).AppendBoolean("ordered", false).AppendString("$db", db).Build()
		reply, ok := x.Do(rewrite.Step{{Body: body, Seq: &rewrite.Sequence{Identifier: cmd + "s", Documents: stmts[at : at+n]}, Update: cmd == "update"}})
		if !ok {
			return nil, rewrite.ErrAborted
		}
		d, err := WriteOutcome(reply[0])
		if err != nil {
			return nil, err
		}
		for _, i := range d {
			dups = append(dups, at+i)
		}
		at += n
	}
	return dups, nil
}

// DeleteMany deletes every document of db.coll that q matches.
func DeleteMany(x *rewrite.Exec, db, coll string, q bsoncore.Document) error {
	reply, ok := x.One(DeleteManyCommand(db, coll, q))
	if !ok {
		return rewrite.ErrAborted
	}
	return mongoerr.ReplyError(reply)
}
