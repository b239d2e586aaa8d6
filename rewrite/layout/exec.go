package layout

import (
	"github.com/tsproxy/tsproxy/rewrite/cursor"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// fetchBounds is what the filter's top-level conjuncts say about the
// buckets that can hold matching documents.
type fetchBounds struct {
	meta         bsoncore.Value // fixed meta; Type 0 when not fixed
	lo, hi       int64          // time range, inclusive
	hasLo, hasHi bool
}

// exactMeta reports whether a meta value is equal only to values of the
// same bytes, so that its bucket ids can be computed: 1 and 1.0 (also
// inside documents) are equal to a query but hash apart.
func exactMeta(v bsoncore.Value) bool {
	switch v.Type {
	case bsoncore.TypeString, bsoncore.TypeObjectID, bsoncore.TypeBoolean, bsoncore.TypeDateTime:
		return true
	}
	return false
}

func (b *fetchBounds) timeOp(op string, v bsoncore.Value) {
	ms, ok := v.DateTimeOK()
	if !ok {
		return
	}
	switch op {
	case "$eq":
		b.lower(ms)
		b.upper(ms)
	case "$gt", "$gte":
		b.lower(ms)
	case "$lt", "$lte":
		b.upper(ms)
	}
}

func (b *fetchBounds) lower(ms int64) {
	if !b.hasLo || ms > b.lo {
		b.lo, b.hasLo = ms, true
	}
}

func (b *fetchBounds) upper(ms int64) {
	if !b.hasHi || ms < b.hi {
		b.hi, b.hasHi = ms, true
	}
}

func lookupOrNull(doc bsoncore.Document, path []string) bsoncore.Value {
	v, err := doc.LookupErr(path...)
	if err != nil {
		return bsoncore.Value{Type: bsoncore.TypeNull}
	}
	return v
}

func appendLayoutCount(b *bsoncore.DocumentBuilder, key string, n int64) {
	if n <= 1<<31-1 {
		b.AppendInt32(key, int32(n))
	} else {
		b.AppendInt64(key, n)
	}
}

// LayoutCursor holds the documents of a read the app has not fetched yet.
type Cursor struct {
	id   int64
	ns   string
	docs []bsoncore.Document
}

// reply takes the next batch of at most size documents (and at most
// maxBatchBytes).
func (c *Cursor) reply(key string, size int64, id int64) cursor.Reply {
	n, _ := cursor.BatchLen(c.docs, size)
	out := cursor.Reply{Key: key, Batch: c.docs[:n], NS: c.ns}
	c.docs = c.docs[n:]
	return out
}

// GetMore answers a getMore on the cursor kept under id; done says the
// cursor is exhausted and may be forgotten.
func (c *Cursor) GetMore(body bsoncore.Document, id int64) (reply bsoncore.Document, done bool) {
	size := int64(len(c.docs))
	if n, ok, err := intArg(body, "batchSize"); err == nil && ok && n > 0 {
		size = n
	}
	cr := c.reply("nextBatch", size, id)
	if len(c.docs) == 0 {
		return cr.WithID(0), true
	}
	return cr.WithID(id), false
}
