package wire

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"testing"
)

// Seeds beyond testdata/fuzz (real driver traffic recorded from the Go
// driver: hello over OP_QUERY with a compression offer, insert with a
// document sequence, find, update, delete, aggregate, OP_COMPRESSED with
// snappy, zlib and zstd, and the replies).
func addSeeds(f *testing.F) {
	body := mdoc(f, D("insert", "events", "$db", "test"))
	d1 := mdoc(f, D("_id", 1))
	f.Add(crafted37())
	f.Add(withChecksum(frame(OpMsg, 1, 0, u32(uint32(ChecksumPresent)), kind0(body), kind1("documents", d1, d1))))
	f.Add(frame(OpMsg, 1, 0, u32(0), kind1("documents", d1), kind0(body)))
	f.Add(frame(OpMsg, 1, 0, u32(0), kind0(body), kind0(body)))
	f.Add(frame(OpMsg, 1, 0, u32(0), kind0(nested(40))))
}

// checkErr fails unless err is nil or a malformed-input error.
func checkErr(t *testing.T, err error) bool {
	t.Helper()
	if err != nil && !errors.Is(err, ErrMalformed) {
		t.Fatalf("error does not match ErrMalformed: %v", err)
	}
	return err == nil
}

// roundTrip checks that a decoded message re-encodes to the same bytes and
// decodes again to an equal structure. All valid frames are canonical for
// this package's encoders.
func roundTrip[T any, P interface {
	*T
	Decode([]byte) error
	Encode([]byte, Header) ([]byte, error)
}](t *testing.T, in []byte, m P) {
	t.Helper()
	h, _ := ParseHeader(in)
	out, err := m.Encode(nil, h)
	if err != nil {
		t.Fatalf("Encode after Decode: %v", err)
	}
	if !bytes.Equal(out, in) {
		t.Fatalf("Encode differs from input:\n in %q\nout %q", in, out)
	}
	var again T
	if err := P(&again).Decode(out); err != nil {
		t.Fatalf("Decode of Encode: %v", err)
	}
	if !reflect.DeepEqual(*m, again) {
		t.Fatalf("Decode of Encode differs:\n%+v\n%+v", *m, again)
	}
}

func FuzzReadMessage(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, in []byte) {
		for _, buf := range [][]byte{nil, make([]byte, 0, 64)} {
			h, fr, err := ReadMessage(bytes.NewReader(in), buf, 0)
			if err != nil {
				if err != io.EOF && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, ErrMalformed) {
					t.Fatalf("unexpected error kind: %v", err)
				}
				continue
			}
			if int(h.MessageLength) != len(fr) || !bytes.Equal(fr, in[:len(fr)]) {
				t.Fatalf("frame %q does not match input", fr)
			}
			decodeAny(t, fr)
		}
	})
}

// decodeAny decodes a frame by its opcode, checking round trips.
func decodeAny(t *testing.T, fr []byte) {
	h, _ := ParseHeader(fr)
	switch h.OpCode {
	case OpMsg:
		var m Msg
		if checkErr(t, m.Decode(fr)) {
			roundTrip(t, fr, &m)
			_ = m.CommandName()
			_ = m.DB()
			g, err := SetMsgFlags(bytes.Clone(fr), m.Flags&^ExhaustAllowed^ChecksumPresent)
			if err != nil {
				t.Fatalf("SetMsgFlags on a valid frame: %v", err)
			}
			var m2 Msg
			if err := m2.Decode(g); err != nil {
				t.Fatalf("Decode after SetMsgFlags: %v", err)
			}
		} else {
			_, _ = SetMsgFlags(bytes.Clone(fr), 0)
		}
	case OpQuery:
		var q Query
		if checkErr(t, q.Decode(fr)) {
			roundTrip(t, fr, &q)
			_ = q.CommandName()
		}
	case OpReply:
		var r Reply
		if checkErr(t, r.Decode(fr)) {
			roundTrip(t, fr, &r)
		}
	case OpCompressed:
		var c Compressed
		if checkErr(t, c.Decode(fr)) {
			roundTrip(t, fr, &c)
		}
		if orig, err := Decompress(fr); checkErr(t, err) {
			if oh, _ := ParseHeader(orig); oh.OpCode != OpCompressed {
				decodeAny(t, orig)
			}
		}
	}
}

func FuzzMsgDecode(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, in []byte) {
		var m Msg
		if !checkErr(t, m.Decode(in)) {
			return
		}
		roundTrip(t, in, &m)
		_ = m.CommandName()
		_ = m.DB()
	})
}

func FuzzQueryDecode(f *testing.F) {
	f.Add(queryFrame(0, "admin.$cmd", 0, 1, mdoc(f, D("isMaster", 1))))
	f.Fuzz(func(t *testing.T, in []byte) {
		var q Query
		if !checkErr(t, q.Decode(in)) {
			return
		}
		roundTrip(t, in, &q)
		_, _ = q.CommandName(), q.DB()
	})
}

func FuzzReplyDecode(f *testing.F) {
	f.Add(AppendReply(nil, 1, 2, mdoc(f, D("ok", 1.0))))
	f.Fuzz(func(t *testing.T, in []byte) {
		var r Reply
		if !checkErr(t, r.Decode(in)) {
			return
		}
		if len(r.Documents) == 0 {
			r.Documents = nil // Decode of the re-encoding starts from nil
		}
		roundTrip(t, in, &r)
	})
}

func FuzzCompressedDecode(f *testing.F) {
	msg := AppendMsg(nil, 1, 0, 0, mdoc(f, D("ping", 1, "$db", "admin")))
	for id := range uint8(4) {
		c, _ := Compress(msg, id)
		f.Add(c)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		var c Compressed
		if checkErr(t, c.Decode(in)) {
			roundTrip(t, in, &c)
		}
		orig, err := Decompress(in)
		if !checkErr(t, err) {
			return
		}
		// Compress → Decompress gives the original back, for every codec.
		for id := range uint8(4) {
			c2, err := Compress(orig, id)
			if err != nil {
				t.Fatalf("Compress of a decompressed frame: %v", err)
			}
			back, err := Decompress(c2)
			if err != nil || !bytes.Equal(back, orig) {
				t.Fatalf("Compress/Decompress round trip with %d: %v", id, err)
			}
		}
	})
}
