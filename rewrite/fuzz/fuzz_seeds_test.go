package fuzz

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/tsproxy/tsproxy/wire"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// recordedBodies returns the command bodies of the OP_MSG frames recorded
// from real driver traffic (wire/testdata/fuzz), each retargeted at the
// test rule's namespace (first value "readings", $db "iot") so that the
// rewrite functions get past the namespace check and into their parsers.
// Document sequences are folded into the body as arrays, as the proxy
// hands them to the rewrite. Requests and replies both come back: replies
// seed the reply-mapping targets.
func recordedBodies(tb testing.TB) [][]byte {
	tb.Helper()
	files, err := filepath.Glob(filepath.Join("..", "..", "wire", "testdata", "fuzz", "FuzzMsgDecode", "driver-msg*"))
	if err != nil || len(files) == 0 {
		tb.Fatalf("no recorded driver frames under wire/testdata/fuzz: %v", err)
	}
	var out [][]byte
	for _, f := range files {
		frame, err := readCorpusBytes(f)
		if err != nil {
			tb.Fatalf("%s: %v", f, err)
		}
		var m wire.Msg
		if err := m.Decode(frame); err != nil {
			tb.Fatalf("%s: recorded frame does not decode: %v", f, err)
		}
		out = append(out, retarget(foldSequences(m)))
	}
	return out
}

// readCorpusBytes reads a "go test fuzz v1" file holding one []byte.
func readCorpusBytes(path string) ([]byte, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	lines := strings.SplitN(strings.TrimSpace(string(raw)), "\n", 2)
	if len(lines) != 2 || !strings.HasPrefix(lines[1], "[]byte(") {
		return nil, os.ErrInvalid
	}
	s, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(lines[1], "[]byte("), ")"))
	return []byte(s), err
}

func foldSequences(m wire.Msg) []byte {
	idx, out := bsoncore.AppendDocumentStart(nil)
	elems, _ := bsoncore.Document(m.Body).Elements()
	for _, e := range elems {
		out = append(out, e...)
	}
	for _, s := range m.Sequences {
		aidx, a := bsoncore.AppendArrayElementStart(out, s.Identifier)
		for i, d := range s.Documents {
			a = bsoncore.AppendDocumentElement(a, strconv.Itoa(i), d)
		}
		out, _ = bsoncore.AppendArrayEnd(a, aidx)
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return out
}

// retarget renames the command's collection to "readings" and its $db to
// "iot"; a reply (no string first value) keeps its fields.
func retarget(body []byte) []byte {
	elems, err := bsoncore.Document(body).Elements()
	if err != nil {
		return body
	}
	idx, out := bsoncore.AppendDocumentStart(nil)
	for i, e := range elems {
		switch {
		case i == 0 && e.Value().Type == bsoncore.TypeString:
			out = bsoncore.AppendStringElement(out, e.Key(), "readings")
		case e.Key() == "$db":
			out = bsoncore.AppendStringElement(out, "$db", "iot")
		case e.Key() == "collection" && e.Value().Type == bsoncore.TypeString:
			out = bsoncore.AppendStringElement(out, "collection", "readings")
		default:
			out = append(out, e...)
		}
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return out
}

// mustValid fails unless b is nil or deeply valid BSON.
func mustValid(t *testing.T, what string, b []byte) {
	t.Helper()
	if b == nil {
		return
	}
	if err := wire.ValidateDocument(b); err != nil {
		t.Fatalf("%s is not valid BSON: %v\n%q", what, err, b)
	}
}

func marshalSeed(tb testing.TB, v any) []byte {
	tb.Helper()
	b, err := bson.Marshal(v)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}
