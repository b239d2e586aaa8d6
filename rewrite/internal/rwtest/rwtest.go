package rwtest

import (
	"bytes"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/query"
	"github.com/tsproxy/tsproxy/rules"
)

// Doc marshals v (nil gives nil).
func Doc(t testing.TB, v any) bsoncore.Document {
	t.Helper()
	if v == nil {
		return nil
	}
	b, err := bson.Marshal(v)
	if err != nil {
		t.Fatalf("marshal %v: %v", v, err)
	}
	return b
}

// JSON is b as extended JSON, for messages ("<nil>" for nil).
func JSON(b []byte) string {
	if b == nil {
		return "<nil>"
	}
	return bson.Raw(b).String()
}

// AssertDoc fails the test unless got is want, byte for byte.
func AssertDoc(t testing.TB, what string, got bsoncore.Document, want any) {
	t.Helper()
	w := Doc(t, want)
	if !bytes.Equal(got, w) {
		t.Errorf("%s:\n got: %s\nwant: %s", what, bson.Raw(got).String(), bson.Raw(w).String())
	}
}

// Rule is the rule the read tests use: iot.readings, ts and sensorId,
// 1-hour buckets.
func Rule() *rules.Rule {
	return &rules.Rule{
		Namespace: "iot.readings", DB: "iot", Collection: "readings",
		TimeField: "ts", MetaField: "sensorId", Span: time.Hour,
		MaxEvents: 1000, MaxBytes: 1 << 20, BucketCollection: "readings.buckets",
	}
}

// The capabilities of the two kinds of upstream.
var (
	MongoCaps  = caps.Upstream{StmtIDs: true, FullAggregation: true, UnwindKeepsFields: true}
	FerretCaps = caps.Upstream{}
)

// CursorReply is an upstream's reply opening (or, id 0, exhausting) a
// cursor on the bucket collection with docs as its first batch.
func CursorReply(t testing.TB, id int64, docs ...bson.D) []byte {
	t.Helper()
	arr := bson.A{}
	for _, d := range docs {
		arr = append(arr, d)
	}
	return Doc(t, bson.D{{Key: "cursor", Value: bson.D{{Key: "firstBatch", Value: arr}, {Key: "id", Value: id}, {Key: "ns", Value: "iot.readings.buckets"}}}, {Key: "ok", Value: 1.0}})
}

// DT is a BSON date of ms milliseconds since the epoch.
func DT(ms int64) bson.DateTime { return bson.DateTime(ms) }

// Hour is an hour in milliseconds.
const Hour = int64(3600_000)

// InsertRule is the rule the write tests use: hourly buckets of at most 3
// events; chunks of 3 are inserted whole, smaller ones upserted.
func InsertRule() *rules.Rule {
	return &rules.Rule{
		Namespace:        "iot.readings",
		DB:               "iot",
		Collection:       "readings",
		TimeField:        "ts",
		MetaField:        "sensorId",
		Span:             time.Hour,
		MaxEvents:        3,
		MaxBytes:         1 << 20,
		InsertThreshold:  3,
		Aggregates:       []string{"value"},
		BucketCollection: "readings.buckets",
		Layout:           rules.LayoutEvents,
	}
}

// OID is a recognisable ObjectId: 0xEE..., n.
func OID(n byte) bson.ObjectID {
	return bson.ObjectID{0xEE, 0xEE, 0xEE, 0xEE, 0, 0, 0, 0, 0, 0, 0, n}
}

// BucketID is the id of bucket seq of meta's series in window start of
// iot.readings.buckets.
func BucketID(t testing.TB, meta any, start int64, seq int) bson.ObjectID {
	t.Helper()
	v := bsoncore.Value{Type: bsoncore.TypeNull}
	if meta != nil {
		typ, data, err := bson.MarshalValue(meta)
		if err != nil {
			t.Fatal(err)
		}
		v = bsoncore.Value{Type: bsoncore.Type(typ), Data: data}
	}
	return bucket.ID("iot.readings.buckets", v, start, seq)
}

// Event is an event document {_id: id, ts, sensorId: meta, value}; a nil
// field is left out.
func Event(id, ts, meta, value any) bson.D {
	var d bson.D
	for _, e := range []bson.E{{Key: "_id", Value: id}, {Key: "ts", Value: ts}, {Key: "sensorId", Value: meta}, {Key: "value", Value: value}} {
		if e.Value != nil {
			d = append(d, e)
		}
	}
	return d
}

// Stored is Event as kept in a bucket: the meta replaced by a null marker.
func Stored(id, ts any, hasMeta bool, value any) bson.D {
	d := bson.D{{Key: "_id", Value: id}, {Key: "ts", Value: ts}}
	if hasMeta {
		d = append(d, bson.E{Key: "sensorId", Value: nil})
	}
	if value != nil {
		d = append(d, bson.E{Key: "value", Value: value})
	}
	return d
}

// BodyCmd is an insert of events in its body, plus extra fields.
func BodyCmd(t testing.TB, events []bson.D, extra ...bson.E) rewrite.Command {
	t.Helper()
	arr := bson.A{}
	for _, e := range events {
		arr = append(arr, e)
	}
	d := bson.D{{Key: "insert", Value: "readings"}, {Key: "documents", Value: arr}}
	d = append(d, extra...)
	d = append(d, bson.E{Key: "$db", Value: "iot"})
	return rewrite.Command{Body: Doc(t, d)}
}

// SeqCmd is the same insert with the events in a document sequence.
func SeqCmd(t testing.TB, events []bson.D, extra ...bson.E) rewrite.Command {
	t.Helper()
	d := bson.D{{Key: "insert", Value: "readings"}}
	d = append(d, extra...)
	d = append(d, bson.E{Key: "$db", Value: "iot"})
	seq := rewrite.Sequence{Identifier: "documents"}
	for _, e := range events {
		seq.Documents = append(seq.Documents, Doc(t, e))
	}
	return rewrite.Command{Body: Doc(t, d), Sequences: []rewrite.Sequence{seq}}
}

// UpdateCmd is an expected update of the bucket collection.
func UpdateCmd(ordered bool, stmts []bson.D, tail ...bson.E) bson.D {
	return BucketWriteCmd("update", "updates", ordered, stmts, tail...)
}

// BucketWriteCmd is an expected write command on the bucket collection
// (iot.readings.buckets) with its documents or statements under field.
func BucketWriteCmd(command, field string, ordered bool, docs []bson.D, tail ...bson.E) bson.D {
	arr := bson.A{}
	for _, s := range docs {
		arr = append(arr, s)
	}
	d := bson.D{{Key: command, Value: "readings.buckets"}, {Key: field, Value: arr}, {Key: "ordered", Value: ordered}}
	d = append(d, tail...)
	return append(d, bson.E{Key: "$db", Value: "iot"})
}

// Unwound is a bucket document unwound on its events, as the upstream's
// $unwind gives it: meta "<absent>" leaves the bucket's meta out.
func Unwound(t testing.TB, meta any, ev bson.D) []byte {
	t.Helper()
	d := bson.D{{Key: "_id", Value: bson.ObjectID{1}}}
	if meta != "<absent>" {
		d = append(d, bson.E{Key: "meta", Value: meta})
	}
	d = append(d, bson.E{Key: "start", Value: DT(0)}, bson.E{Key: "count", Value: 3}, bson.E{Key: "events", Value: ev})
	return Doc(t, d)
}

// Ctx is the read context of Rule on an upstream with c.
func Ctx(t testing.TB, c caps.Upstream) *query.Ctx {
	t.Helper()
	rc, err := query.NewCtx(Rule())
	if err != nil {
		t.Fatal(err)
	}
	rc.Caps = c
	return rc
}

// Guard is the JSON of the stage before an upstream $unwind on MongoDB
// (query.UnwindStages), followed by a comma.
func Guard() string { return JSON(query.UnwindStages(MongoCaps)[0]) + "," }
