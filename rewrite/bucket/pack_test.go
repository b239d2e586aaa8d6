package bucket

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// readings is the BSON of an array of n stored 1-second readings of one
// series, as a bucket packs them.
func readings(t testing.TB, n int) []byte {
	t.Helper()
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var chunk []Event
	for i := range n {
		d, err := bson.Marshal(bson.D{{Key: "_id", Value: bson.NewObjectID()}, {Key: "ts", Value: base.Add(time.Duration(i) * time.Second)},
			{Key: "sensor", Value: "s1"}, {Key: "value", Value: float64(i%1000) / 10}})
		if err != nil {
			t.Fatal(err)
		}
		st, err := AppendStoredEvent(nil, d, "sensor", false, nil)
		if err != nil {
			t.Fatal(err)
		}
		chunk = append(chunk, Event{Stored: st})
	}
	aidx, arr := bsoncore.AppendArrayStart(nil)
	arr = appendEventElements(arr, chunk)
	arr, _ = bsoncore.AppendArrayEnd(arr, aidx)
	return arr
}

// packedValue is the binary value appendPacked wrote.
func packedValue(t testing.TB, arr []byte, compress bool) bsoncore.Value {
	t.Helper()
	el := bsoncore.Element(appendPacked(nil, FieldPacked, arr, compress))
	v, err := el.ValueErr()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// A packed array is compressed when asked and worth it, raw otherwise,
// and unpacks to the same bytes either way.
func TestPackRoundTrip(t *testing.T) {
	random := make([]byte, 4000)
	_, _ = rand.Read(random)
	incompressible := bsoncore.NewArrayBuilder().AppendBinary(0, random).Build()
	cases := []struct {
		name        string
		arr         []byte
		compress    bool
		wantSubtype byte
	}{
		{"1000 readings", readings(t, 1000), true, SubtypeZstdArray},
		{"1000 readings, compression off", readings(t, 1000), false, SubtypeArray},
		{"a few readings, under minCompressBytes", readings(t, 3), true, SubtypeArray},
		{"incompressible: the frame would be larger", incompressible, true, SubtypeArray},
		{"empty array", bsoncore.NewArrayBuilder().Build(), true, SubtypeArray},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := packedValue(t, c.arr, c.compress)
			subtype, data := v.Binary()
			if subtype != c.wantSubtype {
				t.Fatalf("subtype %#x, want %#x", subtype, c.wantSubtype)
			}
			if subtype == SubtypeZstdArray && len(data)*3 > len(c.arr) {
				t.Errorf("compressed %d bytes to %d: less than 3x", len(c.arr), len(data))
			}
			got, err := unpack(FieldPacked, v)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, c.arr) {
				t.Fatalf("unpacked %d bytes, not the %d packed", len(got), len(c.arr))
			}
		})
	}
}

// A packed value that is not what a proxy writes is refused with an error
// that names the field and what is wrong, never a panic or a huge
// allocation.
func TestUnpackRefuses(t *testing.T) {
	good := packedValue(t, readings(t, 200), true)
	_, frame := good.Binary()
	truncated := bsoncore.Value{Type: bsoncore.TypeBinary, Data: bsoncore.AppendBinary(nil, SubtypeZstdArray, frame[:len(frame)/2])}
	flipped := bytes.Clone(frame)
	flipped[len(flipped)-6] ^= 0xff
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	notArray := enc.EncodeAll([]byte("not BSON at all, but compressed all the same"), nil)
	huge := bsoncore.NewArrayBuilder().AppendBinary(0, make([]byte, MaxUnpackedBytes)).Build()
	bomb := enc.EncodeAll(huge, nil)
	// A frame header that claims more than the limit (single segment,
	// content size in 8 bytes), then an empty last raw block.
	claim := []byte{0x28, 0xb5, 0x2f, 0xfd, 0xe0}
	claim = binary.LittleEndian.AppendUint64(claim, 1<<40)
	claim = append(claim, 0x01, 0x00, 0x00)
	bin := func(subtype byte, data []byte) bsoncore.Value {
		return bsoncore.Value{Type: bsoncore.TypeBinary, Data: bsoncore.AppendBinary(nil, subtype, data)}
	}
	cases := []struct {
		name string
		v    bsoncore.Value
		want string
	}{
		{"not binary", bsoncore.Value{Type: bsoncore.TypeString, Data: bsoncore.AppendString(nil, "x")}, "is a string, not binary data"},
		{"unknown subtype", bin(0x05, []byte{5, 0, 0, 0, 0}), "subtype 0x5, not a packed array"},
		{"raw, not an array", bin(SubtypeArray, []byte{1, 2, 3}), "does not hold a BSON array"},
		{"truncated frame", truncated, "damaged compressed events"},
		{"damaged frame", bin(SubtypeZstdArray, flipped), "damaged compressed events"},
		{"not a frame", bin(SubtypeZstdArray, []byte("hello")), "damaged compressed events"},
		{"a frame of something else", bin(SubtypeZstdArray, notArray), "does not hold a BSON array"},
		{"a frame that claims too much", bin(SubtypeZstdArray, claim), "claim 1099511627776 bytes, more than the limit"},
		{"a frame that unpacks to too much", bin(SubtypeZstdArray, bomb), "more than the limit"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := unpack(FieldPacked, c.v)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), FieldPacked) {
				t.Fatalf("error %v, want one naming %q with %q", err, FieldPacked, c.want)
			}
		})
	}
}

// Compressed and raw packed values are read alike by every reader: a
// bucket written by an earlier proxy (raw) and a staged document with a
// compressed first group and raw other groups.
func TestEventValuesEitherPacking(t *testing.T) {
	arr := readings(t, 300)
	for _, compress := range []bool{false, true} {
		idx, doc := bsoncore.AppendDocumentStart(nil)
		doc = bsoncore.AppendObjectIDElement(doc, FieldID, bson.NewObjectID())
		doc = appendPacked(doc, FieldPacked, arr, compress)
		doc, _ = bsoncore.AppendDocumentEnd(doc, idx)
		vals, err := EventValues(doc)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := bsoncore.Array(arr).Values()
		if len(vals) != len(want) {
			t.Fatalf("compress %v: %d events, want %d", compress, len(vals), len(want))
		}
		for i := range vals {
			if !vals[i].Equal(want[i]) {
				t.Fatalf("compress %v: event %d differs", compress, i)
			}
		}
	}
}

// FuzzUnpack: whatever a packed value holds, unpack answers without a
// panic; and any array packed (compressed or not) unpacks to itself.
func FuzzUnpack(f *testing.F) {
	f.Add(byte(SubtypeZstdArray), []byte(packedData(f, readings(f, 40), true)))
	f.Add(byte(SubtypeArray), []byte(packedData(f, readings(f, 2), false)))
	f.Add(byte(SubtypeZstdArray), []byte("\x28\xb5\x2f\xfd"))
	f.Fuzz(func(t *testing.T, subtype byte, data []byte) {
		v := bsoncore.Value{Type: bsoncore.TypeBinary, Data: bsoncore.AppendBinary(nil, subtype, data)}
		arr, err := unpack(FieldPacked, v)
		if err != nil {
			return
		}
		for _, compress := range []bool{false, true} {
			again, err := unpack(FieldPacked, packedValue(t, arr, compress))
			if err != nil {
				t.Fatalf("an array unpacked from input does not unpack once packed again (compress %v): %v", compress, err)
			}
			if !bytes.Equal(again, arr) {
				t.Fatalf("packed again (compress %v), it unpacks to other bytes", compress)
			}
		}
	})
}

func packedData(t testing.TB, arr []byte, compress bool) []byte {
	_, data := packedValue(t, arr, compress).Binary()
	return data
}
