package bucket_test

import (
	"bytes"
	"math"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
)

func TestRoundTrip(t *testing.T) {
	rule := rwtest.InsertRule()
	rule.MaxEvents = 1000
	lim, err := bucket.LimitsOf(rule)
	if err != nil {
		t.Fatal(err)
	}
	d128, _ := bson.ParseDecimal128("-0.000E-6000")
	h128, l128 := d128.GetBytes()
	nb := bsoncore.NewDocumentBuilder
	// Fields in sorted order: an insert sorts a meta's fields (StoredMeta,
	// TestStoredMeta), and this test is about values of every type.
	metaDoc := nb().AppendDouble("a", math.Copysign(0, -1)).AppendInt32("b", 2).Build()
	var docs []bsoncore.Document
	for i := 0; i < 40; i++ {
		d := nb().
			AppendString("first", "x").
			AppendDouble("value", math.NaN()).
			AppendDecimal128("dec", h128, l128).
			AppendBinary("bin", 0x80, []byte{1, 2, 3}).
			AppendBinary("old", 0x02, []byte{4, 0, 0, 0, 9, 9, 9, 9}).
			AppendDateTime("ts", int64(-62135596800000)+int64(i)).
			AppendDocument("sensorId", metaDoc).
			AppendInt32("dup", 1).AppendString("dup", "two").
			AppendDouble("negz", math.Copysign(0, -1)).
			AppendUndefined("u").
			AppendSymbol("sym", "s").
			AppendDBPointer("dbp", "a.b", bson.ObjectID{1}).
			AppendCodeWithScope("cws", "f()", nb().AppendInt32("x", 1).Build()).
			AppendTimestamp("tsv", 1, 2).
			AppendMinKey("mn").AppendMaxKey("mx").
			AppendArray("arr", bsoncore.NewArrayBuilder().AppendDocument(nb().AppendNull("n").Build()).Build()).
			AppendObjectID("_id", bson.ObjectID{byte(i)}).
			Build()
		docs = append(docs, d)
	}
	for _, packed := range []bool{false, true} {
		for _, compress := range []bool{false, true} {
			l := lim
			l.Packed, l.Compress = packed, compress
			evs, errs := bucket.PrepareEvents(docs, true, rule, l, bson.NewObjectID)
			if len(errs) > 0 {
				t.Fatalf("%+v", errs)
			}
			var got []bsoncore.Document
			for _, g := range bucket.GroupEvents(evs) {
				for _, c := range bucket.ChunkEvents(g, l) {
					b := bucket.Complete(bson.NewObjectID(), c, rule, l)
					if err := b.Validate(); err != nil {
						t.Fatal(err)
					}
					stored, err := bucket.EventDocs(b)
					if err != nil {
						t.Fatal(err)
					}
					for _, s := range stored {
						r, err := bucket.RestoreMeta(s, rule.MetaField, func() (bsoncore.Value, error) { return b.Lookup("meta"), nil })
						if err != nil {
							t.Fatal(err)
						}
						got = append(got, r)
					}
				}
			}
			if len(got) != len(docs) {
				t.Fatalf("%d events back, want %d", len(got), len(docs))
			}
			for i := range docs {
				if !bytes.Equal(got[i], docs[i]) {
					t.Fatalf("packed=%v compress=%v event %d:\n got %s\nwant %s", packed, compress, i, bson.Raw(got[i]), bson.Raw(docs[i]))
				}
			}
		}
	}
}
