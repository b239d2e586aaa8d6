package wire

import (
	"encoding/binary"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/wiremessage"
)

// MaxMsgLen is the largest messageLength accepted (MongoDB's
// maxMessageSizeBytes). It is checked before anything is allocated.
const MaxMsgLen = 48_000_000

// HeaderLen is the size of the standard message header.
const HeaderLen = 16

// MaxDocLen is the largest BSON document accepted inside a message:
// MongoDB's BSONObjMaxInternalSize (16 MiB plus 16 KiB of command overhead).
const MaxDocLen = 16*1024*1024 + 16*1024

// MaxDepth is the deepest nesting of documents and arrays accepted in a BSON
// document: MongoDB's own limit (maxBSONDepth). Every document the proxy
// reads, from a client or from the upstream, is checked against it here,
// once; the rewrite's recursive code relies on it and bounds its recursion
// by the same constant.
const MaxDepth = 200

// OpCode is a wire-protocol opcode.
type OpCode int32

// Opcodes this package understands. Others still frame (ReadMessage) and
// can be forwarded untouched.
const (
	OpReply      OpCode = 1
	OpQuery      OpCode = 2004
	OpCompressed OpCode = 2012
	OpMsg        OpCode = 2013
)

// String returns the protocol name of the opcode ("OP_MSG") or
// "OpCode(n)" for one not known.
func (c OpCode) String() string {
	switch c {
	case OpReply:
		return "OP_REPLY"
	case OpQuery:
		return "OP_QUERY"
	case OpCompressed:
		return "OP_COMPRESSED"
	case OpMsg:
		return "OP_MSG"
	case 2001:
		return "OP_UPDATE"
	case 2002:
		return "OP_INSERT"
	case 2005:
		return "OP_GET_MORE"
	case 2006:
		return "OP_DELETE"
	case 2007:
		return "OP_KILL_CURSORS"
	}
	return fmt.Sprintf("OpCode(%d)", int32(c))
}

// Header is the standard 16-byte message header.
type Header struct {
	MessageLength int32 // length of the whole frame, header included
	RequestID     int32
	ResponseTo    int32
	OpCode        OpCode
}

// ParseHeader reads the header of frame. It checks only that there are 16
// bytes; see checkFrame for the checks the Decode methods make.
func ParseHeader(frame []byte) (Header, error) {
	length, reqID, respTo, op, _, ok := wiremessage.ReadHeader(frame)
	if !ok {
		return Header{}, malformed("message of %d bytes shorter than the %d-byte header", len(frame), HeaderLen)
	}
	return Header{MessageLength: length, RequestID: reqID, ResponseTo: respTo, OpCode: OpCode(op)}, nil
}

// Append appends h as written, MessageLength included.
func (h Header) Append(dst []byte) []byte {
	return wiremessage.AppendHeader(dst, h.MessageLength, h.RequestID, h.ResponseTo, wiremessage.OpCode(h.OpCode))
}

// checkFrame parses the header of frame and checks that it is a complete
// frame of the given opcode within MaxMsgLen. It returns the header and the
// bytes after it.
func checkFrame(frame []byte, op OpCode) (Header, []byte, error) {
	h, err := ParseHeader(frame)
	if err != nil {
		return h, nil, fmt.Errorf("%s: %w", op, err)
	}
	if err := checkLength(int64(h.MessageLength), MaxMsgLen); err != nil {
		return h, nil, fmt.Errorf("%s: %w", op, err)
	}
	if int(h.MessageLength) != len(frame) {
		return h, nil, malformed("%s: message length %d in header but frame has %d bytes", op, h.MessageLength, len(frame))
	}
	if h.OpCode != op {
		return h, nil, malformed("%s: wrong opcode %s", op, h.OpCode)
	}
	return h, frame[HeaderLen:], nil
}

// checkLength checks a messageLength against [HeaderLen, maxLen].
func checkLength(n, maxLen int64) error {
	if n < HeaderLen {
		return &LimitError{What: "message length", Size: n, Limit: HeaderLen, Min: true}
	}
	if n > maxLen {
		return &LimitError{What: "message length", Size: n, Limit: maxLen}
	}
	return nil
}

// appendHeaderStart appends a header with a length placeholder and returns
// the offset of the frame in dst; finishFrame fills the length in.
func appendHeaderStart(dst []byte, h Header, op OpCode) (int, []byte) {
	start := len(dst)
	return start, wiremessage.AppendHeader(dst, 0, h.RequestID, h.ResponseTo, wiremessage.OpCode(op))
}

// finishFrame writes the length of the frame that starts at dst[start:]
// and checks it against MaxMsgLen.
func finishFrame(dst []byte, start int) ([]byte, error) {
	n := len(dst) - start
	if n > MaxMsgLen {
		return dst, &LimitError{What: "message length", Size: int64(n), Limit: MaxMsgLen}
	}
	binary.LittleEndian.PutUint32(dst[start:], uint32(n))
	return dst, nil
}
