package point

import (
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/query"
)

// FerretDB v1.24's $unwind keeps only _id and the unwound field of each
// document, so an unwound bucket there has no meta. The proxy then looks
// the metas up by bucket _id, once per batch for the buckets it has not
// seen: metaResolver holds what it learnt.
type MetaResolver struct {
	BucketColl, Db string
	Cache          map[string]bsoncore.Value // bucket _id (type byte + bytes) -> meta
	fixed          *bsoncore.Value           // the meta of every bucket read, when the filter pins it
}

// maxMetaCache bounds the metas one cursor remembers; past it the cache
// starts again (batches come bucket by bucket, so little is lost).
const maxMetaCache = 100_000

func NewMetaResolver(rc *query.Ctx) *MetaResolver {
	if rc.MetaField == "" {
		return nil
	}
	return &MetaResolver{BucketColl: rc.Rule.BucketCollection, Db: rc.Rule.DB, Cache: map[string]bsoncore.Value{}, fixed: rc.FixedMeta}
}

func idKey(v bsoncore.Value) string { return string(rune(v.Type)) + string(v.Data) }

// batchDocs returns the documents of a cursor reply's batch.
func batchDocs(reply bsoncore.Document) []bsoncore.Document {
	cur, err := reply.LookupErr("cursor")
	if err != nil {
		return nil
	}
	cd, ok := cur.DocumentOK()
	if !ok {
		return nil
	}
	batch, err := cd.LookupErr("firstBatch")
	if err != nil {
		if batch, err = cd.LookupErr("nextBatch"); err != nil {
			return nil
		}
	}
	arr, ok := batch.ArrayOK()
	if !ok {
		return nil
	}
	vals, _ := arr.Values()
	out := make([]bsoncore.Document, 0, len(vals))
	for _, v := range vals {
		if d, ok := v.DocumentOK(); ok {
			out = append(out, d)
		}
	}
	return out
}

// Prefetch is a find of the _id and meta of every bucket the read's
// bucket-level filter selects: one scan up front instead of a lookup per
// bucket (FerretDB reads by _id through its index only for plain finds).
func (m *MetaResolver) Prefetch(bucketFilter bsoncore.Document) []byte {
	if m == nil || m.fixed != nil {
		return nil
	}
	nb := bsoncore.NewDocumentBuilder
	b := nb().AppendString("find", m.BucketColl)
	if bucketFilter != nil {
		b.AppendDocument("filter", bucketFilter)
	}
	return b.AppendDocument("projection", nb().AppendInt32(bucket.FieldMeta, 1).Build()).
		AppendInt64("batchSize", 100_000).
		AppendString("$db", m.Db).Build()
}

// AddPrefetched learns a prefetch batch and returns the getMore for the
// next one, or nil.
func (m *MetaResolver) AddPrefetched(reply []byte) []byte {
	if m == nil || m.Add(reply) != nil {
		return nil
	}
	cur, err := bsoncore.Document(reply).LookupErr("cursor")
	if err != nil {
		return nil
	}
	cd, _ := cur.DocumentOK()
	id, _ := cd.Lookup("id").AsInt64OK()
	if id == 0 || len(m.Cache) >= maxMetaCache {
		if id != 0 {
			return nil // the rest is looked up per batch
		}
		return nil
	}
	return bsoncore.NewDocumentBuilder().AppendInt64("getMore", id).
		AppendString("collection", m.BucketColl).AppendInt64("batchSize", 100_000).
		AppendString("$db", m.Db).Build()
}

// Query returns the finds of the metas of the reply's buckets that are
// not known and not in their unwound documents: one per bucket, by _id
// alone, the one filter FerretDB reads through its index.
func (m *MetaResolver) Query(reply []byte) [][]byte {
	if m == nil || m.fixed != nil {
		return nil
	}
	doc := bsoncore.Document(reply)
	if doc.Validate() != nil || !mongoerr.IsOK(doc) {
		return nil
	}
	var ids []bsoncore.Value
	seen := map[string]bool{}
	for _, d := range batchDocs(doc) {
		if _, err := d.LookupErr(bucket.FieldMeta); err == nil {
			continue
		}
		id, err := d.LookupErr(bucket.FieldID)
		if err != nil {
			continue
		}
		k := idKey(id)
		if _, ok := m.Cache[k]; ok || seen[k] {
			continue
		}
		seen[k] = true
		ids = append(ids, id)
	}
	if len(ids) == 0 {
		return nil
	}
	nb := bsoncore.NewDocumentBuilder
	out := make([][]byte, 0, len(ids))
	for _, id := range ids {
		out = append(out, nb().AppendString("find", m.BucketColl).
			AppendDocument("filter", nb().AppendValue(bucket.FieldID, id).Build()).
			AppendDocument("projection", nb().AppendInt32(bucket.FieldMeta, 1).Build()).
			AppendInt64("limit", 1).
			AppendBoolean("singleBatch", true).
			AppendString("$db", m.Db).Build())
	}
	return out
}

// Add learns the metas of a reply to query.
func (m *MetaResolver) Add(reply []byte) error {
	if m == nil {
		return nil
	}
	doc := bsoncore.Document(reply)
	if err := doc.Validate(); err != nil {
		return mongoerr.Errorf(mongoerr.InternalError, "upstream reply is not valid BSON: %v", err)
	}
	if !mongoerr.IsOK(doc) {
		msg, _ := doc.Lookup("errmsg").StringValueOK()
		return mongoerr.Errorf(mongoerr.InternalError, "looking up bucket metas: %s", msg)
	}
	docs := batchDocs(doc)
	if len(m.Cache)+len(docs) > maxMetaCache && len(docs) < maxMetaCache {
		m.Cache = map[string]bsoncore.Value{}
	}
	for _, d := range docs {
		id, err := d.LookupErr(bucket.FieldID)
		if err != nil {
			continue
		}
		meta, err := d.LookupErr(bucket.FieldMeta)
		if err != nil {
			meta = bsoncore.Value{Type: bsoncore.TypeNull}
		}
		m.Cache[idKey(id)] = bsoncore.Value{Type: meta.Type, Data: append([]byte(nil), meta.Data...)}
	}
	return nil
}

// metaOf is the meta of an unwound bucket: its own, or the one looked up.
func (m *MetaResolver) metaOf(unwound bsoncore.Document) (bsoncore.Value, error) {
	if v, err := unwound.LookupErr(bucket.FieldMeta); err == nil {
		return v, nil
	}
	if m != nil && m.fixed != nil {
		return *m.fixed, nil
	}
	if m != nil {
		if id, err := unwound.LookupErr(bucket.FieldID); err == nil {
			if v, ok := m.Cache[idKey(id)]; ok {
				return v, nil
			}
		}
	}
	return bsoncore.Value{}, mongoerr.Errorf(mongoerr.InternalError, "the meta of bucket %s is unknown (the bucket was removed while being read?)", unwound.Lookup(bucket.FieldID).String())
}
