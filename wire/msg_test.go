package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/wiremessage"
)

func TestMsgDecodeGood(t *testing.T) {
	body := mdoc(t, D("insert", "events", "ordered", true, "$db", "test"))
	d1 := mdoc(t, D("_id", 1, "v", 1.5))
	d2 := mdoc(t, D("_id", 2, "v", "x"))
	upd := mdoc(t, D("q", D(), "u", D("$set", D("a", 1))))

	for _, tc := range []struct {
		name  string
		frame []byte
		want  Msg
	}{{
		name:  "body only",
		frame: frame(OpMsg, 7, 0, u32(0), kind0(body)),
		want:  Msg{Body: body},
	}, {
		name:  "body and two sequences",
		frame: frame(OpMsg, 7, 0, u32(0), kind0(body), kind1("documents", d1, d2), kind1("updates", upd)),
		want:  Msg{Body: body, Sequences: []Sequence{{"documents", [][]byte{d1, d2}}, {"updates", [][]byte{upd}}}},
	}, {
		name:  "sequence before body",
		frame: frame(OpMsg, 7, 0, u32(0), kind1("documents", d1), kind0(body)),
		want:  Msg{Body: body, Sequences: []Sequence{{"documents", [][]byte{d1}}}, bodyPos: 1},
	}, {
		name:  "empty sequence",
		frame: frame(OpMsg, 7, 0, u32(0), kind0(body), kind1("documents")),
		want:  Msg{Body: body, Sequences: []Sequence{{Identifier: "documents"}}},
	}, {
		name:  "checksum present and valid",
		frame: withChecksum(frame(OpMsg, 7, 0, u32(uint32(ChecksumPresent)), kind0(body), kind1("documents", d1))),
		want:  Msg{Flags: ChecksumPresent, Body: body, Sequences: []Sequence{{"documents", [][]byte{d1}}}},
	}, {
		name:  "moreToCome, exhaustAllowed and an unknown optional bit",
		frame: frame(OpMsg, 7, 0, u32(uint32(MoreToCome|ExhaustAllowed|1<<20)), kind0(body)),
		want:  Msg{Flags: MoreToCome | ExhaustAllowed | 1<<20, Body: body},
	}, {
		name:  "empty body document",
		frame: frame(OpMsg, 7, 0, u32(0), kind0([]byte{5, 0, 0, 0, 0})),
		want:  Msg{Body: []byte{5, 0, 0, 0, 0}},
	}, {
		name:  "nesting at the depth limit",
		frame: frame(OpMsg, 7, 0, u32(0), kind0(nested(MaxDepth))),
		want:  Msg{Body: nested(MaxDepth)},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			var m Msg
			if err := m.Decode(tc.frame); err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if !reflect.DeepEqual(m, tc.want) {
				t.Fatalf("Decode:\n got %+v\nwant %+v", m, tc.want)
			}
			// Round trip: Encode gives the same bytes.
			h, _ := ParseHeader(tc.frame)
			out, err := m.Encode([]byte("prefix"), h)
			if err != nil {
				t.Fatalf("Encode: %v", err)
			}
			if !bytes.Equal(out[6:], tc.frame) || string(out[:6]) != "prefix" {
				t.Fatalf("Encode:\n got %q\nwant %q", out, tc.frame)
			}
		})
	}
}

func TestMsgDecodeBad(t *testing.T) {
	body := mdoc(t, D("insert", "events", "$db", "test"))
	withDocs := mdoc(t, D("insert", "events", "documents", bson.A{}, "$db", "test"))
	d1 := mdoc(t, D("_id", 1))
	badBSON := append([]byte(nil), d1...)
	badBSON[4] = 0x7f // unknown element type
	badNested := mdoc(t, D("ts", 1, "m", D("x", int32(1))))
	badNested[len(badNested)-2-4-2-1] = 0x77 // the inner element's type byte: an unknown type
	big := u32(MaxDocLen + 1)

	okFrame := frame(OpMsg, 1, 0, u32(0), kind0(body))
	longer := append([]byte(nil), okFrame...)
	binary.LittleEndian.PutUint32(longer, uint32(len(okFrame)+10))
	shorter := append([]byte(nil), okFrame...)
	binary.LittleEndian.PutUint32(shorter, uint32(len(okFrame)-1))
	oversized := append([]byte(nil), okFrame...)
	binary.LittleEndian.PutUint32(oversized, 50_000_000)
	badSum := withChecksum(frame(OpMsg, 1, 0, u32(uint32(ChecksumPresent)), kind0(body)))
	badSum[len(badSum)-1] ^= 0xff
	unterminated := []byte{1, 8, 0, 0, 0, 'a', 'b', 'c', 'd'}

	for _, tc := range []struct {
		name    string
		frame   []byte
		want    string
		isLimit bool
	}{
		{"bad checksum", badSum, "OP_MSG: checksum mismatch", false},
		{"checksum flag without room for it", frame(OpMsg, 1, 0, u32(uint32(ChecksumPresent)), []byte{0, 0}), "checksum flag set but only 2 bytes", false},
		{"crafted 37-byte checksum message", crafted37(), "truncated body", false},
		{"short frame", okFrame[:10], "shorter than the 16-byte header", false},
		{"no flags", frame(OpMsg, 1, 0, []byte{0, 0}), "too short for flags", false},
		{"length bigger than bytes", longer, "frame has", false},
		{"length smaller than bytes", shorter, "frame has", false},
		{"length below header", append(u32(12), okFrame[4:]...), "message length 12 below minimum 16", true},
		{"oversized", oversized, "message length 50000000 exceeds maximum 48000000", true},
		{"wrong opcode", frame(OpQuery, 1, 0, u32(0), kind0(body)), "wrong opcode OP_QUERY", false},
		{"two bodies", frame(OpMsg, 1, 0, u32(0), kind0(body), kind0(body)), "OP_MSG: 2 body sections", false},
		{"three bodies", frame(OpMsg, 1, 0, u32(0), kind0(body), kind1("documents", d1), kind0(body), kind0(body)), "OP_MSG: 3 body sections", false},
		{"no body", frame(OpMsg, 1, 0, u32(0), kind1("documents", d1)), "OP_MSG: no body section", false},
		{"no sections", frame(OpMsg, 1, 0, u32(0)), "OP_MSG: no body section", false},
		{"unknown section kind", frame(OpMsg, 1, 0, u32(0), kind0(body), []byte{2}, d1), "OP_MSG: unknown section kind 2", false},
		{"unknown required flag bit", frame(OpMsg, 1, 0, u32(1<<2), kind0(body)), "OP_MSG: unknown required flag bits 0x0004", false},
		{"unknown required flag bit 15", frame(OpMsg, 1, 0, u32(1<<15|uint32(ExhaustAllowed)), kind0(body)), "unknown required flag bits 0x8000", false},
		{"sequence also a body field", frame(OpMsg, 1, 0, u32(0), kind0(withDocs), kind1("documents", d1)), `OP_MSG: document sequence "documents" also a field of the body`, false},
		{"duplicate sequence", frame(OpMsg, 1, 0, u32(0), kind0(body), kind1("documents", d1), kind1("documents", d1)), `document sequence "documents" appears twice`, false},
		{"invalid BSON in body", frame(OpMsg, 1, 0, u32(0), kind0(badBSON)), "OP_MSG: invalid BSON in body: ", false},
		{"invalid nested BSON in sequence", frame(OpMsg, 1, 0, u32(0), kind0(body), kind1("documents", d1, badNested)), `OP_MSG: document 1: invalid BSON in document sequence "documents"`, false},
		{"invalid BSON in sequence", frame(OpMsg, 1, 0, u32(0), kind0(body), kind1("documents", d1, badBSON)), `OP_MSG: document 1: invalid BSON in document sequence "documents"`, false},
		{"body missing terminator", frame(OpMsg, 1, 0, u32(0), kind0(append(u32(6), 0x0a, 0))), "invalid BSON in body", false},
		{"truncated body", frame(OpMsg, 1, 0, u32(0), kind0(body[:len(body)-3])), "truncated body", false},
		{"body section kind only", frame(OpMsg, 1, 0, u32(0), []byte{0}), "truncated body: 0 bytes left", false},
		{"document length below 5", frame(OpMsg, 1, 0, u32(0), kind0([]byte{4, 0, 0, 0})), "document length 4 below minimum 5", true},
		{"negative document length", frame(OpMsg, 1, 0, u32(0), kind0([]byte{0xff, 0xff, 0xff, 0xff, 0})), "document length -1 below minimum 5", true},
		{"document too large", frame(OpMsg, 1, 0, u32(0), kind0(append(big, 0))), "document length 16793601 exceeds maximum 16793600", true},
		{"truncated sequence", frame(OpMsg, 1, 0, u32(0), kind0(body), kind1("documents", d1)[:12]), "document sequence size", false},
		{"sequence size too small", frame(OpMsg, 1, 0, u32(0), kind0(body), []byte{1, 3, 0, 0, 0}), "document sequence size 3", false},
		{"sequence size field cut", frame(OpMsg, 1, 0, u32(0), kind0(body), []byte{1, 3, 0}), "truncated document sequence", false},
		{"partial document in sequence", frame(OpMsg, 1, 0, u32(0), kind0(body), kind1("documents", d1, d1[:6])), `truncated document sequence "documents"`, false},
		{"empty identifier", frame(OpMsg, 1, 0, u32(0), kind0(body), kind1("", d1)), "document sequence with empty identifier", false},
		{"unterminated identifier", frame(OpMsg, 1, 0, u32(0), kind0(body), unterminated), "identifier not NUL-terminated", false},
		{"nested too deep", frame(OpMsg, 1, 0, u32(0), kind0(nested(MaxDepth+1))), "nested more than 200 levels", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var m Msg
			err := m.Decode(tc.frame)
			if err == nil {
				t.Fatalf("Decode succeeded: %+v", m)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %q does not match ErrMalformed", err)
			}
			var le *LimitError
			if errors.As(err, &le) != tc.isLimit {
				t.Fatalf("error %q: LimitError %v, want %v", err, !tc.isLimit, tc.isLimit)
			}
		})
	}
}

func TestCrafted37(t *testing.T) {
	f := crafted37()
	if len(f) != 37 {
		t.Fatalf("crafted message has %d bytes", len(f))
	}
	// Every prefix and every single-byte corruption fails cleanly.
	for i := range f {
		var m Msg
		if err := m.Decode(f[:i]); err == nil {
			t.Fatalf("prefix %d decoded", i)
		}
		g := bytes.Clone(f)
		g[i] ^= 0x55
		_ = m.Decode(g)
	}
}

func TestDeepNestingNoStackExhaustion(t *testing.T) {
	// ~7 bytes per level: 2 MB is ~300k levels, which recursive validation
	// would descend fully; the depth check stops at MaxDepth.
	d := nested(300_000)
	var m Msg
	err := m.Decode(frame(OpMsg, 1, 0, u32(0), kind0(d)))
	if err == nil || !strings.Contains(err.Error(), "nested more than") {
		t.Fatalf("got %v", err)
	}
}

func TestMsgEncode(t *testing.T) {
	body := mdoc(t, D("insert", "c", "$db", "db"))
	d1 := mdoc(t, D("_id", 1))
	h := Header{RequestID: 5, ResponseTo: 4, MessageLength: 999, OpCode: OpQuery} // length and opcode ignored

	m := Msg{Flags: ChecksumPresent, Body: body, Sequences: []Sequence{{"documents", [][]byte{d1, d1}}}}
	out, err := m.Encode(nil, h)
	if err != nil {
		t.Fatal(err)
	}
	want := withChecksum(frame(OpMsg, 5, 4, u32(uint32(ChecksumPresent)), kind0(body), kind1("documents", d1, d1)))
	if !bytes.Equal(out, want) {
		t.Fatalf("got  %q\nwant %q", out, want)
	}
	var back Msg
	if err := back.Decode(out); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, m) {
		t.Fatalf("got %+v want %+v", back, m)
	}

	for _, tc := range []struct {
		name string
		m    Msg
		want string
	}{
		{"no body", Msg{}, "body: document of 0 bytes"},
		{"body length wrong", Msg{Body: body[:len(body)-1]}, "document length"},
		{"empty identifier", Msg{Body: body, Sequences: []Sequence{{"", nil}}}, "empty identifier"},
		{"NUL in identifier", Msg{Body: body, Sequences: []Sequence{{"a\x00b", nil}}}, "contains NUL"},
		{"duplicate identifier", Msg{Body: body, Sequences: []Sequence{{"a", nil}, {"a", nil}}}, "appears twice"},
		{"bad sequence document", Msg{Body: body, Sequences: []Sequence{{"a", [][]byte{{1, 2}}}}}, `document sequence "a" document 0`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := tc.m.Encode([]byte("x"), h)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
			if string(out) != "x" {
				t.Fatalf("dst changed on error: %q", out)
			}
		})
	}
}

func TestAppendMsgAndAccessors(t *testing.T) {
	body := mdoc(t, D("find", "events", "filter", D(), "$db", "metrics"))
	for _, flags := range []MsgFlags{0, ChecksumPresent, MoreToCome | ExhaustAllowed} {
		f := AppendMsg([]byte("abc"), 9, 8, flags, body)[3:]
		var m Msg
		if err := m.Decode(f); err != nil {
			t.Fatalf("flags %x: %v", flags, err)
		}
		h, _ := ParseHeader(f)
		if h != (Header{MessageLength: int32(len(f)), RequestID: 9, ResponseTo: 8, OpCode: OpMsg}) {
			t.Fatalf("header %+v", h)
		}
		if m.Flags != flags || !bytes.Equal(m.Body, body) || m.CommandName() != "find" || m.DB() != "metrics" {
			t.Fatalf("flags %x: got %+v %q %q", flags, m, m.CommandName(), m.DB())
		}
	}
	var empty Msg
	if empty.CommandName() != "" || empty.DB() != "" {
		t.Fatal("empty Msg accessors")
	}
	m := Msg{Body: mdoc(t, D("ping", 1, "$db", 1))}
	if m.CommandName() != "ping" || m.DB() != "" {
		t.Fatal("non-string $db")
	}
}

func TestSetMsgFlags(t *testing.T) {
	body := mdoc(t, D("hello", 1, "$db", "admin"))
	d1 := mdoc(t, D("_id", 1))
	plain := frame(OpMsg, 3, 0, u32(uint32(ExhaustAllowed)), kind0(body), kind1("documents", d1))
	summed := withChecksum(frame(OpMsg, 3, 0, u32(uint32(ExhaustAllowed|ChecksumPresent)), kind0(body), kind1("documents", d1)))

	for _, tc := range []struct {
		name  string
		in    []byte
		flags MsgFlags
		want  []byte
	}{
		{"strip exhaust, no checksum", plain, 0, frame(OpMsg, 3, 0, u32(0), kind0(body), kind1("documents", d1))},
		{"strip exhaust, keep checksum", summed, ChecksumPresent, withChecksum(frame(OpMsg, 3, 0, u32(uint32(ChecksumPresent)), kind0(body), kind1("documents", d1)))},
		{"drop checksum", summed, ExhaustAllowed, plain},
		{"add checksum", plain, ExhaustAllowed | ChecksumPresent, summed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := SetMsgFlags(bytes.Clone(tc.in), tc.flags)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, tc.want) {
				t.Fatalf("got  %q\nwant %q", got, tc.want)
			}
			var m Msg
			if err := m.Decode(got); err != nil || m.Flags != tc.flags {
				t.Fatalf("decode after SetMsgFlags: %v, flags %x", err, m.Flags)
			}
		})
	}

	bad := bytes.Clone(summed)
	bad[20] ^= 1
	if _, err := SetMsgFlags(bad, 0); err == nil || !strings.Contains(err.Error(), "checksum mismatch") {
		t.Fatalf("bad checksum: %v", err)
	}
	if _, err := SetMsgFlags(frame(OpReply, 1, 0, u32(0)), 0); !errors.Is(err, ErrMalformed) {
		t.Fatalf("wrong opcode: %v", err)
	}
	if _, err := SetMsgFlags(frame(OpMsg, 1, 0, []byte{1}), 0); !errors.Is(err, ErrMalformed) {
		t.Fatalf("short: %v", err)
	}
}

func TestOpCodeString(t *testing.T) {
	for op, want := range map[OpCode]string{OpMsg: "OP_MSG", OpQuery: "OP_QUERY", OpReply: "OP_REPLY", OpCompressed: "OP_COMPRESSED", 2005: "OP_GET_MORE", 42: "OpCode(42)"} {
		if op.String() != want {
			t.Errorf("%d: %q want %q", int32(op), op.String(), want)
		}
	}
}

func typicalFind(tb testing.TB) []byte {
	body := mdoc(tb, D("find", "events", "filter", D("ts", D("$gte", time.Unix(1700000000, 0), "$lt", time.Unix(1700003600, 0)), "meta.sensor", "a"), "sort", D("ts", 1), "limit", int64(100), "lsid", D("id", bson.Binary{Subtype: 4, Data: bytes.Repeat([]byte{0xab}, 16)}), "$clusterTime", D("clusterTime", bson.Timestamp{T: 1700000000, I: 1}, "signature", D("hash", bson.Binary{Data: make([]byte, 20)}, "keyId", int64(0))), "$db", "metrics"))
	return AppendMsg(nil, 1, 0, 0, body)
}

func BenchmarkMsgDecode(b *testing.B) {
	f := typicalFind(b)
	b.SetBytes(int64(len(f)))
	b.ReportAllocs()
	var m Msg
	for b.Loop() {
		if err := m.Decode(f); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkMsgDecodeInsert10(b *testing.B) {
	body := mdoc(b, D("insert", "events", "ordered", true, "$db", "metrics"))
	var docs [][]byte
	for i := range 10 {
		docs = append(docs, mdoc(b, D("_id", bson.NewObjectID(), "ts", time.Unix(1700000000+int64(i), 0), "meta", D("sensor", "a"), "v", float64(i))))
	}
	f := frame(OpMsg, 1, 0, u32(0), kind0(body), kind1("documents", docs...))
	b.SetBytes(int64(len(f)))
	b.ReportAllocs()
	var m Msg
	for b.Loop() {
		if err := m.Decode(f); err != nil {
			b.Fatal(err)
		}
	}
}

// The public constants match the driver's wire values.
func TestConstantsMatchDriver(t *testing.T) {
	if OpReply != OpCode(wiremessage.OpReply) || OpQuery != OpCode(wiremessage.OpQuery) ||
		OpCompressed != OpCode(wiremessage.OpCompressed) || OpMsg != OpCode(wiremessage.OpMsg) {
		t.Error("opcodes")
	}
	if ChecksumPresent != MsgFlags(wiremessage.ChecksumPresent) || MoreToCome != MsgFlags(wiremessage.MoreToCome) ||
		ExhaustAllowed != MsgFlags(wiremessage.ExhaustAllowed) {
		t.Error("flags")
	}
	if CompressorSnappy != uint8(wiremessage.CompressorSnappy) || CompressorZlib != uint8(wiremessage.CompressorZLib) ||
		CompressorZstd != uint8(wiremessage.CompressorZstd) || CompressorNoop != uint8(wiremessage.CompressorNoOp) {
		t.Error("compressors")
	}
}

// TestStringWithoutNUL: the driver's Validate accepts a string whose last
// byte is not NUL; servers drop the connection on it, so wire rejects it.
func TestStringWithoutNUL(t *testing.T) {
	good := bsoncore.NewDocumentBuilder().AppendString("ping", "x").AppendString("$db", "admin").Build()
	bad := append([]byte(nil), good...)
	// The first string's value: after type(1) + "ping\x00"(5) + length(4), "x", NUL.
	nul := 4 + 1 + 5 + 4 + 1
	if bad[nul] != 0 {
		t.Fatalf("layout: byte %d is %#x", nul, bad[nul])
	}
	bad[nul] = 'y'
	if err := bsoncore.Document(bad).Validate(); err != nil {
		t.Skipf("the driver now rejects it itself: %v", err)
	}
	var m Msg
	err := m.Decode(AppendMsg(nil, 1, 0, 0, bad))
	if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "terminating NUL") {
		t.Fatalf("want a malformed error naming the NUL, got %v", err)
	}
	if err := m.Decode(AppendMsg(nil, 1, 0, 0, good)); err != nil {
		t.Fatal(err)
	}
}
