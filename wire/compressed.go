package wire

import (
	"bytes"
	"compress/zlib"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/golang/snappy"
	"github.com/klauspost/compress/zstd"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/wiremessage"
)

// Compressor ids of OP_COMPRESSED.
const (
	CompressorNoop   uint8 = 0
	CompressorSnappy uint8 = 1
	CompressorZlib   uint8 = 2
	CompressorZstd   uint8 = 3
)

var compressorNames = [...]string{"noop", "snappy", "zlib", "zstd"}

// CompressorID returns the id of a compressor named as in the hello
// "compression" array ("noop", "snappy", "zlib", "zstd").
func CompressorID(name string) (uint8, bool) {
	for i, n := range compressorNames {
		if n == name {
			return uint8(i), true
		}
	}
	return 0, false
}

// CompressorName returns the hello name of a compressor id, or "" if unknown.
func CompressorName(id uint8) string {
	if int(id) < len(compressorNames) {
		return compressorNames[id]
	}
	return ""
}

// Compressed is an OP_COMPRESSED message. CompressedMessage aliases the
// decoded frame.
type Compressed struct {
	OriginalOpCode    OpCode
	UncompressedSize  int32 // size of the original message without its header
	CompressorID      uint8
	CompressedMessage []byte
}

// Decode decodes a whole OP_COMPRESSED frame (header included) into c. It
// checks the fixed fields (originalOpcode not OP_COMPRESSED, uncompressedSize
// within [0, MaxMsgLen-16]) but does not decompress; see Decompress.
func (c *Compressed) Decode(frame []byte) error {
	*c = Compressed{}
	_, rest, err := checkFrame(frame, OpCompressed)
	if err != nil {
		return err
	}
	if len(rest) < 9 {
		return malformed("OP_COMPRESSED: message of %d bytes too short for its fixed fields", len(frame))
	}
	c.OriginalOpCode = OpCode(int32(binary.LittleEndian.Uint32(rest)))
	c.UncompressedSize = int32(binary.LittleEndian.Uint32(rest[4:]))
	c.CompressorID = rest[8]
	c.CompressedMessage = rest[9:]
	if c.OriginalOpCode == OpCompressed {
		return malformed("OP_COMPRESSED: original opcode is OP_COMPRESSED")
	}
	if c.UncompressedSize < 0 {
		return fmt.Errorf("OP_COMPRESSED: %w", &LimitError{What: "uncompressed size", Size: int64(c.UncompressedSize), Limit: 0, Min: true})
	}
	if c.UncompressedSize > MaxMsgLen-HeaderLen {
		return fmt.Errorf("OP_COMPRESSED: %w", &LimitError{What: "uncompressed size", Size: int64(c.UncompressedSize), Limit: MaxMsgLen - HeaderLen})
	}
	return nil
}

// Encode appends c as a whole OP_COMPRESSED frame (see the package doc).
func (c *Compressed) Encode(dst []byte, h Header) ([]byte, error) {
	if c.OriginalOpCode == OpCompressed {
		return dst, malformed("OP_COMPRESSED: original opcode is OP_COMPRESSED")
	}
	start, dst := appendHeaderStart(dst, h, OpCompressed)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(c.OriginalOpCode))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(c.UncompressedSize))
	dst = append(dst, c.CompressorID)
	dst = append(dst, c.CompressedMessage...)
	dst, err := finishFrame(dst, start)
	if err != nil {
		return dst[:start], err
	}
	return dst, nil
}

// zstdDecoder decodes with output bounded by MaxMsgLen, so that a small
// zstd bomb cannot make gigabytes (the driver's own decoder allows 64 GiB).
// DecodeAll is safe for concurrent use.
var zstdDecoder, _ = zstd.NewReader(nil,
	zstd.WithDecoderMaxMemory(MaxMsgLen),
	zstd.WithDecoderConcurrency(0),
)

// Decompress is DecompressLimit with the protocol's limit, MaxMsgLen.
func Decompress(frame []byte) ([]byte, error) { return DecompressLimit(frame, MaxMsgLen) }

// DecompressLimit turns an OP_COMPRESSED frame into the original frame,
// newly allocated: a header with the original opcode, the same requestID
// and responseTo, then the decompressed bytes. The original frame's length
// (its header and the uncompressed size) is checked against maxLen (at
// most MaxMsgLen) before anything is allocated, a *LimitError past it, so
// that a small compressed frame cannot carry a message over a limit that
// ReadMessage applied to the compressed one. The decompressed length must
// equal the uncompressed size. What is allocated grows with what the
// compressed bytes really hold, not with the size they claim (zlib
// streams; a snappy block's claimed length is checked against the most
// its bytes can hold), but for zstd, whose frame may state its size: up to
// that size, which must be the message's. The result is not decoded
// further.
func DecompressLimit(frame []byte, maxLen int) ([]byte, error) {
	var c Compressed
	if err := c.Decode(frame); err != nil {
		return nil, err
	}
	maxLen = min(maxLen, MaxMsgLen)
	if n := int64(HeaderLen) + int64(c.UncompressedSize); n > int64(maxLen) {
		return nil, fmt.Errorf("OP_COMPRESSED: %w", &LimitError{What: "message length", Size: n, Limit: int64(maxLen)})
	}
	h, _ := ParseHeader(frame)
	name := CompressorName(c.CompressorID)
	out, err := decompressPayload(c.CompressorID, c.CompressedMessage, int(c.UncompressedSize))
	if err != nil {
		return nil, malformed("OP_COMPRESSED: %s: %w", name, err)
	}
	if len(out) != int(c.UncompressedSize) {
		return nil, malformed("OP_COMPRESSED: %s: uncompressed size %d but decompressed %d bytes", name, c.UncompressedSize, len(out))
	}
	dst := make([]byte, 0, HeaderLen+len(out))
	dst = Header{MessageLength: int32(HeaderLen + len(out)), RequestID: h.RequestID, ResponseTo: h.ResponseTo, OpCode: c.OriginalOpCode}.Append(dst)
	return append(dst, out...), nil
}

// maxSnappyRatio bounds what a snappy block of n bytes decodes to: its
// densest element, a copy with a 2-byte offset, makes 64 bytes of 3.
const maxSnappyRatio = 22

// decompressPayload decompresses msg, which the frame says holds size
// bytes: more than size is an error, found without making more.
func decompressPayload(id uint8, msg []byte, size int) ([]byte, error) {
	switch id {
	case CompressorNoop:
		return msg, nil
	case CompressorSnappy:
		n, err := snappy.DecodedLen(msg)
		if err != nil {
			return nil, err
		}
		if n != size || n > maxSnappyRatio*len(msg) {
			return nil, fmt.Errorf("block of %d bytes says it holds %d, the message %d", len(msg), n, size)
		}
		return snappy.Decode(make([]byte, n), msg)
	case CompressorZlib:
		r, err := zlib.NewReader(bytes.NewReader(msg))
		if err != nil {
			return nil, err
		}
		return io.ReadAll(io.LimitReader(r, int64(size)+1))
	case CompressorZstd:
		var zh zstd.Header
		if err := zh.Decode(msg); err != nil {
			return nil, err
		}
		if zh.HasFCS && zh.FrameContentSize != uint64(size) {
			return nil, fmt.Errorf("frame says it holds %d bytes, the message %d", zh.FrameContentSize, size)
		}
		return zstdDecoder.DecodeAll(msg, nil)
	default:
		return nil, fmt.Errorf("unknown compressor id %d", id)
	}
}

// Compress turns a whole frame of any opcode but OP_COMPRESSED into an
// OP_COMPRESSED frame with the same requestID and responseTo, compressing
// with the given compressor id at the driver's default level. It is the
// caller's business not to compress what the spec forbids (hello,
// saslStart and the other authentication commands).
func Compress(frame []byte, compressorID uint8) ([]byte, error) {
	h, err := ParseHeader(frame)
	if err != nil {
		return nil, err
	}
	if err := checkLength(int64(h.MessageLength), MaxMsgLen); err != nil {
		return nil, err
	}
	if int(h.MessageLength) != len(frame) {
		return nil, malformed("message length %d in header but frame has %d bytes", h.MessageLength, len(frame))
	}
	if h.OpCode == OpCompressed {
		return nil, malformed("OP_COMPRESSED: cannot compress an OP_COMPRESSED message")
	}
	if int(compressorID) >= len(compressorNames) {
		return nil, errors.New("OP_COMPRESSED: unknown compressor id " + fmt.Sprint(compressorID))
	}
	payload, err := driver.CompressPayload(frame[HeaderLen:], driver.CompressionOpts{
		Compressor: wiremessage.CompressorID(compressorID),
		ZlibLevel:  wiremessage.DefaultZlibLevel,
		ZstdLevel:  wiremessage.DefaultZstdLevel,
	})
	if err != nil {
		return nil, fmt.Errorf("OP_COMPRESSED: %s: %w", CompressorName(compressorID), err)
	}
	c := Compressed{
		OriginalOpCode:    h.OpCode,
		UncompressedSize:  int32(len(frame) - HeaderLen),
		CompressorID:      compressorID,
		CompressedMessage: payload,
	}
	return c.Encode(make([]byte, 0, HeaderLen+9+len(payload)), h)
}
