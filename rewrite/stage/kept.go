package stage

import (
	"fmt"
	"strings"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/insert"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// What a proxy keeps of its inserts into its own staging collections, so that
// the merge of a collection it froze itself
// need not read the collection back: on FerretDB that read decodes every
// staged document from JSON, and was half of a merge's time (a third of
// a second for 50,000 events on the embedded upstream).
//
// The proxy may merge what it kept only when that is exactly what the
// retired collection holds. It creates each of its staging collections
// itself (a create that finds the name taken keeps nothing), inserts a
// marker document with a random _id first, and keeps the documents of
// every insert after that whose outcome it knows. Nobody else inserts
// into its collections; a takeover by another proxy (this one's presence
// lapsed) renames the collection with the marker in it, so a later
// insert of this proxy under the same name makes a new collection
// without one. So a retired collection holds the marker only if it is
// the one the kept documents went to, all of them, and nothing else.

// markerPrefix starts the _id of a marker document.
const markerPrefix = "tsproxy_kept_"

// MarkerID is the _id of a marker document with the random part token.
func MarkerID(token string) string { return markerPrefix + token }

// isMarker says whether a staging collection's document is a marker.
func isMarker(d bsoncore.Document) bool {
	s, ok := d.Lookup("_id").StringValueOK()
	return ok && strings.HasPrefix(s, markerPrefix)
}

// markerDoc is the marker document with _id id.
func markerDoc(id string) bsoncore.Document {
	return bsoncore.NewDocumentBuilder().AppendString("_id", id).Build()
}

// MarkerCommands create staging collection db.coll and insert its marker
// document, in that order; the marker is written when KeptDocs of its
// insert's reply is the marker.
func MarkerCommands(db, coll, id string) (create []byte, marker rewrite.Upstream) {
	create = bucket.CreateCommand(db, coll)
	body := bsoncore.NewDocumentBuilder().AppendString("insert", coll).AppendString("$db", db).Build()
	seq := &rewrite.Sequence{Identifier: "documents", Documents: []bsoncore.Document{markerDoc(id)}}
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

// markerFind finds the marker document id in retired collection coll:
// the first document there (its collection's first insert), so even a
// scan stops at once.
func markerFind(db, coll, id string) []byte {
	filter := bsoncore.NewDocumentBuilder().AppendString("_id", id).Build()
	projection := bsoncore.NewDocumentBuilder().AppendInt32("_id", 1).Build()
	return bsoncore.NewDocumentBuilder().AppendString("find", coll).AppendDocument("filter", filter).
		AppendDocument("projection", projection).AppendInt32("limit", 1).AppendBoolean("singleBatch", true).
		AppendString("$db", db).Build()
}

// stagedOf reads what retired collection r holds: what this proxy kept of
// its inserts into it (MergeOptions.Kept) when its marker is there, with
// the marker; else the collection's documents, read back.
func (m *Merge) stagedOf(x *rewrite.Exec, r Collection) ([]bsoncore.Document, error) {
	docs, err := m.readStaged(x, r)
	return docs, lostIn(r.Name, err)
}

// readStaged is stagedOf before its error is read.
func (m *Merge) readStaged(x *rewrite.Exec, r Collection) ([]bsoncore.Document, error) {
	if m.opts.Kept != nil && m.own(r) && !r.TakenOver {
		if docs, marker, ok := m.opts.Kept(r); ok {
			found, err := drainAll(x, m.rule.DB, r.Name, markerFind(m.rule.DB, r.Name, marker), 0)
			if err != nil {
				return nil, err
			}
			if len(found) == 1 {
				if m.keptMarkers == nil {
					m.keptMarkers = map[string]string{}
				}
				m.keptMarkers[r.Name] = marker // a spare may keep it
				out := make([]bsoncore.Document, 0, len(docs)+1)
				for _, d := range docs {
					out = append(out, d)
				}
				m.Stats.Kept++
				return append(out, markerDoc(marker)), nil
			}
		}
	}
	return m.readRetired(x, r.Name)
}

// maxReadBytes bounds the staged bytes one reply of a retired
// collection's read may hold: FerretDB does not cut a batch at 16MiB as
// MongoDB does, and a larger reply is refused.
const maxReadBytes = 32 << 20

// countOf counts coll's documents. FerretDB decodes every document to
// count them (300–540 ms for a bucket collection of 400,000 events on
// SQLite), so it counts a retired collection, or the bucket collection
// once, before the event-id index exists.
func (m *Merge) countOf(x *rewrite.Exec, coll string) (int64, error) {
	reply, ok := x.One(countCommand(m.rule.DB, coll))
	if !ok {
		return 0, rewrite.ErrAborted
	}
	if err := mongoerr.ReplyError(reply); err != nil {
		return 0, fmt.Errorf("count %s: %w", coll, err)
	}
	n, _ := bsoncore.Document(reply).Lookup("n").AsInt64OK()
	return n, nil
}

// readRetired reads every document of a retired collection. Nothing is
// counted first: a count decodes every document on FerretDB, as the read
// does again.
func (m *Merge) readRetired(x *rewrite.Exec, coll string) ([]bsoncore.Document, error) {
	return drainAll(x, m.rule.DB, coll, findBatched(m.rule.DB, coll, nil, m.readBatch()), m.readBatch())
}

// readBatch is how many staged documents (or buckets) one reply may hold
// within maxReadBytes: each holds at most the rule's maxBytes of events
// (and summaries about as large as one event).
func (m *Merge) readBatch() int32 {
	perDoc := m.rule.MaxBytes + 64<<10
	return int32(min(max(1, maxReadBytes/perDoc), 10_000))
}
