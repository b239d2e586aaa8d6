package wire

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
)

func queryFrame(flags uint32, ns string, skip, ret uint32, docs ...[]byte) []byte {
	parts := [][]byte{u32(flags), append([]byte(ns), 0), u32(skip), u32(ret)}
	return frame(OpQuery, 11, 0, append(parts, docs...)...)
}

func TestQuery(t *testing.T) {
	hello := mdoc(t, D("isMaster", 1, "helloOk", true, "compression", bson.A{"snappy", "zstd"}))
	sel := mdoc(t, D("a", 1))
	wrapped := mdoc(t, D("$query", D("ismaster", 1), "$readPreference", D("mode", "primary")))

	for _, tc := range []struct {
		name  string
		frame []byte
		want  Query
		cmd   string
	}{
		{"hello", queryFrame(4, "admin.$cmd", 0, 0xffffffff, hello), Query{Flags: 4, FullCollectionName: "admin.$cmd", NumberToReturn: -1, Query: hello}, "isMaster"},
		{"with selector", queryFrame(0, "db.c", 3, 5, hello, sel), Query{FullCollectionName: "db.c", NumberToSkip: 3, NumberToReturn: 5, Query: hello, ReturnFieldsSelector: sel}, "isMaster"},
		{"$query wrapped", queryFrame(0, "admin.$cmd", 0, 1, wrapped), Query{FullCollectionName: "admin.$cmd", NumberToReturn: 1, Query: wrapped}, "ismaster"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var q Query
			if err := q.Decode(tc.frame); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(q, tc.want) {
				t.Fatalf("got %+v\nwant %+v", q, tc.want)
			}
			if q.CommandName() != tc.cmd || q.DB() != strings.Split(tc.want.FullCollectionName, ".")[0] {
				t.Fatalf("CommandName %q DB %q", q.CommandName(), q.DB())
			}
			h, _ := ParseHeader(tc.frame)
			out, err := q.Encode(nil, h)
			if err != nil || !bytes.Equal(out, tc.frame) {
				t.Fatalf("Encode: %v\n got %q\nwant %q", err, out, tc.frame)
			}
		})
	}

	bad := bytes.Clone(hello)
	bad[len(bad)-1] = 1
	for _, tc := range []struct {
		name, want string
		frame      []byte
	}{
		{"no flags", "too short for flags", frame(OpQuery, 1, 0, []byte{1})},
		{"unterminated name", "fullCollectionName not NUL-terminated", frame(OpQuery, 1, 0, u32(0), []byte("admin.$cmd"))},
		{"empty name", "empty fullCollectionName", queryFrame(0, "", 0, 0, hello)},
		{"no skip/return", "truncated before numberToSkip", frame(OpQuery, 1, 0, u32(0), []byte("a.b\x00"), u32(0))},
		{"no query", "truncated query", queryFrame(0, "a.b", 0, 0)},
		{"invalid query", "OP_QUERY: invalid BSON in query", queryFrame(0, "a.b", 0, 0, bad)},
		{"invalid selector", "invalid BSON in returnFieldsSelector", queryFrame(0, "a.b", 0, 0, hello, bad)},
		{"trailing bytes", "3 bytes after returnFieldsSelector", queryFrame(0, "a.b", 0, 0, hello, sel, []byte{1, 2, 3})},
		{"wrong opcode", "wrong opcode OP_MSG", frame(OpMsg, 1, 0, u32(0))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var q Query
			err := q.Decode(tc.frame)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrMalformed) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}

	if _, err := (&Query{FullCollectionName: "a\x00", Query: hello}).Encode(nil, Header{}); err == nil {
		t.Fatal("NUL in name encoded")
	}
	if _, err := (&Query{FullCollectionName: "a.b"}).Encode(nil, Header{}); err == nil {
		t.Fatal("missing query encoded")
	}
}

func TestReply(t *testing.T) {
	d1 := mdoc(t, D("ismaster", true, "maxWireVersion", 21, "ok", 1.0))
	d2 := mdoc(t, D("x", 1))
	replyFrame := func(n uint32, docs ...[]byte) []byte {
		parts := [][]byte{u32(8), {1, 2, 3, 4, 5, 6, 7, 8}, u32(3), u32(n)}
		return frame(OpReply, 12, 11, append(parts, docs...)...)
	}
	for _, tc := range []struct {
		name  string
		frame []byte
		want  Reply
	}{
		{"one", replyFrame(1, d1), Reply{ResponseFlags: 8, CursorID: 0x0807060504030201, StartingFrom: 3, NumberReturned: 1, Documents: [][]byte{d1}}},
		{"two", replyFrame(2, d1, d2), Reply{ResponseFlags: 8, CursorID: 0x0807060504030201, StartingFrom: 3, NumberReturned: 2, Documents: [][]byte{d1, d2}}},
		{"none", replyFrame(0), Reply{ResponseFlags: 8, CursorID: 0x0807060504030201, StartingFrom: 3, Documents: [][]byte{}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r Reply
			if err := r.Decode(tc.frame); err != nil {
				t.Fatal(err)
			}
			if len(tc.want.Documents) == 0 {
				r.Documents, tc.want.Documents = nil, nil
			}
			if !reflect.DeepEqual(r, tc.want) {
				t.Fatalf("got %+v\nwant %+v", r, tc.want)
			}
			h, _ := ParseHeader(tc.frame)
			out, err := r.Encode(nil, h)
			if err != nil || !bytes.Equal(out, tc.frame) {
				t.Fatalf("Encode: %v\n got %q\nwant %q", err, out, tc.frame)
			}
		})
	}
	for _, tc := range []struct {
		name, want string
		frame      []byte
	}{
		{"short", "too short for its fixed fields", frame(OpReply, 1, 0, u32(0))},
		{"count mismatch", "numberReturned 2 but 1 documents", replyFrame(2, d1)},
		{"negative count", "negative numberReturned", replyFrame(0xffffffff, d1)},
		{"truncated document", "OP_REPLY: truncated document 1", replyFrame(2, d1, d2[:6])},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r Reply
			err := r.Decode(tc.frame)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrMalformed) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}

	f := AppendReply([]byte("zz"), 5, 4, d1)[2:]
	var r Reply
	if err := r.Decode(f); err != nil || len(r.Documents) != 1 || !bytes.Equal(r.Documents[0], d1) {
		t.Fatalf("AppendReply: %v %+v", err, r)
	}
	if h, _ := ParseHeader(f); h.RequestID != 5 || h.ResponseTo != 4 || h.OpCode != OpReply {
		t.Fatalf("AppendReply header %+v", h)
	}
}
