package merge

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/stage"
)

// TestPlanDocRoundTrip: a plan reads back as it was written, packed;
// the array form of proxies before packing still reads; a damaged
// packed value is refused rather than read as fewer documents.
func TestPlanDocRoundTrip(t *testing.T) {
	oid := func(b byte) bson.ObjectID { return bson.ObjectID{0xee, b} }
	key := func(id bson.ObjectID) string { return string(rune(bsoncore.TypeObjectID)) + string(id[:]) }
	want := &mergePlan{
		bases: map[string]int{"k1": 3, "k2": 0},
		skip:  map[bson.ObjectID]bool{oid(1): true, oid(2): true},
		ids:   map[string]bool{key(oid(3)): true, key(oid(4)): true, string(rune(bsoncore.TypeString)) + "\x06\x00\x00\x00named\x00": true},
		mark:  "m",
	}
	got, err := readPlan(planDoc(want))
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(got.bases, want.bases) || !maps.Equal(got.skip, want.skip) || !maps.Equal(got.ids, want.ids) || got.mark != want.mark {
		t.Fatalf("read back %+v, wrote %+v", got, want)
	}
	// Fenced from proxies before packing: they read "bases" or
	// "topUpBases" only, and stop without them.
	doc := planDoc(want)
	for _, old := range []string{"bases", "topUpBases", "ids", "skip"} {
		if _, err := doc.LookupErr(old); err == nil {
			t.Errorf("a packed plan has %q, which a proxy before packing would misread", old)
		}
	}

	old := bsoncore.NewDocumentBuilder().AppendString("_id", planID).
		AppendArray("topUpBases", bsoncore.NewArrayBuilder().AppendDocument(bsoncore.NewDocumentBuilder().AppendBinary("k", 0, []byte("k1")).AppendInt32("s", 3).Build()).Build()).
		AppendArray("skip", bsoncore.NewArrayBuilder().AppendObjectID(oid(1)).Build()).
		AppendArray("ids", bsoncore.NewArrayBuilder().AppendBinary(0, []byte(key(oid(3)))).AppendBinary(0, []byte(key(oid(4)))).Build()).Build()
	got, err = readPlan(old)
	if err != nil {
		t.Fatal(err)
	}
	if got.bases["k1"] != 3 || len(got.bases) != 1 || !got.skip[oid(1)] || len(got.ids) != 2 || !got.ids[key(oid(4))] {
		t.Fatalf("array plan read as %+v", got)
	}

	cut := planDoc(want)
	_, packed, _ := cut.Lookup(planIDs).BinaryOK()
	damaged := bsoncore.NewDocumentBuilder().AppendString("_id", planID).
		AppendArray(planBases, bsoncore.NewArrayBuilder().Build()).AppendBinary(planIDs, 0, packed[:len(packed)-1]).Build()
	if _, err := readPlan(damaged); err == nil {
		t.Fatal("a plan whose packed ids are cut short was read")
	}
	odd := bsoncore.NewDocumentBuilder().AppendString("_id", planID).
		AppendArray(planBases, bsoncore.NewArrayBuilder().Build()).AppendBinary(planSkip, 0, make([]byte, 13)).Build()
	if _, err := readPlan(odd); err == nil {
		t.Fatal("a plan whose packed skip is not whole ids was read")
	}
	if _, err := readPlan(bsoncore.NewDocumentBuilder().AppendString("_id", planID).Build()); err == nil {
		t.Fatal("a plan without bases was read")
	}
	// A seq no merge writes (planDoc keeps seqs in an int32, and they
	// stay under bucket.MaxSeq) is a damaged plan, not a base.
	for _, seq := range []int64{-1, bucket.MaxSeq + 1, 1 << 40} {
		base := bsoncore.NewDocumentBuilder().AppendBinary("k", 0, []byte("k1")).AppendInt64("s", seq).Build()
		bad := bsoncore.NewDocumentBuilder().AppendString("_id", planID).
			AppendArray(planBases, bsoncore.NewArrayBuilder().AppendDocument(base).Build()).Build()
		if _, err := readPlan(bad); err == nil {
			t.Errorf("a plan with base seq %d was read", seq)
		}
	}
}

// FuzzStoredBookkeeping: the merge's own documents as the upstream hands
// them back (a plan, a record of merged retryable writes) are read by
// the background merger, outside any connection's recover, so no bytes
// may panic either reader; a plan that reads writes back as itself, and
// a packed record's ids as themselves.
func FuzzStoredBookkeeping(f *testing.F) {
	oid := func(b byte) bson.ObjectID { return bson.ObjectID{0xee, b} }
	f.Add([]byte(planDoc(&mergePlan{
		bases: map[string]int{"k1": 3, "k2": 0},
		skip:  map[bson.ObjectID]bool{oid(1): true},
		ids:   map[string]bool{string(rune(bsoncore.TypeObjectID)) + "\xee\x03\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00": true},
		mark:  "m",
	})))
	f.Add([]byte(bsoncore.NewDocumentBuilder().AppendString("_id", planID).
		AppendArray("bases", bsoncore.NewArrayBuilder().AppendDocument(bsoncore.NewDocumentBuilder().AppendBinary("k", 0, []byte("k1")).AppendInt64("s", 1<<40).Build()).Build()).
		AppendArray("skip", bsoncore.NewArrayBuilder().AppendObjectID(oid(1)).AppendString("x").Build()).
		AppendArray("ids", bsoncore.NewArrayBuilder().AppendBinary(0, []byte("a")).Build()).Build()))
	f.Add([]byte(stage.RecordDoc("7", []bson.ObjectID{oid(1), oid(2)}, time.UnixMilli(0))))
	f.Add([]byte(bsoncore.NewDocumentBuilder().AppendInt64("_id", 1).
		AppendArray("ids", bsoncore.NewArrayBuilder().AppendObjectID(oid(4)).Build()).Build()))
	f.Fuzz(func(t *testing.T, data []byte) {
		d := bsoncore.Document(data)
		if p, err := readPlan(d); err == nil {
			q, err := readPlan(planDoc(p))
			if err != nil {
				t.Fatalf("a plan read from %x does not read back once written: %v", data, err)
			}
			if !maps.Equal(q.bases, p.bases) || !maps.Equal(q.skip, p.skip) || !maps.Equal(q.ids, p.ids) || q.mark != p.mark {
				t.Fatalf("plan %+v wrote and read back as %+v", p, q)
			}
		}
		ids := stage.RecordIDs(d)
		if _, err := d.LookupErr("ids"); err != nil {
			if got := stage.RecordIDs(stage.RecordDoc("1", ids, time.UnixMilli(0))); !slices.Equal(got, ids) {
				t.Fatalf("record ids %v wrote and read back as %v", ids, got)
			}
		}
	})
}

// TestRecordKeys: a merge's record key round-trips through its record;
// a key of digits is a token, stored as one (the records of proxies
// before merge keys, whose repeated merges must meet their own record).
func TestRecordKeys(t *testing.T) {
	r := stage.Collection{Name: "tsproxy_stage_x_0_m7", Token: 7}
	key := stage.NewRecordKey(r)
	if key == stage.NewRecordKey(r) || !strings.HasPrefix(key, r.Name+"/") {
		t.Fatalf("keys %q: want the name and a random part", key)
	}
	for _, k := range []string{key, "7"} {
		d := stage.RecordDoc(k, []bson.ObjectID{{0xee, 1}}, time.UnixMilli(0))
		if got := stage.RecordKeyOf(d); got != k {
			t.Fatalf("key %q read back as %q", k, got)
		}
	}
	if _, ok := stage.RecordDoc("7", nil, time.UnixMilli(0)).Lookup("_id").Int64OK(); !ok {
		t.Fatal("a token key is not stored as a token")
	}
	if got := recordKey(r, &mergePlan{}); got != "7" {
		t.Fatalf("a plan without a key: %q, want the token", got)
	}
	if got := recordKey(r, &mergePlan{record: key}); got != key {
		t.Fatalf("a plan's key: %q", got)
	}
	p, err := readPlan(planDoc(&mergePlan{bases: map[string]int{}, record: key}))
	if err != nil || p.record != key {
		t.Fatalf("plan read back: %+v, %v", p, err)
	}
}
