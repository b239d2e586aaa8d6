package insert

import (
	"strings"
	"testing"

	"github.com/tsproxy/tsproxy/rewrite"

	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"

	"github.com/tsproxy/tsproxy/rewrite/bucket"

	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// idGen returns a deterministic ObjectId generator: 0xEE..., n.
func idGen() func() bson.ObjectID {
	n := byte(0)
	return func() bson.ObjectID {
		n++
		return rwtest.OID(n)
	}
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

func opts() Options { return Options{NewObjectID: idGen()} }

func assertCommands(t testing.TB, p *Commands, want ...bson.D) {
	t.Helper()
	if len(p.Commands) != len(want) {
		for i, c := range p.Commands {
			t.Logf("command %d: %s", i, bson.Raw(c).String())
		}
		t.Fatalf("got %d commands, want %d", len(p.Commands), len(want))
	}
	for i := range want {
		rwtest.AssertDoc(t, "command "+string(rune('0'+i)), p.Commands[i], want[i])
	}
}

// insertCmd is the expected upstream insert of complete buckets.
func insertCmd(ordered bool, buckets []bson.D, tail ...bson.E) bson.D {
	return rwtest.BucketWriteCmd("insert", "documents", ordered, buckets, tail...)
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
	onInsert := bson.D{{Key: "meta", Value: meta}, {Key: "start", Value: rwtest.DT(start)}, {Key: "summed.value", Value: true}}
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
		n += len(rwtest.Doc(t, d))
	}
	return int32(n)
}

func mustInsert(t testing.TB, cmd rewrite.Command, rule *rules.Rule, o Options) *Commands {
	t.Helper()
	p, err := New(cmd, rule, o)
	if err != nil {
		t.Fatalf("Insert: %v", err)
	}
	return p
}
