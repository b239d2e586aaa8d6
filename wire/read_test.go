package wire

import (
	"bytes"
	"errors"
	"io"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"
)

func TestReadMessage(t *testing.T) {
	f1 := AppendMsg(nil, 1, 0, 0, mdoc(t, D("ping", 1, "$db", "admin")))
	f2 := AppendMsg(nil, 2, 0, 0, mdoc(t, D("find", "c", "filter", D("a", "bbbbbbbbbbbbbbbbbbbbbbbbb"), "$db", "x")))
	r := iotest.OneByteReader(bytes.NewReader(append(bytes.Clone(f1), f2...)))

	h, got, err := ReadMessage(r, nil, 0)
	if err != nil || !bytes.Equal(got, f1) || h.RequestID != 1 || h.OpCode != OpMsg || int(h.MessageLength) != len(f1) {
		t.Fatalf("first: %+v %q %v", h, got, err)
	}
	// Reusing a buffer too small for the next frame allocates a new one.
	buf := got[:0]
	h, got, err = ReadMessage(r, buf, 0)
	if err != nil || !bytes.Equal(got, f2) || h.RequestID != 2 {
		t.Fatalf("second: %+v %q %v", h, got, err)
	}
	if _, _, err = ReadMessage(r, got[:0], 0); err != io.EOF {
		t.Fatalf("clean end: %v", err)
	}

	// A big enough buffer is reused: the frame aliases it.
	big := make([]byte, 0, 1024)
	_, got, err = ReadMessage(bytes.NewReader(f2), big, 0)
	if err != nil || &got[0] != &big[:1][0] {
		t.Fatalf("buffer not reused: %v", err)
	}
}

func TestReadMessageErrors(t *testing.T) {
	f := AppendMsg(nil, 1, 0, 0, mdoc(t, D("ping", 1)))
	lenFrame := func(n uint32) []byte { return append(u32(n), f[4:]...) }
	for _, tc := range []struct {
		name    string
		in      []byte
		maxLen  int
		want    string
		eof     bool
		isLimit bool
	}{
		{"truncated header", f[:7], 0, "reading message header: got 7 of 16 bytes", true, false},
		{"truncated body", f[:len(f)-1], 0, "reading message body: got", true, false},
		{"length below 16", lenFrame(15), 0, "message length 15 below minimum 16", false, true},
		{"negative length", lenFrame(0xffffffff), 0, "message length -1 below minimum 16", false, true},
		{"length above max", lenFrame(50_000_000), 0, "message length 50000000 exceeds maximum 48000000", false, true},
		{"length above caller max", f, 20, "exceeds maximum 20", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := ReadMessage(bytes.NewReader(tc.in), nil, tc.maxLen)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
			if errors.Is(err, io.ErrUnexpectedEOF) != tc.eof {
				t.Fatalf("%v: ErrUnexpectedEOF %v", err, !tc.eof)
			}
			var le *LimitError
			if errors.As(err, &le) != tc.isLimit || (tc.isLimit && !errors.Is(err, ErrMalformed)) {
				t.Fatalf("%v: LimitError %v", err, !tc.isLimit)
			}
		})
	}
	// Other read errors come back wrapped.
	boom := errors.New("boom")
	if _, _, err := ReadMessage(iotest.ErrReader(boom), nil, 0); !errors.Is(err, boom) {
		t.Fatalf("got %v", err)
	}
}

// An oversized length is refused before the body is read or allocated.
func TestReadMessageNoAllocBeforeCheck(t *testing.T) {
	in := append(u32(MaxMsgLen+1), make([]byte, 12)...)
	allocs := testing.AllocsPerRun(10, func() {
		_, _, _ = ReadMessage(bytes.NewReader(in), nil, 0)
	})
	if allocs > 3 {
		t.Fatalf("%v allocations", allocs)
	}
}

// A frame bigger than the first read chunk is assembled as it arrives.
func TestReadMessageLarge(t *testing.T) {
	var docs [][]byte
	for i := range 3000 {
		docs = append(docs, mdoc(t, D("_id", i, "pad", strings.Repeat("x", 100))))
	}
	f := frame(OpMsg, 1, 0, u32(0), kind0(mdoc(t, D("insert", "c", "$db", "d"))), kind1("documents", docs...))
	if len(f) < 4*readChunk {
		t.Fatalf("frame only %d bytes", len(f))
	}
	_, got, err := ReadMessage(iotest.HalfReader(bytes.NewReader(f)), make([]byte, 0, 100), 0)
	if err != nil || !bytes.Equal(got, f) {
		t.Fatalf("large frame: %v", err)
	}
	var m Msg
	if err := m.Decode(got); err != nil || len(m.Sequences[0].Documents) != 3000 {
		t.Fatalf("decode: %v", err)
	}
}

// A header claiming 40 MB followed by a few bytes costs little memory.
func TestReadMessageLyingHeaderCheap(t *testing.T) {
	in := append(u32(40_000_000), make([]byte, 100)...)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, _, err := ReadMessage(bytes.NewReader(in), nil, 0)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("got %v", err)
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
		t.Fatalf("allocated %d bytes", n)
	}
}
