package bucket

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/binary"

	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// ID is the _id of bucket number seq (0, 1, 2, ...) of one series and
// window in the bucket collection bucketNS. Every bucket the proxy writes
// has an id of this family, allocated in order, so the buckets of a
// (series, window) are exactly seq 0..n and can be found by point lookups
// on _id (the only filter the embedded upstream pushes down to storage).
//
// Layout: 4 bytes big-endian = the window start in seconds (floored, and
// wrapped to 32 bits outside 1970-2106), as MongoDB's own time-series
// buckets do, then the first 8 bytes of SHA-256 over
// (bucketNS, 0x00, meta type byte, meta value bytes, startMillis BE, seq BE).
// meta is the series' metaField value; a zero Value (missing) is null. The
// type is part of the hash: int32 1 and int64 1 are different series.
func ID(bucketNS string, meta bsoncore.Value, startMillis int64, seq int) bson.ObjectID {
	if meta.Type == 0 {
		meta = bsoncore.Value{Type: bsoncore.TypeNull}
	}
	return idRaw(bucketNS, byte(meta.Type), meta.Data, startMillis, seq)
}

// IDOf is ID for callers outside wire/ and rewrite/, which
// hold BSON values as bson.RawValue.
func IDOf(bucketNS string, meta bson.RawValue, startMillis int64, seq int) bson.ObjectID {
	return ID(bucketNS, bsoncore.Value{Type: bsoncore.Type(meta.Type), Data: meta.Value}, startMillis, seq)
}

func idRaw(bucketNS string, metaType byte, metaData []byte, startMillis int64, seq int) bson.ObjectID {
	h := sha256.New()
	h.Write([]byte(bucketNS))
	h.Write([]byte{0, metaType})
	h.Write(metaData)
	var buf [16]byte
	binary.BigEndian.PutUint64(buf[:8], uint64(startMillis))
	binary.BigEndian.PutUint64(buf[8:], uint64(int64(seq)))
	h.Write(buf[:])
	var id bson.ObjectID
	binary.BigEndian.PutUint32(id[:4], uint32(rules.FloorMillis(startMillis, 1000)/1000))
	copy(id[4:], h.Sum(nil))
	return id
}

// Key identifies one series and window of a rule: the buckets of a
// key are ID(ns, meta, Start, 0..n).
type Key struct {
	// Meta is the metaField value as its BSON type byte followed by the
	// value's bytes; {0x0A} (null) for events without one.
	Meta []byte
	// Start is the window start, in milliseconds since the Unix epoch.
	Start int64
}

// ID is the _id of the key's bucket number seq in bucketNS.
func (k Key) ID(bucketNS string, seq int) bson.ObjectID {
	if len(k.Meta) == 0 {
		return idRaw(bucketNS, byte(bsoncore.TypeNull), nil, k.Start, seq)
	}
	return idRaw(bucketNS, k.Meta[0], k.Meta[1:], k.Start, seq)
}

// String is a compact unique form of the key, usable as a map key: the
// start (8 bytes big-endian) then the meta bytes.
func (k Key) String() string {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(k.Start))
	return string(b[:]) + string(k.Meta)
}

func CompareKeys(a, b Key) int {
	if c := cmp.Compare(a.Start, b.Start); c != 0 {
		return c
	}
	return bytes.Compare(a.Meta, b.Meta)
}

// Fill is what the proxy knows of a key's open bucket: the one with
// the highest seq, and how full it is.
type Fill struct {
	// Seq is the open bucket's seq; -1 when the key has no bucket yet.
	Seq int
	// Count and Bytes are its events and their summed stored size.
	Count int
	Bytes int64
	// Known: the fill was loaded or planned; an unknown fill is treated as
	// "no bucket yet" by Insert, so callers load fills before planning.
	Known bool
}

// KeyFill is a key's fill after a round of an InsertPlan (see Fills).
type KeyFill struct {
	Key  Key
	Fill Fill
}

// KeyOf is the Key of an event.
func KeyOf(meta bsoncore.Value, start int64) Key {
	if meta.Type == 0 {
		meta = bsoncore.Value{Type: bsoncore.TypeNull}
	}
	m := make([]byte, 0, 1+len(meta.Data))
	m = append(m, byte(meta.Type))
	m = append(m, meta.Data...)
	return Key{Meta: m, Start: start}
}
