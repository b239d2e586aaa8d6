package stage

import (
	"bytes"
	"slices"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rules"
)

// CountCommand counts db.coll's documents.
func CountCommand(db, coll string) []byte {
	return bsoncore.NewDocumentBuilder().AppendString("count", coll).AppendString("$db", db).Build()
}

// FindCommand finds filter's documents of coll (projection may be nil).
func FindCommand(db, coll string, filter, projection bsoncore.Document) []byte {
	return findProjected(db, coll, filter, projection, 10_000)
}

// FindBatched is findCommand of whole documents, batchSize at a time.
func FindBatched(db, coll string, filter bsoncore.Document, batchSize int32) []byte {
	return findProjected(db, coll, filter, nil, batchSize)
}

func findProjected(db, coll string, filter, projection bsoncore.Document, batchSize int32) []byte {
	b := bsoncore.NewDocumentBuilder().AppendString("find", coll)
	if filter != nil {
		b.AppendDocument("filter", filter)
	}
	if projection != nil {
		b.AppendDocument("projection", projection)
	}
	return b.AppendInt32("batchSize", batchSize).AppendString("$db", db).Build()
}

// IdsIn is the filter {_id: {$in: ids}}.
func IdsIn(ids []bson.ObjectID) bsoncore.Document {
	arr := bsoncore.NewArrayBuilder()
	for _, id := range ids {
		arr.AppendObjectID(id)
	}
	in := bsoncore.NewDocumentBuilder().AppendArray("$in", arr.Build()).Build()
	return bsoncore.NewDocumentBuilder().AppendDocument("_id", in).Build()
}

// IdOf reads a document's ObjectID _id; ok is false for another type.
func IdOf(d bsoncore.Document) (bson.ObjectID, bool) {
	return d.Lookup("_id").ObjectIDOK()
}

// SortByID orders documents by their _id's bytes: the order a merge
// reads staged documents in, the same on every run.
func SortByID(docs []bsoncore.Document) {
	slices.SortStableFunc(docs, func(a, b bsoncore.Document) int {
		return bytes.Compare(a.Lookup("_id").Data, b.Lookup("_id").Data)
	})
}

// SetAsideCommand renames name, a collection of rule's staging tier whose
// table the upstream lost, to its LostName.
func SetAsideCommand(rule *rules.Rule, name string) []byte {
	return RenameCommand(rule.DB, name, LostName(rule, name))
}

// PresenceNS groups the announcements of the proxies staging coll.
func PresenceNS(coll string) string { return "stager:" + coll }

// PresenceID is the _id of the announcement of the proxy tagged tag.
func PresenceID(coll, tag string) string { return PresenceNS(coll) + ":" + tag }
