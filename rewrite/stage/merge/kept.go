package merge

import (
	"fmt"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/stage"
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

// stagedOf reads what retired collection r holds: what this proxy kept of
// its inserts into it (Host.TakeKept) when its marker is there, with
// the marker; else the collection's documents, read back.
func (m *Merge) stagedOf(x *rewrite.Exec, r stage.Collection) ([]bsoncore.Document, error) {
	docs, err := m.readStaged(x, r)
	return docs, lostIn(r.Name, err)
}

// readStaged is stagedOf before its error is read.
func (m *Merge) readStaged(x *rewrite.Exec, r stage.Collection) ([]bsoncore.Document, error) {
	if m.own(r) && !r.TakenOver {
		if docs, marker, ok := m.host().TakeKept(r); ok {
			found, err := drainAll(x, m.rule.DB, r.Name, stage.MarkerFind(m.rule.DB, r.Name, marker), 0)
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
				return append(out, stage.MarkerDoc(marker)), nil
			}
		}
	}
	return m.readRetired(x, r.Name)
}

// countOf counts coll's documents. FerretDB decodes every document to
// count them (300–540 ms for a bucket collection of 400,000 events on
// SQLite), so it counts a retired collection, or the bucket collection
// once, before the event-id index exists.
func (m *Merge) countOf(x *rewrite.Exec, coll string) (int64, error) {
	reply, ok := x.One(stage.CountCommand(m.rule.DB, coll))
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
	return drainAll(x, m.rule.DB, coll, stage.FindBatched(m.rule.DB, coll, nil, m.readBatch()), m.readBatch())
}

// readBatch is how many staged documents (or buckets) one reply may hold
// within maxReadBytes: each holds at most the rule's maxBytes of events
// (and summaries about as large as one event).
func (m *Merge) readBatch() int32 {
	perDoc := m.rule.MaxBytes + 64<<10
	return int32(min(max(1, stage.MaxReadBytes/perDoc), 10_000))
}
