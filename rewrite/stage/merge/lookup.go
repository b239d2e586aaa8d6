package merge

import (
	"slices"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/source"
	"github.com/tsproxy/tsproxy/rewrite/stage"
)

// Reading buckets by _id. A find of {_id: {$in}} makes FerretDB decode
// every bucket of the collection, so a merge that reads a few buckets
// that way costs more the more the rule has stored; where a lookup by
// _id is indexed (the embedded upstream), or filtered in storage
// (FerretDB on PostgreSQL, up to some dozens), the merge looks each one
// up instead, the lookups of a step sent together
// (Host.OneScanBeats says which).

// pointLookups says whether n lookups by _id cost less than one scan.
func (m *Merge) pointLookups(n int) bool {
	beats, known := m.host().OneScanBeats(n)
	return known && !beats
}

// bucketsByID reads the buckets of ids that exist (projection nil: whole),
// by lookups or one scan as pointLookups says.
func (m *Merge) bucketsByID(x *rewrite.Exec, ids []bson.ObjectID, projection bsoncore.Document) ([]bsoncore.Document, error) {
	db, coll := m.rule.DB, m.rule.BucketCollection
	if !m.pointLookups(len(ids)) {
		if projection != nil {
			return drainAll(x, db, coll, stage.FindCommand(db, coll, stage.IdsIn(ids), projection), 0)
		}
		return drainAll(x, db, coll, stage.FindBatched(db, coll, stage.IdsIn(ids), m.readBatch()), m.readBatch())
	}
	finds := make([]bsoncore.Document, len(ids))
	for i, id := range ids {
		b := bsoncore.NewDocumentBuilder().AppendString("find", coll).
			AppendDocument("filter", bsoncore.NewDocumentBuilder().AppendObjectID("_id", id).Build())
		if projection != nil {
			b.AppendDocument("projection", projection)
		}
		finds[i] = b.AppendInt32("limit", 1).AppendBoolean("singleBatch", true).AppendString("$db", db).Build()
	}
	found, err := source.Lookups(x, finds, "read "+coll+" by _id")
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(found, func(d bsoncore.Document) bool { return d == nil }), nil
}

// host is the merge's Host (NoHost when the caller gave none).
func (m *Merge) host() Host {
	if m.opts.Host == nil {
		return NoHost{}
	}
	return m.opts.Host
}
