package point

import (
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/cursor"
)

// heldCursor is a cursor over documents the proxy computed and holds
// (an aggregation it ran itself), paged out by getMore.
type heldCursor struct {
	id   int64
	ns   string
	docs []bsoncore.Document
}

// DefaultFirstBatch is MongoDB's first batch of an aggregate without a
// batchSize.
const DefaultFirstBatch = 101

// HeldResult answers with docs: a first batch of want documents
// (defaultFirstBatch when want < 0), and a cursor named by newID over
// the rest.
func HeldResult(docs []bsoncore.Document, ns string, want int64, newID func() int64) rewrite.Result {
	if want < 0 {
		want = DefaultFirstBatch
	}
	c := &heldCursor{ns: ns, docs: docs}
	n, _ := cursor.BatchLen(docs, want)
	if want == 0 {
		n = 0
	}
	batch := docs[:n]
	c.docs = docs[n:]
	if len(c.docs) == 0 {
		return rewrite.Result{Reply: cursor.Reply{Key: "firstBatch", Batch: batch, NS: ns}.WithID(0)}
	}
	c.id = newID()
	return rewrite.Result{Reply: cursor.Reply{Key: "firstBatch", Batch: batch, NS: ns}.WithID(c.id), Cursor: c}
}

func (c *heldCursor) ID() int64 { return c.id }

// Local: nothing upstream to release.
func (c *heldCursor) Local() bool { return true }

// More answers a getMore from the documents held; without batchSize (or
// 0) it takes as many as fit in a batch.
func (c *heldCursor) More(body []byte) rewrite.Plan {
	want, ok := cursor.GetMoreBatchSize(body)
	if !ok || want <= 0 {
		want = -1
	}
	n, _ := cursor.BatchLen(c.docs, want)
	batch := c.docs[:n]
	c.docs = c.docs[n:]
	id, res := c.id, rewrite.Result{}
	if len(c.docs) > 0 {
		res.Cursor = c
	} else {
		id = 0
	}
	res.Reply = cursor.Reply{Key: "nextBatch", Batch: batch, NS: c.ns}.WithID(id)
	return rewrite.Done(res)
}

// Close releases nothing upstream.
func (c *heldCursor) Close() rewrite.Plan { return nil }
