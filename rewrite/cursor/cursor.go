package cursor

import (
	"fmt"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/query"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

type Reply struct {
	Key   string
	Batch []bsoncore.Document
	NS    string
}

// BatchLen is how many of docs the next batch takes, and their bytes: at
// most want (no bound when want < 0) and at most maxBatchBytes, yet one
// document at least when one is wanted, however large.
func BatchLen(docs []bsoncore.Document, want int64) (n, bytes int) {
	for n < len(docs) && (want < 0 || int64(n) < want) && (n == 0 || bytes+len(docs[n]) <= query.MaxBatchBytes) {
		bytes += len(docs[n])
		n++
	}
	return n, bytes
}

func (cr Reply) WithID(id int64) bsoncore.Document {
	// One buffer, sized up front: a batch of tens of thousands of
	// documents is copied once, not again on every growth and into the
	// outer document.
	size := 64 + len(cr.Key) + len(cr.NS)
	for i, d := range cr.Batch {
		size += len(d) + 2 + decimalDigits(i) // type, key, NUL
	}
	oi, b := bsoncore.AppendDocumentStart(make([]byte, 0, size))
	ci, b := bsoncore.AppendDocumentElementStart(b, "cursor")
	ai, b := bsoncore.AppendArrayElementStart(b, cr.Key)
	for i, d := range cr.Batch {
		b = bsoncore.AppendDocumentElement(b, bsonutil.Itoa(i), d)
	}
	b, _ = bsoncore.AppendArrayEnd(b, ai)
	b = bsoncore.AppendInt64Element(b, "id", id)
	b = bsoncore.AppendStringElement(b, "ns", cr.NS)
	b, _ = bsoncore.AppendDocumentEnd(b, ci)
	b = bsoncore.AppendDoubleElement(b, "ok", 1)
	b, _ = bsoncore.AppendDocumentEnd(b, oi)
	return b
}

// decimalDigits is the length of i >= 0 in decimal: an array key's.
func decimalDigits(i int) int {
	n := 1
	for ; i >= 10; i /= 10 {
		n++
	}
	return n
}

// Docs reads the documents of a cursor reply (firstBatch or
// nextBatch) and the cursor id; an error reply becomes a *mongoerr.Error
// with the upstream's code and message.
func Docs(reply []byte) ([]bsoncore.Document, int64, error) {
	doc := bsoncore.Document(reply)
	if err := mongoerr.ReplyError(doc); err != nil {
		return nil, 0, err
	}
	cur, ok := bsonutil.Lookup(doc, "cursor")
	if !ok || cur.Type != bsoncore.TypeEmbeddedDocument {
		return nil, 0, mongoerr.Errorf(mongoerr.InternalError, "upstream reply without a cursor")
	}
	cd := cur.Document()
	id, _ := bsonutil.Lookup(cd, "id")
	cid, _ := id.AsInt64OK()
	batch, ok := bsonutil.Lookup(cd, "firstBatch")
	if !ok {
		batch, ok = bsonutil.Lookup(cd, "nextBatch")
	}
	if !ok || batch.Type != bsoncore.TypeArray {
		return nil, 0, mongoerr.Errorf(mongoerr.InternalError, "upstream cursor without a batch")
	}
	vals, err := batch.Array().Values()
	if err != nil {
		return nil, 0, mongoerr.Errorf(mongoerr.InternalError, "upstream batch is not valid BSON: %v", err)
	}
	docs := make([]bsoncore.Document, 0, len(vals))
	for _, v := range vals {
		d, ok := v.DocumentOK()
		if !ok {
			return nil, 0, mongoerr.Errorf(mongoerr.InternalError, "upstream batch entry is a %s", bsonutil.TypeName(v.Type))
		}
		docs = append(docs, d)
	}
	return docs, cid, nil
}

// WithUpstreamPlan adds to a point or scan read's explain (local) the
// upstream's explain of the command it sends (reply), as
// queryPlanner.upstreamPlan; a failed upstream explain is shown as its
// error, since the proxy's own plan stands without it.
func WithUpstreamPlan(local, reply []byte) []byte {
	doc := bsoncore.Document(local)
	elems, err := doc.Elements()
	if err != nil {
		return local
	}
	up := bsoncore.Document(reply)
	if up.Validate() != nil {
		return local
	}
	if qp, ok := bsonutil.Lookup(up, "queryPlanner"); ok && qp.Type == bsoncore.TypeEmbeddedDocument {
		up = qp.Document()
	}
	idx, d := bsoncore.AppendDocumentStart(nil)
	for _, e := range elems {
		if e.Key() != "queryPlanner" {
			d = append(d, e...)
			continue
		}
		qp, ok := e.Value().DocumentOK()
		if !ok {
			d = append(d, e...)
			continue
		}
		qidx, dd := bsoncore.AppendDocumentElementStart(d, "queryPlanner")
		qelems, _ := qp.Elements()
		for _, qe := range qelems {
			dd = append(dd, qe...)
		}
		dd = bsoncore.AppendDocumentElement(dd, "upstreamPlan", up)
		d, _ = bsoncore.AppendDocumentEnd(dd, qidx)
	}
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

// GetMoreBatchSize is a getMore's batchSize; 0 (as many as fit) when none.
func GetMoreBatchSize(body []byte) (int64, bool) {
	v, ok := bsonutil.Lookup(bsoncore.Document(body), "batchSize")
	if !ok {
		return 0, false
	}
	n, ok := v.AsInt64OK()
	if !ok || n < 0 {
		return 0, false
	}
	return n, true
}

// KillCursorsReply is the reply to a killCursors naming proxy-held cursors
// (local, now forgotten): upstream is the upstream's reply to the same
// command, or nil when every cursor named was the proxy's. The proxy's
// cursors move from cursorsNotFound to cursorsKilled.
func KillCursorsReply(upstream []byte, local []int64) []byte {
	isLocal := map[int64]bool{}
	for _, id := range local {
		isLocal[id] = true
	}
	killed := append([]int64(nil), local...)
	var notFound, alive, unknown []int64
	if upstream != nil {
		doc := bsoncore.Document(upstream)
		if !mongoerr.IsOK(doc) {
			return upstream
		}
		read := func(key string) []int64 {
			var ids []int64
			arr, _ := doc.Lookup(key).ArrayOK()
			vals, _ := arr.Values()
			for _, v := range vals {
				if id, okID := v.AsInt64OK(); okID && !isLocal[id] {
					ids = append(ids, id)
				}
			}
			return ids
		}
		killed = append(read("cursorsKilled"), local...)
		notFound, alive, unknown = read("cursorsNotFound"), read("cursorsAlive"), read("cursorsUnknown")
	}
	arr := func(ids []int64) bsoncore.Array {
		b := bsoncore.NewArrayBuilder()
		for _, id := range ids {
			b.AppendInt64(id)
		}
		return b.Build()
	}
	b := bsoncore.NewDocumentBuilder().
		AppendArray("cursorsKilled", arr(killed)).
		AppendArray("cursorsNotFound", arr(notFound)).
		AppendArray("cursorsAlive", arr(alive)).
		AppendArray("cursorsUnknown", arr(unknown)).
		AppendDouble("ok", 1)
	return b.Build()
}

// First returns the first document of a find reply's first batch,
// nil when there is none, or an error when the reply is an error.
func First(reply bsoncore.Document) (bsoncore.Document, error) {
	if err := reply.Validate(); err != nil {
		return nil, fmt.Errorf("upstream reply is not valid BSON: %w", err)
	}
	if !mongoerr.IsOK(reply) {
		return nil, fmt.Errorf("upstream find failed: %s", mongoerr.FromReply(reply, "").Msg)
	}
	v, err := reply.LookupErr("cursor", "firstBatch")
	if err != nil {
		return nil, nil
	}
	arr, ok := v.ArrayOK()
	if !ok {
		return nil, nil
	}
	vals, _ := arr.Values()
	if len(vals) == 0 {
		return nil, nil
	}
	d, _ := vals[0].DocumentOK()
	return d, nil
}
