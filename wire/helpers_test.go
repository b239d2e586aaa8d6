package wire

import (
	"encoding/binary"
	"hash/crc32"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// mdoc marshals d to a BSON document.
func mdoc(tb testing.TB, d bson.D) []byte {
	tb.Helper()
	b, err := bson.Marshal(d)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// frame builds a frame: a header with the right length, then the parts.
func frame(op OpCode, reqID, respTo int32, parts ...[]byte) []byte {
	b := Header{RequestID: reqID, ResponseTo: respTo, OpCode: op}.Append(nil)
	for _, p := range parts {
		b = append(b, p...)
	}
	binary.LittleEndian.PutUint32(b, uint32(len(b)))
	return b
}

func u32(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }

// kind0 is a body section.
func kind0(doc []byte) []byte { return append([]byte{0}, doc...) }

// kind1 is a document sequence section with a correct size.
func kind1(id string, docs ...[]byte) []byte {
	b := []byte{1, 0, 0, 0, 0}
	b = append(b, id...)
	b = append(b, 0)
	for _, d := range docs {
		b = append(b, d...)
	}
	binary.LittleEndian.PutUint32(b[1:], uint32(len(b)-1))
	return b
}

// withChecksum appends a valid CRC-32C to f and fixes its length.
func withChecksum(f []byte) []byte {
	f = append(f, 0, 0, 0, 0)
	binary.LittleEndian.PutUint32(f, uint32(len(f)))
	end := len(f) - 4
	binary.LittleEndian.PutUint32(f[end:], crc32.Checksum(f[:end], crc32.MakeTable(crc32.Castagnoli)))
	return f
}

// nested returns a document nested depth levels deep: {a:{a:{...}}}.
func nested(depth int) []byte {
	// Each level wraps the inner document in length(4) type(1) "a\x00"(2) ... NUL(1).
	total := 5 + 8*(depth-1)
	d := make([]byte, 0, total)
	for i := 0; i < depth-1; i++ {
		d = binary.LittleEndian.AppendUint32(d, uint32(total-8*i))
		d = append(d, 3, 'a', 0)
	}
	d = append(d, 5, 0, 0, 0, 0)
	for i := 0; i < depth-1; i++ {
		d = append(d, 0)
	}
	return d
}

// crafted37 is a 37-byte OP_MSG with the checksum flag whose body document
// claims the 4 checksum bytes as its own; the checksum itself is valid. A
// parser that reads sections before cutting the checksum off misreads it.
func crafted37() []byte {
	body := []byte{16, 0, 0, 0, 0x10, 'a', 0, 1, 0, 0, 0, 0} // {a: int32 1} missing 4 bytes
	f := frame(OpMsg, 1, 0, u32(uint32(ChecksumPresent)), kind0(body))
	return withChecksum(f)
}

// D builds a bson.D from key, value pairs.
func D(kv ...any) bson.D {
	d := make(bson.D, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		d = append(d, bson.E{Key: kv[i].(string), Value: kv[i+1]})
	}
	return d
}
