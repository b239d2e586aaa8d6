package layout

import (
	"strconv"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
	"github.com/tsproxy/tsproxy/rules"
)

// BenchmarkSlotsPackedRead: a find of ten hosts' hours of one-second
// samples, each hour one compressed packed bucket (the form a merge
// writes on FerretDB): fetch, decode and expand to 36,000 documents.
func BenchmarkSlotsPackedRead(b *testing.B) {
	rule := slotsTestRule(time.Hour, true, false)
	var buckets []bsoncore.Document
	for h := range 10 {
		var evs []bson.D
		for s := range 3600 {
			evs = append(evs, sample("/h"+string(rune('a'+h)), rwtest.DT(int64(s)*1000), float64(s%97)/4))
		}
		w, err := SlotsMergeWrites(rule, GroupStaged(rule, stagedEvents(b, rule, evs...)), func(bucket.Key) (bsoncore.Document, bool) { return nil, false }, true)
		if err != nil {
			b.Fatal(err)
		}
		buckets = append(buckets, w.Inserts[0].Doc)
	}
	var docs []any
	for _, d := range buckets {
		docs = append(docs, bson.Raw(d))
	}
	reply := rwtest.Doc(b, bson.D{{Key: "cursor", Value: bson.D{{Key: "id", Value: int64(0)}, {Key: "ns", Value: "iot.readings.buckets"}, {Key: "firstBatch", Value: docs}}}, {Key: "ok", Value: 1.0}})
	cmd := rwtest.Doc(b, bson.D{{Key: "find", Value: "readings"}, {Key: "batchSize", Value: 100_000}, {Key: "$db", Value: "iot"}})
	b.ReportAllocs()
	for b.Loop() {
		r, err := PlanRead(cmd, rule)
		if err != nil {
			b.Fatal(err)
		}
		if r.Next() == nil {
			b.Fatal("no fetch")
		}
		if _, err := r.Feed(reply); err != nil {
			b.Fatal(err)
		}
		if out, _ := r.Result(1); len(out) < 36_000*20 {
			b.Fatalf("reply of %d bytes", len(out))
		}
	}
}

func TestSlotKey(t *testing.T) {
	cases := []struct {
		key  string
		n    int
		want int
		ok   bool
	}{
		{"0", 60, 0, true},
		{"59", 60, 59, true},
		{"60", 60, 0, false},
		{"007", 60, 7, true},
		{"", 60, 0, false},
		{"-1", 60, 0, false},
		{"+1", 60, 0, false},
		{"1a", 60, 0, false},
		{"99999999999999999999999", 3600, 0, false}, // would overflow an int
	}
	for _, c := range cases {
		if got, ok := slotKey([]byte(c.key), c.n); got != c.want || ok != c.ok {
			t.Errorf("slotKey(%q, %d) = %d, %v; want %d, %v", c.key, c.n, got, ok, c.want, c.ok)
		}
	}
}

// TestExpandSizes: expand's buffer is sized exactly, so the documents of
// a read are made without growing it.
func TestExpandSizes(t *testing.T) {
	for _, withMeta := range []bool{true, false} {
		rule := slotsTestRule(time.Hour, true, false)
		meta := bsoncore.Value{Type: bsoncore.TypeNull}
		if withMeta {
			meta = bsoncore.Value{Type: bsoncore.TypeString, Data: bsoncore.AppendString(nil, "/a")}
		}
		for _, slot := range []int{0, 9, 10, 3599} {
			ws := writtenSlot{slot: slot, v: bsoncore.Value{Type: bsoncore.TypeDouble, Data: bsoncore.AppendDouble(nil, 2.5)}, weight: 1}
			di, d := bsoncore.AppendDocumentStart(nil)
			d = appendSlotID(d, [12]byte{1, 2, 3}, slot)
			if withMeta {
				d = bsoncore.AppendValueElement(d, rule.MetaField, meta)
			}
			d = bsoncore.AppendDateTimeElement(d, rule.TimeField, 0)
			d = bsoncore.AppendValueElement(d, rule.LayoutOptions.ValueField, ws.v)
			d, _ = bsoncore.AppendDocumentEnd(d, di)
			if got := layoutDocSize(rule, rule.LayoutOptions.ValueField, meta, ws); got != len(d) {
				t.Errorf("meta %v slot %d: size %d, document %d bytes", withMeta, slot, got, len(d))
			}
			if err := bsoncore.Document(d).Validate(); err != nil {
				t.Errorf("slot %d: %v", slot, err)
			}
			want := "010203000000000000000000:" + strconv.Itoa(slot)
			if id, _ := bsoncore.Document(d).Lookup("_id").StringValueOK(); id != want {
				t.Errorf("_id %q, want %q", id, want)
			}
		}
	}
}

// TestEachSlotSkipsDamagedGroup: a damaged group of a nested slot map is
// skipped, and the groups after it are read.
func TestEachSlotSkipsDamagedGroup(t *testing.T) {
	bad := []byte{8, 0, 0, 0, 0x10, 'a', 'b', 0} // an int32 element cut short
	good := bsoncore.NewDocumentBuilder().AppendInt32("5", 7).Build()
	m := bsoncore.NewDocumentBuilder().AppendDocument("0", bad).AppendDocument("1", good).Build()
	var got []int
	eachSlot(m, true, 2*rules.SlotGroup, func(s int, v bsoncore.Value) { got = append(got, s) })
	if len(got) != 1 || got[0] != rules.SlotGroup+5 {
		t.Fatalf("slots %v, want [%d]", got, rules.SlotGroup+5)
	}
}
