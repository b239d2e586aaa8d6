package rewrite

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/tsproxy/tsproxy/rewrite/bucket"

	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

const hour = int64(3600_000)

// testRule: hourly buckets of at most 3 events; chunks of 3 are inserted
// whole, smaller ones upserted.
func testRule() *rules.Rule {
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

// idGen returns a deterministic ObjectId generator: 0xEE..., n.
func idGen() func() bson.ObjectID {
	n := byte(0)
	return func() bson.ObjectID {
		n++
		return oid(n)
	}
}

func oid(n byte) bson.ObjectID {
	return bson.ObjectID{0xEE, 0xEE, 0xEE, 0xEE, 0, 0, 0, 0, 0, 0, 0, n}
}

// bid is the BucketID of bucket seq of meta's series in window start.
func bid(meta any, start int64, seq int) bson.ObjectID {
	v := bsoncore.Value{Type: bsoncore.TypeNull}
	if meta != nil {
		t, data, err := bson.MarshalValue(meta)
		if err != nil {
			panic(err)
		}
		v = bsoncore.Value{Type: bsoncore.Type(t), Data: data}
	}
	return bucket.ID("iot.readings.buckets", v, start, seq)
}

func opts() InsertOptions { return InsertOptions{NewObjectID: idGen()} }

func mustDoc(t testing.TB, v any) bsoncore.Document {
	t.Helper()
	b, err := bson.Marshal(v)
	if err != nil {
		t.Fatalf("marshal %v: %v", v, err)
	}
	return b
}

func dt(ms int64) bson.DateTime { return bson.DateTime(ms) }

// ev builds an event document {_id: id, ts, sensorId: meta, value}; a nil
// field is left out.
func ev(id any, ts any, meta any, value any) bson.D {
	var d bson.D
	if id != nil {
		d = append(d, bson.E{Key: "_id", Value: id})
	}
	if ts != nil {
		d = append(d, bson.E{Key: "ts", Value: ts})
	}
	if meta != nil {
		d = append(d, bson.E{Key: "sensorId", Value: meta})
	}
	if value != nil {
		d = append(d, bson.E{Key: "value", Value: value})
	}
	return d
}

// stored is ev as kept in a bucket: meta replaced by a null marker.
func stored(id any, ts any, hasMeta bool, value any) bson.D {
	d := bson.D{{Key: "_id", Value: id}, {Key: "ts", Value: ts}}
	if hasMeta {
		d = append(d, bson.E{Key: "sensorId", Value: nil})
	}
	if value != nil {
		d = append(d, bson.E{Key: "value", Value: value})
	}
	return d
}

// bodyCmd is an insert with the events in the body, plus extra fields.
func bodyCmd(t testing.TB, events []bson.D, extra ...bson.E) Command {
	t.Helper()
	arr := bson.A{}
	for _, e := range events {
		arr = append(arr, e)
	}
	d := bson.D{{Key: "insert", Value: "readings"}, {Key: "documents", Value: arr}}
	d = append(d, extra...)
	d = append(d, bson.E{Key: "$db", Value: "iot"})
	return Command{Body: mustDoc(t, d)}
}

// seqCmd is the same insert with the events in a document sequence.
func seqCmd(t testing.TB, events []bson.D, extra ...bson.E) Command {
	t.Helper()
	d := bson.D{{Key: "insert", Value: "readings"}}
	d = append(d, extra...)
	d = append(d, bson.E{Key: "$db", Value: "iot"})
	seq := Sequence{Identifier: "documents"}
	for _, e := range events {
		seq.Documents = append(seq.Documents, mustDoc(t, e))
	}
	return Command{Body: mustDoc(t, d), Sequences: []Sequence{seq}}
}

// assertDoc compares got with want byte for byte (types and field order
// included) and prints both as extended JSON when they differ.
func assertDoc(t testing.TB, what string, got bsoncore.Document, want any) {
	t.Helper()
	w := mustDoc(t, want)
	if !bytes.Equal(got, w) {
		t.Errorf("%s:\n got: %s\nwant: %s", what, bson.Raw(got).String(), bson.Raw(w).String())
	}
}

func assertCommands(t testing.TB, p *InsertPlan, want ...bson.D) {
	t.Helper()
	if len(p.Commands) != len(want) {
		for i, c := range p.Commands {
			t.Logf("command %d: %s", i, bson.Raw(c).String())
		}
		t.Fatalf("got %d commands, want %d", len(p.Commands), len(want))
	}
	for i := range want {
		assertDoc(t, "command "+string(rune('0'+i)), p.Commands[i], want[i])
	}
}

// insertCmd is the expected upstream insert of complete buckets.
func insertCmd(ordered bool, buckets []bson.D, tail ...bson.E) bson.D {
	arr := bson.A{}
	for _, b := range buckets {
		arr = append(arr, b)
	}
	d := bson.D{{Key: "insert", Value: "readings.buckets"}, {Key: "documents", Value: arr}, {Key: "ordered", Value: ordered}}
	d = append(d, tail...)
	return append(d, bson.E{Key: "$db", Value: "iot"})
}

// updateCmd is the expected upstream update of upsert statements.
func updateCmd(ordered bool, stmts []bson.D, tail ...bson.E) bson.D {
	arr := bson.A{}
	for _, s := range stmts {
		arr = append(arr, s)
	}
	d := bson.D{{Key: "update", Value: "readings.buckets"}, {Key: "updates", Value: arr}, {Key: "ordered", Value: ordered}}
	d = append(d, tail...)
	return append(d, bson.E{Key: "$db", Value: "iot"})
}

// upsert is an expected upsert statement creating bucket seq 0 (rule
// limits 3 events, 1 MiB, count/bytes guard).
func upsert(meta any, start int64, count int32, nbytes int32, events bson.A, inc, minD, maxD bson.D) bson.D {
	return upsertAt(0, false, 3, 1<<20, meta, start, count, nbytes, events, inc, minD, maxD)
}

// upsertAt is an expected upsert statement into bucket seq.
func upsertAt(seq int, idOnly bool, maxEvents, maxBytes int32, meta any, start int64, count int32, nbytes int32, events bson.A, inc, minD, maxD bson.D) bson.D {
	incAll := append(bson.D{{Key: "count", Value: count}, {Key: "bytes", Value: nbytes}}, inc...)
	incAll, minD = withCounts(incAll, minD, count, events)
	q := bson.D{{Key: "_id", Value: bid(meta, start, seq)}}
	if !idOnly {
		q = append(q,
			bson.E{Key: "count", Value: bson.D{{Key: "$lte", Value: maxEvents - count}}},
			bson.E{Key: "bytes", Value: bson.D{{Key: "$lte", Value: maxBytes - nbytes}}})
	}
	var u bson.D
	onInsert := bson.D{{Key: "meta", Value: meta}, {Key: "start", Value: dt(start)}}
	if meta == nil {
		u = append(u, bson.E{Key: "$set", Value: bson.D{{Key: "meta", Value: nil}}})
		onInsert = onInsert[1:]
	}
	u = append(u,
		bson.E{Key: "$setOnInsert", Value: onInsert},
		bson.E{Key: "$push", Value: bson.D{{Key: "events", Value: bson.D{{Key: "$each", Value: events}}}}},
		bson.E{Key: "$inc", Value: incAll},
		bson.E{Key: "$min", Value: minD},
		bson.E{Key: "$max", Value: maxD},
	)
	return bson.D{{Key: "q", Value: q}, {Key: "u", Value: u}, {Key: "upsert", Value: true}}
}

// withCounts adds what the test rule's aggregate "value" adds to an
// upsert: counted, and counts and lowBit of each summed field, computed
// from the events as the write path must.
func withCounts(inc, minD bson.D, count int32, events bson.A) (bson.D, bson.D) {
	inc = append(inc, bson.E{Key: "counted", Value: count})
	for _, e := range inc {
		f, ok := strings.CutPrefix(e.Key, "sum.")
		if !ok {
			continue
		}
		n, low := countsOf(f, events)
		inc = append(inc, bson.E{Key: "counts." + f, Value: n})
		minD = append(minD, bson.E{Key: "lowBit." + f, Value: low})
	}
	return inc, minD
}

func countsOf(field string, events bson.A) (n, low int32) {
	low = bucket.LowBitZero
	for _, ev := range events {
		raw, _ := bson.Marshal(ev)
		if v, err := bsoncore.Document(raw).LookupErr(field); err == nil {
			n++
			low = min(low, bucket.LowBitOf(v))
		}
	}
	return n, low
}

func size(t testing.TB, docs ...bson.D) int32 {
	n := 0
	for _, d := range docs {
		n += len(mustDoc(t, d))
	}
	return int32(n)
}

func mustInsert(t testing.TB, cmd Command, rule *rules.Rule, o InsertOptions) *InsertPlan {
	t.Helper()
	p, err := Insert(cmd, rule, o)
	if err != nil {
		t.Fatalf("Insert: %v", err)
	}
	return p
}
