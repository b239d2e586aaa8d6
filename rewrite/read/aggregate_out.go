package read

import (
	"fmt"
	"slices"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/agg"
	"github.com/tsproxy/tsproxy/rewrite/cursor"
	"github.com/tsproxy/tsproxy/rewrite/insert"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// The last stage $out or $merge of a pipeline the proxy runs itself:
// the result is written into a plain collection, on the client's
// connection (so with its privileges), and the client gets an empty
// cursor, as from MongoDB.

// outputBatch bounds the documents of one write command.
const (
	outputBatchDocs  = 1000
	outputBatchBytes = 8 << 20
)

// checkOutputTarget refuses a target the proxy buckets: a rule's
// namespace or its buckets must not receive plain documents.
func (a *aggregateRewrite) checkOutputTarget(o *agg.Output) error {
	if a.isBucketed(o.DB, o.Coll) {
		return a.rc.Unsupported("%s into %s.%s, a bucketed namespace (or its buckets), is not supported", o.Stage, o.DB, o.Coll)
	}
	return nil
}

// isBucketed says whether db.coll is this rule's namespace or buckets,
// or another rule's (Options.Bucketed).
func (a *aggregateRewrite) isBucketed(db, coll string) bool {
	r := a.rc.Rule
	return (db == r.DB && (coll == r.Collection || coll == r.BucketCollection)) ||
		(a.opts.Bucketed != nil && a.opts.Bucketed(db, coll))
}

// readForeign reads the collections a pipeline's $lookup stages join,
// on the client's connection, within budget bytes.
func readForeign(x *rewrite.Exec, db string, colls []string, f *agg.Foreign, budget int) error {
	if budget <= 0 {
		budget = agg.DefaultMaxMemory
	}
	total := 0
	for _, coll := range colls {
		var docs []bsoncore.Document
		var failed error
		find := bsoncore.NewDocumentBuilder().AppendString("find", coll).AppendString("$db", db).Build()
		res, ok := x.Run(rewrite.DrainBatched(find, db, coll, 1000, func(batch []bsoncore.Document) error {
			for _, d := range batch {
				total += len(d)
				if total > budget {
					failed = mongoerr.Errorf(mongoerr.QueryExceededMemoryLimit, "$lookup: the documents of %s.%s exceed the memory limit of %d bytes (limits.aggregateMemory); the proxy does not spill to disk", db, coll, budget)
					return failed
				}
				docs = append(docs, slices.Clone(d))
			}
			return nil
		}, func() rewrite.Result { return rewrite.Result{Reply: rewrite.OKReply()} }))
		if !ok {
			return rewrite.ErrAborted
		}
		if failed != nil {
			return failed
		}
		if err := writeReplyError(res.Reply, false, "$lookup: read "+db+"."+coll); err != nil {
			return err
		}
		f.Docs[coll] = docs
	}
	return nil
}

// writeOutput writes docs as o says and answers the client.
func writeOutput(x *rewrite.Exec, o *agg.Output, docs []bsoncore.Document, ns string, maxUpdates int) (bsoncore.Document, error) {
	for i, d := range docs {
		docs[i] = agg.WithID(d)
	}
	var err error
	switch {
	case o.Stage == "$out":
		err = writeOut(x, o, docs)
	case o.WhenMatched == "keepExisting" || o.WhenMatched == "fail":
		if o.WhenNotMatched == "discard" {
			if o.WhenMatched == "fail" {
				return nil, mongoerr.Errorf(mongoerr.NotImplemented, "$merge whenMatched: \"fail\" with whenNotMatched: \"discard\" is not supported by the proxy's aggregation engine")
			}
			break // matched: kept; not matched: discarded
		}
		err = insertAll(x, o.DB, o.Coll, docs, o.WhenMatched == "keepExisting")
	default:
		err = mergeAll(x, o, docs, maxUpdates)
	}
	if err != nil {
		return nil, err
	}
	return cursor.Reply{Key: "firstBatch", NS: ns}.WithID(0), nil
}

// writeOut writes a temporary collection and renames it over the target.
func writeOut(x *rewrite.Exec, o *agg.Output, docs []bsoncore.Document) error {
	tmp := agg.TempCollection()
	create := bsoncore.NewDocumentBuilder().AppendString("create", tmp).AppendString("$db", o.DB).Build()
	if err := commandOK(x, create, "$out: create "+tmp); err != nil {
		return err
	}
	drop := func() {
		x.One(bsoncore.NewDocumentBuilder().AppendString("drop", tmp).AppendString("$db", o.DB).Build())
	}
	if err := insertAll(x, o.DB, tmp, docs, false); err != nil {
		drop()
		return err
	}
	rename := func(dropTarget bool) error {
		b := bsoncore.NewDocumentBuilder().AppendString("renameCollection", o.DB+"."+tmp).AppendString("to", o.DB+"."+o.Coll)
		if dropTarget {
			b.AppendBoolean("dropTarget", true)
		}
		return commandOK(x, b.AppendString("$db", "admin").Build(), "$out: rename "+tmp+" to "+o.Coll)
	}
	err := rename(true)
	if mongoerr.CodeOf(err) == mongoerr.NotImplemented {
		// FerretDB v1.24 has no dropTarget: the target is dropped first,
		// so a reader between the two commands finds no collection
		// (MongoDB's $out replaces it at once).
		dropTarget := bsoncore.NewDocumentBuilder().AppendString("drop", o.Coll).AppendString("$db", o.DB).Build()
		if derr := commandOK(x, dropTarget, "$out: drop "+o.Coll); derr != nil && mongoerr.CodeOf(derr) != mongoerr.NamespaceNotFound {
			err = derr
		} else {
			err = rename(false)
		}
	}
	if err != nil {
		drop()
		return err
	}
	return nil
}

// insertAll inserts docs into db.coll in batches; with dupsOK, documents
// whose _id is there already are left as they are ($merge keepExisting).
func insertAll(x *rewrite.Exec, db, coll string, docs []bsoncore.Document, dupsOK bool) error {
	for len(docs) > 0 {
		n, size := 0, 0
		for n < len(docs) && n < outputBatchDocs && (n == 0 || size+len(docs[n]) <= outputBatchBytes) {
			size += len(docs[n])
			n++
		}
		body := bsoncore.NewDocumentBuilder().AppendString("insert", coll).AppendBoolean("ordered", !dupsOK).AppendString("$db", db).Build()
		replies, ok := x.Do(rewrite.Step{{Body: body, Seq: &rewrite.Sequence{Identifier: "documents", Documents: slices.Clone(docs[:n])}}})
		if !ok {
			return rewrite.ErrAborted
		}
		if err := writeReplyError(replies[0], dupsOK, "insert into "+db+"."+coll); err != nil {
			return err
		}
		docs = docs[n:]
	}
	return nil
}

// mergeAll upserts docs into the target by _id (replace or merge).
func mergeAll(x *rewrite.Exec, o *agg.Output, docs []bsoncore.Document, maxUpdates int) error {
	if maxUpdates <= 0 {
		maxUpdates = outputBatchDocs
	}
	for len(docs) > 0 {
		n := min(len(docs), maxUpdates)
		stmts := make([]bsoncore.Document, n)
		for i, d := range docs[:n] {
			stmts[i] = o.MergeStatement(d)
		}
		body := bsoncore.NewDocumentBuilder().AppendString("update", o.Coll).AppendBoolean("ordered", true).AppendString("$db", o.DB).Build()
		replies, ok := x.Do(rewrite.Step{{Body: body, Seq: &rewrite.Sequence{Identifier: "updates", Documents: stmts}, Update: true}})
		if !ok {
			return rewrite.ErrAborted
		}
		if err := writeReplyError(replies[0], false, "$merge into "+o.DB+"."+o.Coll); err != nil {
			return err
		}
		docs = docs[n:]
	}
	return nil
}

func commandOK(x *rewrite.Exec, body []byte, what string) error {
	reply, ok := x.One(body)
	if !ok {
		return rewrite.ErrAborted
	}
	return writeReplyError(reply, false, what)
}

// writeReplyError is the first failure a write's reply reports, but for
// duplicate keys when dupsOK.
func writeReplyError(reply []byte, dupsOK bool, what string) error {
	r := bsoncore.Document(reply)
	if !mongoerr.IsOK(r) {
		e := insert.CommandErrorOf(r)
		return mongoerr.Errorf(e.Code, "%s: %s", what, e.Msg)
	}
	errs := insert.ReplyWriteErrors(r)
	first := -1
	for i, e := range errs {
		if dupsOK && e.Code == mongoerr.DuplicateKey {
			continue
		}
		if first < 0 || i < first {
			first = i
		}
	}
	if first >= 0 {
		e := errs[first]
		return mongoerr.Errorf(e.Code, "%s: %s", what, e.Msg)
	}
	if wce, err := r.LookupErr("writeConcernError"); err == nil {
		return mongoerr.Errorf(mongoerr.OperationFailed, "%s: write concern error %s", what, fmt.Sprint(wce))
	}
	return nil
}
