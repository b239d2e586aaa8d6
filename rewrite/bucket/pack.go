package bucket

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/klauspost/compress/zstd"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
)

// Packed values (FieldPacked, FieldMore) hold the BSON of an array as
// binary data of one of two subtypes:
//
//   - SubtypeArray (0x00, generic): the array's bytes as they are;
//   - SubtypeZstdArray (0x80, user defined): one zstd frame of them.
//
// Every reader takes both, so buckets and staged documents written before
// compression, or with `bucket.compression: none`, stay readable. What
// the upstreams cost is per byte written and read (FerretDB turns the
// binary into base64 inside a JSON document, SQLite writes it page by page,
// PostgreSQL into its WAL and TOAST), and one bucket's events compress
// about 6x (1,000 1-second readings: 62 KB to 10 KB): a merge's bucket
// insert of 50,000 events took 131 ms on SQLite and 298 ms on PostgreSQL
// raw, 26 and 38 ms compressed, and 500 staged inserts of 100 events
// 819 and 570 ms raw, 506 and 405 ms compressed (raw data sized as the
// compressed documents; cmd/tsbench ingest has the end-to-end figures).
const (
	SubtypeArray     byte = 0x00
	SubtypeZstdArray byte = 0x80
)

// minCompressBytes: an array shorter than this is stored raw. A frame
// costs a call of some 10-30 µs whatever its size (table setup), which
// a few events do not pay back: 600 bytes compress to 280, about what
// 320 bytes less cost FerretDB on PostgreSQL; staged inserts of 10
// events ran no faster compressed (tsbench ingest -cases 10/1).
const minCompressBytes = 1024

// MaxUnpackedBytes bounds what one packed value may unpack to: a bucket
// holds at most rules.MaxBucketBytes of events and a staged document a
// chunk of at most that or maxStagedDocBytes, plus their array's keys; a
// frame that claims more is refused before it is decoded, so a damaged
// or hostile document cannot make the proxy allocate without bound.
const MaxUnpackedBytes = 48_000_000

var (
	// EncodeAll and DecodeAll may be called concurrently; each keeps up
	// to GOMAXPROCS coders.
	packEncoder, _ = zstd.NewWriter(nil,
		zstd.WithEncoderLevel(zstd.SpeedFastest),
		zstd.WithEncoderConcurrency(runtime.GOMAXPROCS(0)),
		zstd.WithLowerEncoderMem(true))
	packDecoder, _ = zstd.NewReader(nil,
		zstd.WithDecoderConcurrency(runtime.GOMAXPROCS(0)),
		zstd.WithDecoderMaxMemory(MaxUnpackedBytes))
)

// appendPacked appends arr, the BSON of an array, as the binary element
// key: zstd-compressed when compress is set, the array is long enough,
// and the frame is smaller; raw otherwise.
func appendPacked(dst []byte, key string, arr []byte, compress bool) []byte {
	if compress && len(arr) >= minCompressBytes {
		z := packEncoder.EncodeAll(arr, make([]byte, 0, len(arr)/2))
		if len(z) < len(arr) {
			return bsoncore.AppendBinaryElement(dst, key, SubtypeZstdArray, z)
		}
	}
	return bsoncore.AppendBinaryElement(dst, key, SubtypeArray, arr)
}

// Compress is b as one zstd frame, when that is worth it (b long
// enough, the frame smaller); ok is false otherwise: for other packed
// values than events (rewrite/layout's slots), with the same coder and
// bounds.
func Compress(b []byte) (z []byte, ok bool) {
	if len(b) < minCompressBytes {
		return nil, false
	}
	z = packEncoder.EncodeAll(b, make([]byte, 0, len(b)/2))
	return z, len(z) < len(b)
}

// Decompress decodes a frame of Compress, refusing one that claims or
// unpacks to more than MaxUnpackedBytes.
func Decompress(z []byte) ([]byte, error) { return decompress(z) }

// unpack reads the packed value v of field as the BSON of an array,
// validated; a compressed one is decompressed into new memory, a raw one
// is returned in place.
func unpack(field string, v bsoncore.Value) (bsoncore.Array, error) {
	subtype, data, ok := v.BinaryOK()
	if !ok {
		return nil, fmt.Errorf("%q is a %s, not binary data", field, bsonutil.TypeName(v.Type))
	}
	switch subtype {
	case SubtypeArray:
	case SubtypeZstdArray:
		var err error
		if data, err = decompress(data); err != nil {
			return nil, fmt.Errorf("%q: %w", field, err)
		}
	default:
		return nil, fmt.Errorf("%q is binary data of subtype %#x, not a packed array (0x00, or 0x80 compressed)", field, subtype)
	}
	if err := bsoncore.Array(data).Validate(); err != nil {
		return nil, fmt.Errorf("%q does not hold a BSON array: %w", field, err)
	}
	return bsoncore.Array(data), nil
}

// decompress decodes one zstd frame, refusing one whose declared or
// decoded size passes MaxUnpackedBytes.
func decompress(z []byte) ([]byte, error) {
	var h zstd.Header
	if err := h.Decode(z); err != nil {
		return nil, fmt.Errorf("damaged compressed events: %w", err)
	}
	var dst []byte
	if h.HasFCS {
		if h.FrameContentSize > MaxUnpackedBytes {
			return nil, fmt.Errorf("compressed events claim %d bytes, more than the limit of %d", h.FrameContentSize, MaxUnpackedBytes)
		}
		dst = make([]byte, 0, h.FrameContentSize)
	}
	out, err := packDecoder.DecodeAll(z, dst)
	switch {
	case errors.Is(err, zstd.ErrDecoderSizeExceeded):
		return nil, fmt.Errorf("compressed events unpack to more than the limit of %d bytes", MaxUnpackedBytes)
	case err != nil:
		return nil, fmt.Errorf("damaged compressed events: %w", err)
	}
	return out, nil
}
