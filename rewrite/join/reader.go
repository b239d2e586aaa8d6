package join

import (
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/cursor"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// Bucketed is the plan of a find command on db.coll when db.coll is a
// bucketed namespace (the proxy's read path, which answers it from
// buckets), nil when it is a plain collection.
type Bucketed func(db, coll string, find []byte) rewrite.Plan

// UpstreamReader reads a plain collection with a find upstream, a
// bucketed one through bucketed's plan: both on the client's connection,
// so with the client's privileges.
func UpstreamReader(bucketed Bucketed) Reader { return upstreamReader{bucketed: bucketed} }

type upstreamReader struct{ bucketed Bucketed }

// readBatch is the batch size of a plain collection's getMores.
const readBatch = 1000

func findCommand(db, coll string, filter bsoncore.Document) bsoncore.Document {
	b := bsoncore.NewDocumentBuilder().AppendString("find", coll)
	if filter != nil {
		b.AppendDocument("filter", filter)
	}
	return b.AppendInt32("batchSize", readBatch).AppendString("$db", db).Build()
}

func (r upstreamReader) Read(x *rewrite.Exec, db, coll string, filter bsoncore.Document, take func([]bsoncore.Document) error) error {
	find := findCommand(db, coll, filter)
	if r.bucketed != nil {
		if p := r.bucketed(db, coll, find); p != nil {
			return readPlan(x, db, coll, p, take)
		}
	}
	var failed error
	res, ok := x.Run(rewrite.DrainBatched(find, db, coll, readBatch, func(docs []bsoncore.Document) error {
		if err := take(docs); err != nil {
			failed = err
			return err
		}
		return nil
	}, func() rewrite.Result { return rewrite.Result{Reply: rewrite.OKReply()} }))
	if !ok {
		return rewrite.ErrAborted
	}
	if failed != nil {
		return failed
	}
	return replyError(res.Reply, db, coll)
}

// readPlan runs a bucketed read and its getMores to the end.
func readPlan(x *rewrite.Exec, db, coll string, p rewrite.Plan, take func([]bsoncore.Document) error) error {
	res, ok := x.Run(p)
	for {
		if !ok {
			return rewrite.ErrAborted
		}
		if err := replyError(res.Reply, db, coll); err != nil {
			return err
		}
		docs, _, err := cursor.Docs(res.Reply)
		if err != nil {
			return mongoerr.Errorf(mongoerr.InternalError, "read %s.%s: %v", db, coll, err)
		}
		if err := take(docs); err != nil {
			if res.Cursor != nil {
				if c := res.Cursor.Close(); c != nil {
					x.Run(c)
				}
			}
			return err
		}
		if res.Cursor == nil {
			return nil
		}
		more := bsoncore.NewDocumentBuilder().AppendInt64("getMore", res.Cursor.ID()).
			AppendString("collection", coll).AppendInt32("batchSize", readBatch).AppendString("$db", db).Build()
		res, ok = x.Run(res.Cursor.More(more))
	}
}

// replyError is a read's error reply as an error naming the namespace.
func replyError(reply []byte, db, coll string) error {
	if mongoerr.IsOK(reply) {
		return nil
	}
	e := mongoerr.FromReply(reply, "refused")
	return mongoerr.Errorf(e.Code, "read %s.%s: %s", db, coll, e.Msg)
}
