package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
)

func TestCompressorID(t *testing.T) {
	for name, id := range map[string]uint8{"noop": 0, "snappy": 1, "zlib": 2, "zstd": 3} {
		got, ok := CompressorID(name)
		if !ok || got != id || CompressorName(id) != name {
			t.Errorf("%s: %d %v", name, got, ok)
		}
	}
	if _, ok := CompressorID("lz4"); ok || CompressorName(9) != "" {
		t.Error("unknown compressor accepted")
	}
}

func TestCompressRoundTrip(t *testing.T) {
	var docs [][]byte
	for i := range 50 {
		docs = append(docs, mdoc(t, D("_id", i, "sensor", "temperature-1", "v", 20.5)))
	}
	msg := frame(OpMsg, 21, 20, u32(0), kind0(mdoc(t, D("insert", "events", "$db", "m"))), kind1("documents", docs...))
	query := queryFrame(0, "admin.$cmd", 0, 1, mdoc(t, D("isMaster", 1)))
	for _, orig := range [][]byte{msg, query} {
		for _, name := range []string{"noop", "snappy", "zlib", "zstd"} {
			id, _ := CompressorID(name)
			c, err := Compress(orig, id)
			if err != nil {
				t.Fatalf("%s: Compress: %v", name, err)
			}
			var cm Compressed
			if err := cm.Decode(c); err != nil {
				t.Fatalf("%s: Decode: %v", name, err)
			}
			oh, _ := ParseHeader(orig)
			if cm.CompressorID != id || cm.OriginalOpCode != oh.OpCode || int(cm.UncompressedSize) != len(orig)-16 {
				t.Fatalf("%s: %+v", name, cm)
			}
			if name != "noop" && orig[0] == msg[0] && len(c) >= len(orig) {
				t.Errorf("%s: %d bytes compressed to %d", name, len(orig), len(c))
			}
			// Decode/Encode round trip of the OP_COMPRESSED frame itself.
			ch, _ := ParseHeader(c)
			if ch.RequestID != 21 && ch.RequestID != 11 {
				t.Fatalf("%s: header %+v", name, ch)
			}
			again, err := cm.Encode(nil, ch)
			if err != nil || !bytes.Equal(again, c) {
				t.Fatalf("%s: Encode: %v", name, err)
			}
			back, err := Decompress(c)
			if err != nil {
				t.Fatalf("%s: Decompress: %v", name, err)
			}
			if !bytes.Equal(back, orig) {
				t.Fatalf("%s: round trip differs", name)
			}
		}
	}
}

func TestCompressErrors(t *testing.T) {
	msg := AppendMsg(nil, 1, 0, 0, mdoc(t, D("ping", 1)))
	if _, err := Compress(msg, 7); err == nil {
		t.Fatal("unknown compressor")
	}
	c, _ := Compress(msg, CompressorSnappy)
	if _, err := Compress(c, CompressorSnappy); err == nil {
		t.Fatal("compressed twice")
	}
	if _, err := Compress(msg[:20], CompressorSnappy); !errors.Is(err, ErrMalformed) {
		t.Fatalf("length lie: %v", err)
	}
}

func compFrame(orig OpCode, size int32, id uint8, payload []byte) []byte {
	b := binary.LittleEndian.AppendUint32(nil, uint32(orig))
	b = binary.LittleEndian.AppendUint32(b, uint32(size))
	b = append(b, id)
	return frame(OpCompressed, 1, 0, b, payload)
}

func TestDecompressErrors(t *testing.T) {
	payload := AppendMsg(nil, 1, 0, 0, mdoc(t, D("ping", 1)))[16:]
	snappy, _ := Compress(AppendMsg(nil, 1, 0, 0, mdoc(t, D("ping", 1))), CompressorSnappy)
	zl, _ := Compress(AppendMsg(nil, 1, 0, 0, mdoc(t, D("ping", 1))), CompressorZlib)

	// A zstd bomb: a small frame that decompresses to far more than allowed.
	enc, _ := zstd.NewWriter(nil)
	bomb := enc.EncodeAll(make([]byte, 64<<20), nil)

	wrongSize := func(f []byte, delta int32) []byte {
		f = bytes.Clone(f)
		binary.LittleEndian.PutUint32(f[20:], binary.LittleEndian.Uint32(f[20:])+uint32(delta))
		return f
	}
	for _, tc := range []struct {
		name, want string
		frame      []byte
		isLimit    bool
	}{
		{"short", "too short for its fixed fields", frame(OpCompressed, 1, 0, u32(2013)), false},
		{"nested", "original opcode is OP_COMPRESSED", compFrame(OpCompressed, 10, 0, payload), false},
		{"negative size", "uncompressed size -1 below minimum 0", compFrame(OpMsg, -1, 0, payload), true},
		{"oversized", "uncompressed size 48000000 exceeds maximum 47999984", compFrame(OpMsg, MaxMsgLen, 2, payload), true},
		{"unknown compressor", "unknown compressor id 9", compFrame(OpMsg, int32(len(payload)), 9, payload), false},
		{"noop size lie", "noop: uncompressed size", compFrame(OpMsg, int32(len(payload))+1, 0, payload), false},
		{"snappy size lie", "OP_COMPRESSED: snappy: ", wrongSize(snappy, 1), false},
		{"snappy garbage", "OP_COMPRESSED: snappy: ", compFrame(OpMsg, 10, 1, []byte{10, 0xff, 0xff}), false},
		{"zlib size lie", "OP_COMPRESSED: zlib: ", wrongSize(zl, 5), false},
		{"zlib garbage", "OP_COMPRESSED: zlib: ", compFrame(OpMsg, 10, 2, []byte("not zlib")), false},
		{"zstd garbage", "OP_COMPRESSED: zstd: ", compFrame(OpMsg, 10, 3, []byte("not zstd")), false},
		{"zstd bomb", "OP_COMPRESSED: zstd: ", compFrame(OpMsg, 100, 3, bomb), false},
		{"zstd size lie", "zstd: uncompressed size 1000 but decompressed", compFrame(OpMsg, 1000, 3, enc.EncodeAll(payload, nil)), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decompress(tc.frame)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrMalformed) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
			var le *LimitError
			if errors.As(err, &le) != tc.isLimit {
				t.Fatalf("%v: LimitError %v", err, !tc.isLimit)
			}
		})
	}
}

func TestCompressedDecodeEncode(t *testing.T) {
	f := compFrame(OpQuery, 3, 2, []byte("abc"))
	var c Compressed
	if err := c.Decode(f); err != nil {
		t.Fatal(err)
	}
	want := Compressed{OriginalOpCode: OpQuery, UncompressedSize: 3, CompressorID: 2, CompressedMessage: []byte("abc")}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("got %+v", c)
	}
	out, err := c.Encode(nil, Header{RequestID: 1})
	if err != nil || !bytes.Equal(out, f) {
		t.Fatalf("Encode: %v", err)
	}
}

// TestDecompressLimit: the original message's length is held to the
// caller's limit before anything is made, and a frame that claims more
// than its bytes hold costs about what it holds.
func TestDecompressLimit(t *testing.T) {
	body := append(u32(0), 0, 5, 0, 0, 0, 0) // flags, a kind-0 section of {}
	big := bytes.Repeat([]byte{'x'}, 100_000)
	for _, id := range []uint8{CompressorNoop, CompressorSnappy, CompressorZlib, CompressorZstd} {
		whole := frame(OpMsg, 7, 0, body, big)
		cf, err := Compress(whole, id)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := DecompressLimit(cf, len(whole)); err != nil {
			t.Fatalf("%s at its own length: %v", CompressorName(id), err)
		}
		_, err = DecompressLimit(cf, len(whole)-1)
		var le *LimitError
		if !errors.As(err, &le) || le.Size != int64(len(whole)) || le.Limit != int64(len(whole)-1) {
			t.Fatalf("%s over the limit (%d compressed bytes): %v, want a LimitError", CompressorName(id), len(cf), err)
		}
	}
	// Claims of 40-48 MB in a few bytes: refused without making them.
	zl, err := Compress(frame(OpMsg, 1, 0, body), CompressorZlib)
	if err != nil {
		t.Fatal(err)
	}
	snappyLie := []byte{0x80, 0xb4, 0x89, 0x13, 0} // a block that says 40,000,000 bytes
	for name, f := range map[string][]byte{
		"zlib":   compFrame(OpMsg, MaxMsgLen-HeaderLen, CompressorZlib, zl[25:]),
		"snappy": compFrame(OpMsg, 40_000_000, CompressorSnappy, snappyLie),
	} {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err := Decompress(f)
		runtime.ReadMemStats(&after)
		if err == nil {
			t.Fatalf("%s: decompressed a lie", name)
		}
		if got := after.TotalAlloc - before.TotalAlloc; got > 1<<20 {
			t.Fatalf("%s: a %d-byte frame made %d bytes before it failed (%v)", name, len(f), got, err)
		}
	}
}
