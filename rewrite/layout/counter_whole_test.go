package layout

import (
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
	"github.com/tsproxy/tsproxy/rules"
)

// packedSlotsOf is a counter's packed slots field holding counts.
func packedSlotsOf(t *testing.T, counts bson.D) bson.E { return packedField(t, "slots", counts) }

func TestCounterPackedMerge(t *testing.T) {
	rule := layoutRule(rules.LayoutCounter, time.Minute, time.Second)
	evs := stagedEvents(t, rule, hit("/a", rwtest.DT(1_000)), hit("/a", rwtest.DT(1_500)), hit("/a", rwtest.DT(2_000)))
	id := bucket.IDOf(rule.BucketNamespace(), rawOf("/a"), 0, 0)
	head := func(total int64) bson.D {
		return bson.D{{Key: "_id", Value: id}, {Key: "meta", Value: "/a"}, {Key: "start", Value: rwtest.DT(0)}, {Key: "total", Value: total}}
	}
	applied := bson.E{Key: CounterApplied, Value: bson.D{{Key: "g0", Value: bson.D{{Key: "w1", Value: true}}}}}
	cases := []struct {
		name   string
		stored bson.D
		want   bson.D // the bucket written; nil: nothing
	}{
		{"no bucket yet", nil,
			append(head(3), packedSlotsOf(t, bson.D{{Key: "1", Value: int64(2)}, {Key: "2", Value: int64(1)}}), bson.E{Key: CounterMerged, Value: "m1"})},
		{"over a bucket of the document form: counts added, marks carried over",
			bson.D{{Key: "total", Value: int64(5)}, {Key: "slots", Value: bson.D{{Key: "2", Value: int64(4)}, {Key: "59", Value: int32(1)}}}, {Key: CounterMerged, Value: "m0"}, applied},
			append(head(8), packedSlotsOf(t, bson.D{{Key: "1", Value: int64(2)}, {Key: "2", Value: int64(5)}, {Key: "59", Value: int64(1)}}), bson.E{Key: CounterMerged, Value: "m1"}, applied)},
		{"over a packed bucket",
			append(bson.D{{Key: "total", Value: int64(2)}}, packedSlotsOf(t, bson.D{{Key: "1", Value: int64(2)}})),
			append(head(5), packedSlotsOf(t, bson.D{{Key: "1", Value: int64(4)}, {Key: "2", Value: int64(1)}}), bson.E{Key: CounterMerged, Value: "m1"})},
		{"a bucket that carries the mark: counted by an earlier run, left out",
			append(bson.D{{Key: "total", Value: int64(3)}, {Key: CounterMerged, Value: "m1"}}, packedSlotsOf(t, bson.D{{Key: "1", Value: int64(2)}, {Key: "2", Value: int64(1)}})), nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var stored bsoncore.Document
			if tc.stored != nil {
				stored = rwtest.Doc(t, tc.stored)
			}
			w, err := CounterMergeWrites(rule, GroupStaged(rule, evs), "m1", func(bucket.Key) (bsoncore.Document, bool) { return stored, stored != nil }, true)
			if err != nil {
				t.Fatal(err)
			}
			var got bsoncore.Document
			switch {
			case tc.want == nil && len(w.Inserts)+len(w.Updates) == 0:
				return
			case stored == nil && len(w.Inserts) == 1 && len(w.Updates) == 0:
				got = w.Inserts[0].Doc
			case stored != nil && len(w.Inserts) == 0 && len(w.Updates) == 1:
				got = bsoncore.Document(w.Updates[0].Doc).Lookup("u").Document()
			default:
				t.Fatalf("%d inserts and %d updates", len(w.Inserts), len(w.Updates))
			}
			rwtest.AssertDoc(t, "bucket", got, tc.want)
		})
	}
	// packed: false over a packed bucket: whole, in the document form (an
	// $inc cannot reach into a packed map).
	unpacked := layoutRule(rules.LayoutCounter, time.Minute, time.Second)
	unpacked.LayoutOptions.Unpacked = true
	stored := rwtest.Doc(t, append(bson.D{{Key: "total", Value: int64(2)}}, packedSlotsOf(t, bson.D{{Key: "1", Value: int64(2)}})))
	w, err := CounterMergeWrites(unpacked, GroupStaged(unpacked, evs), "m1", func(bucket.Key) (bsoncore.Document, bool) { return stored, true }, true)
	if err != nil {
		t.Fatal(err)
	}
	rwtest.AssertDoc(t, "packed: false over a packed bucket", bsoncore.Document(w.Updates[0].Doc).Lookup("u").Document(),
		append(head(5), bson.E{Key: "slots", Value: bson.D{{Key: "1", Value: int64(4)}, {Key: "2", Value: int64(1)}}}, bson.E{Key: CounterMerged, Value: "m1"}))
}

func TestCounterPackedDirectWrite(t *testing.T) {
	rule := layoutRule(rules.LayoutCounter, time.Minute, time.Second)
	id := bucket.IDOf(rule.BucketNamespace(), rawOf("/a"), 0, 0)
	events := []bson.D{hit("/a", rwtest.DT(1_000)), hit("/a", rwtest.DT(3_000))}
	// Marks of three periods: the current one (g2 at now), the one before,
	// and the stale one (g0) that the write leaves out, as its $unset would.
	now := 2 * MarkerLife.Milliseconds()
	stored := rwtest.Doc(t, append(bson.D{{Key: "total", Value: int64(2)}, {Key: CounterMerged, Value: "m0"},
		{Key: CounterApplied, Value: bson.D{{Key: "g0", Value: bson.D{{Key: "old", Value: true}}}, {Key: "g1", Value: bson.D{{Key: "w0", Value: true}}}, {Key: "g2", Value: bson.D{{Key: "w1", Value: true}}}}}},
		packedSlotsOf(t, bson.D{{Key: "1", Value: int64(2)}})))
	opts := CounterOptions{Caps: caps.Upstream{PackedEvents: true}, WriteID: "w2", Now: now, Before: func(bucket.Key) bsoncore.Document { return stored }}
	p, err := CounterInsertWith(rwtest.BodyCmd(t, events), rule, opts)
	if err != nil {
		t.Fatal(err)
	}
	want := bson.D{{Key: "_id", Value: id}, {Key: "meta", Value: "/a"}, {Key: "start", Value: rwtest.DT(0)}, {Key: "total", Value: int64(4)},
		packedSlotsOf(t, bson.D{{Key: "1", Value: int64(3)}, {Key: "3", Value: int64(1)}}), {Key: CounterMerged, Value: "m0"},
		{Key: CounterApplied, Value: bson.D{{Key: "g1", Value: bson.D{{Key: "w0", Value: true}}}, {Key: "g2", Value: bson.D{{Key: "w1", Value: true}, {Key: "w2", Value: true}}}}}}
	rwtest.AssertDoc(t, "command", p.Commands[0], rwtest.UpdateCmd(true, []bson.D{{{Key: "q", Value: bson.D{{Key: "_id", Value: id}}}, {Key: "u", Value: want}, {Key: "upsert", Value: true}}}))
	var doc bson.D
	if err := bson.Unmarshal(bsoncore.Document(p.Commands[0]).Lookup("updates", "0", "u").Document(), &doc); err != nil {
		t.Fatal(err)
	}
	if !CounterHasMark(rwtest.Doc(t, doc), "w2") {
		t.Fatal("the written bucket does not carry the write's mark")
	}
	// No bucket yet: the new one, marked.
	opts.Before = func(bucket.Key) bsoncore.Document { return nil }
	p, err = CounterInsertWith(rwtest.BodyCmd(t, events), rule, opts)
	if err != nil {
		t.Fatal(err)
	}
	want = bson.D{{Key: "_id", Value: id}, {Key: "meta", Value: "/a"}, {Key: "start", Value: rwtest.DT(0)}, {Key: "total", Value: int64(2)},
		packedSlotsOf(t, bson.D{{Key: "1", Value: int64(1)}, {Key: "3", Value: int64(1)}}),
		{Key: CounterApplied, Value: bson.D{{Key: "g2", Value: bson.D{{Key: "w2", Value: true}}}}}}
	rwtest.AssertDoc(t, "command", p.Commands[0], rwtest.UpdateCmd(true, []bson.D{{{Key: "q", Value: bson.D{{Key: "_id", Value: id}}}, {Key: "u", Value: want}, {Key: "upsert", Value: true}}}))
}

func TestCounterPackedReads(t *testing.T) {
	rule := layoutRule(rules.LayoutCounter, time.Minute, time.Second)
	meta := bson.E{Key: "meta", Value: "/a"}
	start := bson.E{Key: "start", Value: rwtest.DT(0)}
	packed := bson.D{meta, start, {Key: "total", Value: int64(4)}, packedSlotsOf(t, bson.D{{Key: "1", Value: int64(3)}, {Key: "59", Value: int64(1)}})}
	document := bson.D{meta, start, {Key: "total", Value: int64(4)}, {Key: "slots", Value: bson.D{{Key: "59", Value: int32(1)}, {Key: "1", Value: int64(3)}}}}
	for name, b := range map[string]bson.D{"packed": packed, "document form": document} {
		_, _, out := runLayoutRead(t, rule, bson.D{{Key: "find", Value: "readings"}, {Key: "$db", Value: "iot"}}, b)
		arr, _ := bson.Raw(out).Lookup("cursor", "firstBatch").Array().Values()
		if len(arr) != 2 || arr[0].Document().Lookup("count").Int32() != 3 || arr[1].Document().Lookup("count").Int32() != 1 ||
			bson.RawValue(arr[1].Document().Lookup("ts")).Time().Unix() != 59 {
			t.Fatalf("%s: %s", name, bson.Raw(out))
		}
		_, _, out = runLayoutRead(t, rule, bson.D{{Key: "count", Value: "readings"}, {Key: "$db", Value: "iot"}}, b)
		if n := bson.Raw(out).Lookup("n").AsInt64(); n != 4 {
			t.Fatalf("%s: count %d, want 4 events", name, n)
		}
	}
	bad := bson.D{{Key: "_id", Value: bson.ObjectID{2}}, meta, start, {Key: "total", Value: int64(1)}, {Key: "slots", Value: bson.Binary{Subtype: SlotsPackedZstdSubtype, Data: []byte{1, 2, 3}}}}
	r, err := PlanRead(rwtest.Doc(t, bson.D{{Key: "find", Value: "readings"}, {Key: "$db", Value: "iot"}}), rule)
	if err != nil {
		t.Fatal(err)
	}
	r.Next()
	if _, err := r.Feed(rwtest.CursorReply(t, 0, bad)); err == nil || !strings.Contains(err.Error(), "bucket 020000000000000000000000") {
		t.Fatalf("read error %v, want one naming the damaged bucket", err)
	}
}

// TestUnpackedCounter: a packed counter bucket becomes the document form
// an $inc counts into, its other fields as they were; one of the
// document form is left alone; a damaged one is an error.
func TestUnpackedCounter(t *testing.T) {
	head := bson.D{{Key: "_id", Value: rwtest.OID(1)}, {Key: "meta", Value: "/a"}, {Key: "start", Value: rwtest.DT(0)}, {Key: "total", Value: int64(7)}}
	counts := bson.D{{Key: "1", Value: int64(2)}, {Key: "59", Value: int64(5)}}
	packed := rwtest.Doc(t, append(append(bson.D{}, head...), packedSlotsOf(t, counts), bson.E{Key: CounterMerged, Value: "m1"}))
	out, ok, err := UnpackedCounter(packed)
	if err != nil || !ok {
		t.Fatalf("ok %v err %v", ok, err)
	}
	rwtest.AssertDoc(t, "unpacked", out, append(append(bson.D{}, head...), bson.E{Key: "slots", Value: counts}, bson.E{Key: CounterMerged, Value: "m1"}))
	if _, ok, err := UnpackedCounter(out); ok || err != nil {
		t.Fatalf("the document form: ok %v err %v", ok, err)
	}
	bad := rwtest.Doc(t, append(append(bson.D{}, head...), bson.E{Key: "slots", Value: bson.Binary{Subtype: SlotsPackedZstdSubtype, Data: []byte("\x28\xb5\x2f\xfd\x00")}}))
	if _, ok, err := UnpackedCounter(bad); ok || err == nil {
		t.Fatalf("damaged: ok %v err %v", ok, err)
	}
}
