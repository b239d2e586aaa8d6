package stage

import (
	"strings"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/insert"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// markerPrefix starts the _id of a marker document.
const markerPrefix = "tsproxy_kept_"

// MarkerID is the _id of a marker document with the random part token.
func MarkerID(token string) string { return markerPrefix + token }

// IsMarker says whether a staging collection's document is a marker.
func IsMarker(d bsoncore.Document) bool {
	s, ok := d.Lookup("_id").StringValueOK()
	return ok && strings.HasPrefix(s, markerPrefix)
}

// MarkerDoc is the marker document with _id id.
func MarkerDoc(id string) bsoncore.Document {
	return bsoncore.NewDocumentBuilder().AppendString("_id", id).Build()
}

// MarkerCommands create staging collection db.coll and insert its marker
// document, in that order; the marker is written when KeptDocs of its
// insert's reply is the marker.
func MarkerCommands(db, coll, id string) (create []byte, marker rewrite.Upstream) {
	create = bucket.CreateCommand(db, coll)
	body := bsoncore.NewDocumentBuilder().AppendString("insert", coll).AppendString("$db", db).Build()
	seq := &rewrite.Sequence{Identifier: "documents", Documents: []bsoncore.Document{MarkerDoc(id)}}
	return create, rewrite.Upstream{Body: body, Seq: seq}
}

// KeptTarget is the database and staging collection of u, an insert
// marked rewrite.Upstream.Keep.
func KeptTarget(u rewrite.Upstream) (db, coll string) {
	body := bsoncore.Document(u.Body)
	coll, _ = body.Lookup("insert").StringValueOK()
	db, _ = body.Lookup("$db").StringValueOK()
	return db, coll
}

// KeptDocs are the documents of u, an insert into a staging collection,
// that its reply says it stored: all of them but those that met a
// duplicate key (a retry's: the first attempt's document is there). ok
// is false when the reply does not say exactly which were stored (a
// failure, a write concern error, another write error, counts that do
// not add up): then the proxy can no longer know what the collection
// holds.
func KeptDocs(u rewrite.Upstream, reply []byte) (docs [][]byte, ok bool) {
	doc := bsoncore.Document(reply)
	if u.Seq == nil || doc.Validate() != nil || !mongoerr.IsOK(doc) {
		return nil, false
	}
	if _, err := doc.LookupErr("writeConcernError"); err == nil {
		return nil, false
	}
	n, ok := doc.Lookup("n").AsInt64OK()
	if !ok {
		return nil, false
	}
	werrs := insert.ReplyWriteErrors(doc)
	if arr, isArr := doc.Lookup("writeErrors").ArrayOK(); isArr {
		if vals, err := arr.Values(); err != nil || len(vals) != len(werrs) {
			return nil, false // an entry without a valid index
		}
	}
	if int(n)+len(werrs) != len(u.Seq.Documents) {
		return nil, false
	}
	docs = make([][]byte, 0, len(u.Seq.Documents))
	for i, d := range u.Seq.Documents {
		e, failed := werrs[i]
		switch {
		case !failed:
			docs = append(docs, d)
		case e.Code != mongoerr.DuplicateKey:
			return nil, false
		}
	}
	return docs, true
}

// MarkerFind finds the marker document id in retired collection coll:
// the first document there (its collection's first insert), so even a
// scan stops at once.
func MarkerFind(db, coll, id string) []byte {
	filter := bsoncore.NewDocumentBuilder().AppendString("_id", id).Build()
	projection := bsoncore.NewDocumentBuilder().AppendInt32("_id", 1).Build()
	return bsoncore.NewDocumentBuilder().AppendString("find", coll).AppendDocument("filter", filter).
		AppendDocument("projection", projection).AppendInt32("limit", 1).AppendBoolean("singleBatch", true).
		AppendString("$db", db).Build()
}

// MaxReadBytes bounds the staged bytes one reply of a retired
// collection's read may hold: FerretDB does not cut a batch at 16MiB as
// MongoDB does, and a larger reply is refused.
const MaxReadBytes = 32 << 20
