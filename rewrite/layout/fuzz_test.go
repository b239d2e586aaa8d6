package layout

import (
	"bytes"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
)

// FuzzSlotGrid reads arbitrary bytes as a stored slots bucket's packed
// values (raw or zstd, as the first byte says) and as a whole bucket, and
// as a counter's slots: no panic, slots within the window, no negative
// count, and what it read packs and reads back the same.
func FuzzSlotGrid(f *testing.F) {
	inner, _ := bson.Marshal(bson.D{{Key: "0", Value: 1.5}, {Key: "61", Value: "x"}, {Key: "3599", Value: int64(7)}})
	z, _ := bucket.Compress(bytes.Repeat(inner, 40)) // long enough to compress
	f.Add(byte(0), inner)
	f.Add(byte(1), z)
	f.Add(byte(2), []byte{5, 0, 0, 0, 0})
	doc, _ := bson.Marshal(bson.D{{Key: "values", Value: bson.D{{Key: "1", Value: bson.D{{Key: "2", Value: true}}}}}, {Key: "set", Value: bson.D{{Key: "1", Value: bson.D{{Key: "2", Value: true}}}}}})
	f.Add(byte(2), doc)
	f.Add(byte(5), doc)
	// A group number whose slot would overflow an int.
	huge, _ := bson.Marshal(bson.D{{Key: "values", Value: bson.D{{Key: "9223372036854775807", Value: bson.D{{Key: "1", Value: 1.5}}}}}})
	f.Add(byte(2), huge)
	f.Fuzz(func(t *testing.T, form byte, data []byte) {
		// form: the values' form (mod 3), and preallocate (bit 2).
		o := slotsTestRule(time.Hour, false, form&4 != 0).LayoutOptions
		var stored bsoncore.Document
		switch form % 3 {
		case 0:
			stored = bsoncore.NewDocumentBuilder().AppendBinary("values", SlotsPackedSubtype, data).Build()
		case 1:
			stored = bsoncore.NewDocumentBuilder().AppendBinary("values", SlotsPackedZstdSubtype, data).Build()
		default:
			if bsoncore.Document(data).Validate() != nil {
				return
			}
			stored = data
		}
		// The same bytes as a counter's slots: no panic, no negative
		// count.
		counter := stored
		if v := stored.Lookup("values"); v.Type == bsoncore.TypeBinary {
			sub, bin, _ := v.BinaryOK()
			counter = bsoncore.NewDocumentBuilder().AppendBinary("slots", sub, bin).Build()
		}
		if counts, err := readCounterSlots(counter, o.SlotsPerWindow()); err == nil {
			for s, c := range counts {
				if c < 0 {
					t.Fatalf("slot %d counted %d", s, c)
				}
			}
		}
		g, err := readSlotGrid(stored, o)
		if err != nil {
			return
		}
		if len(g.vals) != o.SlotsPerWindow() || len(g.written) != o.SlotsPerWindow() {
			t.Fatalf("grid of %d/%d slots, want %d", len(g.vals), len(g.written), o.SlotsPerWindow())
		}
		packed := bsoncore.Document(appendPackedSlotsDoc(g))
		again, err := readSlotGrid(packed, o)
		if err != nil {
			t.Fatalf("reading back what it packed: %v", err)
		}
		for s := range g.written {
			if g.written[s] != again.written[s] || (g.written[s] && (g.vals[s].Type != again.vals[s].Type || !bytes.Equal(g.vals[s].Data, again.vals[s].Data))) {
				t.Fatalf("slot %d: %v %v, read back %v %v", s, g.written[s], g.vals[s], again.written[s], again.vals[s])
			}
		}
	})
}

// appendPackedSlotsDoc is a bucket holding only g's slots, packed and
// compressed where that is smaller.
func appendPackedSlotsDoc(g slotGrid) []byte {
	di, d := bsoncore.AppendDocumentStart(nil)
	d = appendPackedMap(d, "values", g, true)
	d, _ = bsoncore.AppendDocumentEnd(d, di)
	return d
}
