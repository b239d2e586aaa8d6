package rollup

import (
	"time"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// TTLIndexName names the index that expires a rule's buckets or rollups.
const TTLIndexName = "tsproxy_expire_start_1"

// Expiry is one collection of a rule that ages out: documents whose start
// is before Cutoff (at the time of the sweep) are expired. A document's
// window is [start, start+Window); it expires once that window ended more
// than the rule's expireAfter ago, so the TTL index on start has
// expireAfterSeconds = expireAfter + Window, and no end field is stored.
type Expiry struct {
	Collection string
	Window     time.Duration
}

// Expiries lists the rule's bucket collection and its rollup collections
// (which keep the same retention), or nil when the rule keeps data forever.
func Expiries(rule *rules.Rule) []Expiry {
	if rule == nil || !rule.Expires() {
		return nil
	}
	out := []Expiry{{Collection: rule.BucketCollection, Window: rule.Span}}
	for _, res := range rule.Rollups {
		out = append(out, Expiry{Collection: rule.RollupCollection(res), Window: res})
	}
	return out
}

// Cutoff is the start before which e's documents are expired at now.
func (e Expiry) Cutoff(rule *rules.Rule, now time.Time) time.Time {
	return now.Add(-rule.ExpireAfter - e.Window).UTC().Truncate(time.Millisecond)
}

// TTLIndexCommand creates the TTL index on start that expires e's
// documents on an upstream with TTL indexes (MongoDB). FerretDB v1.24
// refuses expireAfterSeconds with NotImplemented; the proxy's sweeper then
// deletes with SweepCommand instead.
func TTLIndexCommand(rule *rules.Rule, e Expiry) bson.D {
	return bson.D{
		{Key: "createIndexes", Value: e.Collection},
		{Key: "indexes", Value: bson.A{bson.D{
			{Key: "key", Value: bson.D{{Key: bucket.FieldStart, Value: 1}}},
			{Key: "name", Value: TTLIndexName},
			{Key: "expireAfterSeconds", Value: int64((rule.ExpireAfter + e.Window) / time.Second)},
		}}},
		{Key: "$db", Value: rule.DB},
	}
}

// SweepCommand deletes e's documents whose start is before cutoff.
func SweepCommand(rule *rules.Rule, e Expiry, cutoff time.Time) bson.D {
	return bson.D{
		{Key: "delete", Value: e.Collection},
		{Key: "deletes", Value: bson.A{bson.D{
			{Key: "q", Value: bson.D{{Key: bucket.FieldStart, Value: bson.D{{Key: "$lt", Value: bson.NewDateTimeFromTime(cutoff)}}}}},
			{Key: "limit", Value: 0},
		}}},
		{Key: "$db", Value: rule.DB},
	}
}

// HelloCommand asks the upstream what it is.
func HelloCommand() []byte {
	return bsoncore.NewDocumentBuilder().AppendInt32("hello", 1).AppendString("$db", "admin").Build()
}

// IsMongos says whether a hello reply is a mongos's.
func IsMongos(hello []byte) bool {
	msg, ok := bsoncore.Document(hello).Lookup("msg").StringValueOK()
	return ok && msg == "isdbgrid"
}

// ShardCommand is one command of sharding a bucket collection; the
// sharding failed when a Required one is refused.
type ShardCommand struct {
	Body     []byte
	Required bool
}

// ShardCommands shard the rule's bucket collection on {meta: 1, start: 1}:
// enableSharding of the database (needed before MongoDB 6.0, harmless
// after, so its refusal is not a failure), then shardCollection. The
// shard key is the bucket index's key, so an existing collection with that
// index can be sharded too.
func ShardCommands(rule *rules.Rule) []ShardCommand {
	nb := bsoncore.NewDocumentBuilder
	return []ShardCommand{
		{Body: nb().AppendString("enableSharding", rule.DB).AppendString("$db", "admin").Build()},
		{Body: nb().AppendString("shardCollection", rule.BucketNamespace()).
			AppendDocument("key", nb().AppendInt32(bucket.FieldMeta, 1).AppendInt32(bucket.FieldStart, 1).Build()).
			AppendString("$db", "admin").Build(), Required: true},
	}
}
