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

// packedField is field of a packed bucket (raw) holding m.
func packedField(t *testing.T, field string, m bson.D) bson.E {
	t.Helper()
	return bson.E{Key: field, Value: bson.Binary{Subtype: SlotsPackedSubtype, Data: rwtest.Doc(t, m)}}
}

// packedValues is a slots bucket's packed values field holding vals.
func packedValues(t *testing.T, vals bson.D) bson.E { return packedField(t, "values", vals) }

// findAll reads every document of the rule's namespace from buckets and
// returns "<seconds into the window>=<value>" for each, in time order.
func findAll(t *testing.T, rule *rules.Rule, buckets ...bson.D) []string {
	t.Helper()
	_, _, out := runLayoutRead(t, rule, bson.D{{Key: "find", Value: "readings"}, {Key: "batchSize", Value: 10_000}, {Key: "$db", Value: "iot"}}, buckets...)
	arr, err := bson.Raw(out).LookupErr("cursor", "firstBatch")
	if err != nil {
		t.Fatalf("read reply %s", bson.Raw(out))
	}
	vals, _ := arr.Array().Values()
	var got []string
	for _, v := range vals {
		d := v.Document()
		got = append(got, bson.RawValue(d.Lookup("ts")).Time().UTC().Format("15:04:05")+"="+d.Lookup("v").String())
	}
	return got
}

func TestSlotsPackedMerge(t *testing.T) {
	hour := slotsTestRule(time.Hour, true, false)
	prealloc := slotsTestRule(time.Hour, true, true)
	evs := func(t *testing.T, rule *rules.Rule) StagedGroups {
		return GroupStaged(rule, stagedEvents(t, rule, sample("/a", rwtest.DT(1_000), int64(4)), sample("/a", rwtest.DT(3_599_000), 2.5),
			sample("/a", rwtest.DT(1_200), int64(8)), sample("/a", rwtest.DT(61_000), int64(1))))
	}
	id := bucket.IDOf(hour.BucketNamespace(), rawOf("/a"), 0, 0)
	head := func(num int64, total any) bson.D {
		return bson.D{{Key: "_id", Value: id}, {Key: "meta", Value: "/a"}, {Key: "start", Value: rwtest.DT(0)},
			{Key: "num_samples", Value: num}, {Key: "total_samples", Value: total}}
	}
	cases := []struct {
		name   string
		rule   *rules.Rule
		before bson.D
		want   bson.D
	}{
		{"no bucket yet", hour, nil,
			append(head(3, 11.5), packedValues(t, bson.D{{Key: "1", Value: int64(8)}, {Key: "61", Value: int64(1)}, {Key: "3599", Value: 2.5}}))},
		{"over a bucket of the document form, nested", hour,
			bson.D{{Key: "num_samples", Value: int64(2)}, {Key: "total_samples", Value: int64(15)},
				{Key: "values", Value: bson.D{{Key: "0", Value: bson.D{{Key: "1", Value: int64(5)}, {Key: "2", Value: int64(10)}}}}}},
			append(head(4, 21.5), packedValues(t, bson.D{{Key: "1", Value: int64(8)}, {Key: "2", Value: int64(10)}, {Key: "61", Value: int64(1)}, {Key: "3599", Value: 2.5}}))},
		{"over a preallocated shell of the document form: its zeros were not written", prealloc,
			bson.D{{Key: "num_samples", Value: int64(1)}, {Key: "total_samples", Value: int64(0)},
				{Key: "values", Value: bson.D{{Key: "0", Value: bson.D{{Key: "0", Value: int32(0)}, {Key: "5", Value: int32(0)}}}}},
				{Key: "set", Value: bson.D{{Key: "0", Value: bson.D{{Key: "0", Value: false}, {Key: "5", Value: true}}}}}},
			append(head(4, 11.5), packedValues(t, bson.D{{Key: "1", Value: int64(8)}, {Key: "5", Value: int32(0)}, {Key: "61", Value: int64(1)}, {Key: "3599", Value: 2.5}}))},
		{"over a packed bucket", hour,
			append(bson.D{{Key: "num_samples", Value: int64(2)}, {Key: "total_samples", Value: int64(107)}},
				packedValues(t, bson.D{{Key: "61", Value: int64(100)}, {Key: "70", Value: int64(7)}})),
			append(head(4, 18.5), packedValues(t, bson.D{{Key: "1", Value: int64(8)}, {Key: "61", Value: int64(1)}, {Key: "70", Value: int64(7)}, {Key: "3599", Value: 2.5}}))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var before bsoncore.Document
			if tc.before != nil {
				before = rwtest.Doc(t, tc.before)
			}
			w, err := SlotsMergeWrites(tc.rule, evs(t, tc.rule), func(bucket.Key) (bsoncore.Document, bool) { return before, before != nil }, true)
			if err != nil {
				t.Fatal(err)
			}
			var doc bsoncore.Document
			switch {
			case before == nil && len(w.Inserts) == 1 && len(w.Updates) == 0:
				doc = w.Inserts[0].Doc
			case before != nil && len(w.Updates) == 1 && len(w.Inserts) == 0:
				doc = bsoncore.Document(w.Updates[0].Doc).Lookup("u").Document()
			default:
				t.Fatalf("%d inserts and %d updates", len(w.Inserts), len(w.Updates))
			}
			rwtest.AssertDoc(t, "bucket", doc, tc.want)
			// Merged again over its own result, it is the same bucket.
			again, err := SlotsMergeWrites(tc.rule, evs(t, tc.rule), func(bucket.Key) (bsoncore.Document, bool) { return doc, true }, true)
			if err != nil {
				t.Fatal(err)
			}
			rwtest.AssertDoc(t, "bucket merged again", bsoncore.Document(again.Updates[0].Doc).Lookup("u").Document(), tc.want)
		})
	}
}

func TestSlotsPackedReads(t *testing.T) {
	rule := slotsTestRule(time.Hour, true, true)
	meta := bson.E{Key: "meta", Value: "/a"}
	start := bson.E{Key: "start", Value: rwtest.DT(0)}
	packed := bson.D{meta, start, {Key: "num_samples", Value: int64(3)},
		packedValues(t, bson.D{{Key: "0", Value: int32(0)}, {Key: "61", Value: 1.5}, {Key: "3599", Value: "x"}})}
	document := bson.D{meta, start, {Key: "num_samples", Value: int64(3)},
		{Key: "values", Value: bson.D{{Key: "0", Value: bson.D{{Key: "0", Value: int32(0)}, {Key: "7", Value: int32(0)}}},
			{Key: "1", Value: bson.D{{Key: "1", Value: 1.5}}}, {Key: "59", Value: bson.D{{Key: "59", Value: "x"}}}}},
		{Key: "set", Value: bson.D{{Key: "0", Value: bson.D{{Key: "0", Value: true}, {Key: "7", Value: false}}},
			{Key: "1", Value: bson.D{{Key: "1", Value: true}}}, {Key: "59", Value: bson.D{{Key: "59", Value: true}}}}}}
	want := []string{`00:00:00={"$numberInt":"0"}`, `00:01:01={"$numberDouble":"1.5"}`, `00:59:59="x"`}
	for name, b := range map[string]bson.D{"packed": packed, "document form": document} {
		got := findAll(t, rule, b)
		if len(got) != len(want) {
			t.Fatalf("%s: %q, want %q", name, got, want)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("%s: %q, want %q", name, got, want)
			}
		}
	}
	// A packed shell holds nothing.
	shell := SlotsShell(rule, bsoncore.Value{Type: bsoncore.TypeString, Data: bsoncore.AppendString(nil, "/a")}, 0, true)
	var sh bson.D
	if err := bson.Unmarshal(shell, &sh); err != nil {
		t.Fatal(err)
	}
	if got := findAll(t, rule, sh); len(got) != 0 {
		t.Fatalf("a packed shell reads as %q, want nothing", got)
	}
	// A damaged packed field fails the read, naming the bucket: never a
	// wrong answer.
	for name, v := range map[string]bson.Binary{
		"not BSON":           {Subtype: SlotsPackedSubtype, Data: []byte{9, 0, 0, 0, 1, 'x', 0}},
		"not zstd":           {Subtype: SlotsPackedZstdSubtype, Data: []byte{1, 2, 3, 4, 5, 6, 7, 8}},
		"an unknown subtype": {Subtype: 0x83, Data: []byte{5, 0, 0, 0, 0}},
		"a generic binary":   {Subtype: 0, Data: []byte{5, 0, 0, 0, 0}},
	} {
		bad := bson.D{{Key: "_id", Value: bson.ObjectID{1}}, meta, start, {Key: "num_samples", Value: int64(1)}, {Key: "values", Value: v}}
		r, err := PlanRead(rwtest.Doc(t, bson.D{{Key: "find", Value: "readings"}, {Key: "$db", Value: "iot"}}), rule)
		if err != nil {
			t.Fatal(err)
		}
		r.Next()
		if _, err := r.Feed(rwtest.CursorReply(t, 0, bad)); err == nil || !strings.Contains(err.Error(), "bucket 010000000000000000000000") {
			t.Fatalf("%s: read error %v, want one naming the bucket", name, err)
		}
	}
}

func TestSlotsPackedCompressed(t *testing.T) {
	// An hour of one-second doubles, merged packed: compressed, and read
	// back whole.
	rule := slotsTestRule(time.Hour, true, false)
	var evs []bson.D
	for s := range 3600 {
		evs = append(evs, sample("/a", rwtest.DT(int64(s)*1000), float64(s%97)/4))
	}
	w, err := SlotsMergeWrites(rule, GroupStaged(rule, stagedEvents(t, rule, evs...)), func(bucket.Key) (bsoncore.Document, bool) { return nil, false }, true)
	if err != nil {
		t.Fatal(err)
	}
	doc := w.Inserts[0].Doc
	sub, data, _ := doc.Lookup("values").BinaryOK()
	if sub != SlotsPackedZstdSubtype || len(data) > 25_000 {
		t.Fatalf("values: subtype %#x, %d bytes; want zstd (%#x), well under the 50 KB raw", sub, len(data), SlotsPackedZstdSubtype)
	}
	var d bson.D
	if err := bson.Unmarshal(doc, &d); err != nil {
		t.Fatal(err)
	}
	got := findAll(t, rule, d)
	if len(got) != 3600 || got[3599] != `00:59:59={"$numberDouble":"2.5"}` {
		t.Fatalf("%d documents read, the last %q", len(got), got[len(got)-1])
	}
	// packed: false keeps the document form on this upstream too.
	unpacked := slotsTestRule(time.Hour, true, false)
	unpacked.LayoutOptions.Unpacked = true
	w, _ = SlotsMergeWrites(unpacked, GroupStaged(unpacked, stagedEvents(t, unpacked, evs...)), func(bucket.Key) (bsoncore.Document, bool) { return nil, false }, true)
	if v := w.Inserts[0].Doc.Lookup("values"); v.Type != bsoncore.TypeEmbeddedDocument {
		t.Fatalf("packed: false: values is a %s, want a document", v.Type)
	}
	// With bucket.compression: none, raw.
	rule.Compression = rules.CompressionNone
	w, _ = SlotsMergeWrites(rule, GroupStaged(rule, stagedEvents(t, rule, evs...)), func(bucket.Key) (bsoncore.Document, bool) { return nil, false }, true)
	if sub, _, _ := w.Inserts[0].Doc.Lookup("values").BinaryOK(); sub != SlotsPackedSubtype {
		t.Fatalf("compression none: subtype %#x, want %#x", sub, SlotsPackedSubtype)
	}
}

func TestSlotsPackedDirectWrite(t *testing.T) {
	rule := slotsTestRule(time.Minute, true, false)
	id := bucket.IDOf(rule.BucketNamespace(), rawOf("/a"), 0, 0)
	events := []bson.D{sample("/a", rwtest.DT(1000), int64(5)), sample("/a", rwtest.DT(3000), int64(1))}
	storedDoc := rwtest.Doc(t, bson.D{{Key: "num_samples", Value: int64(2)}, {Key: "total_samples", Value: int64(30)}, {Key: "values", Value: bson.D{{Key: "1", Value: int64(10)}, {Key: "2", Value: int64(20)}}}})
	storedPacked := rwtest.Doc(t, bson.D{{Key: "num_samples", Value: int64(2)}, {Key: "total_samples", Value: int64(30)}, packedValues(t, bson.D{{Key: "1", Value: int64(10)}, {Key: "2", Value: int64(20)}})})
	head := bson.D{{Key: "_id", Value: id}, {Key: "meta", Value: "/a"}, {Key: "start", Value: rwtest.DT(0)}, {Key: "num_samples", Value: int64(3)}, {Key: "total_samples", Value: int64(26)}}
	stmt := func(u bson.D) bson.D {
		return bson.D{{Key: "q", Value: bson.D{{Key: "_id", Value: id}}}, {Key: "u", Value: u}, {Key: "upsert", Value: true}}
	}
	cases := []struct {
		name   string
		packed bool
		before bsoncore.Document
		want   bson.D
	}{
		{"a packed upstream: the whole bucket, packed", true, storedDoc,
			stmt(append(head, packedValues(t, bson.D{{Key: "1", Value: int64(5)}, {Key: "2", Value: int64(20)}, {Key: "3", Value: int64(1)}})))},
		{"a packed bucket elsewhere: the whole bucket, in the document form", false, storedPacked,
			stmt(append(head, bson.E{Key: "values", Value: bson.D{{Key: "1", Value: int64(5)}, {Key: "2", Value: int64(20)}, {Key: "3", Value: int64(1)}}}))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := SlotsInsert(rwtest.BodyCmd(t, events), rule, SlotsOptions{Caps: caps.Upstream{PackedEvents: tc.packed}, Before: func(bucket.Key) []byte { return tc.before }})
			if err != nil {
				t.Fatal(err)
			}
			rwtest.AssertDoc(t, "command", p.Commands[0], rwtest.UpdateCmd(true, []bson.D{tc.want}))
		})
	}
}
