package wire

import (
	"encoding/binary"
	"fmt"
)

// Reply is a legacy OP_REPLY message, the answer to an OP_QUERY.
// Documents alias the decoded frame.
type Reply struct {
	ResponseFlags  int32
	CursorID       int64
	StartingFrom   int32
	NumberReturned int32
	Documents      [][]byte
}

// Decode decodes a whole OP_REPLY frame (header included) into r. Every
// document must be valid BSON, the documents must fill the frame exactly,
// and numberReturned must equal their count.
func (r *Reply) Decode(frame []byte) error {
	*r = Reply{Documents: r.Documents[:0]}
	_, rest, err := checkFrame(frame, OpReply)
	if err != nil {
		return err
	}
	if len(rest) < 20 {
		return malformed("OP_REPLY: message of %d bytes too short for its fixed fields", len(frame))
	}
	r.ResponseFlags = int32(binary.LittleEndian.Uint32(rest))
	r.CursorID = int64(binary.LittleEndian.Uint64(rest[4:]))
	r.StartingFrom = int32(binary.LittleEndian.Uint32(rest[12:]))
	r.NumberReturned = int32(binary.LittleEndian.Uint32(rest[16:]))
	rest = rest[20:]
	if r.NumberReturned < 0 {
		return malformed("OP_REPLY: negative numberReturned %d", r.NumberReturned)
	}
	for len(rest) > 0 {
		doc, rem, err := readDoc(rest, fmt.Sprintf("document %d", len(r.Documents)))
		if err != nil {
			return fmt.Errorf("OP_REPLY: %w", err)
		}
		r.Documents = append(r.Documents, doc)
		rest = rem
	}
	if int(r.NumberReturned) != len(r.Documents) {
		return malformed("OP_REPLY: numberReturned %d but %d documents", r.NumberReturned, len(r.Documents))
	}
	return nil
}

// Encode appends r as a whole OP_REPLY frame (see the package doc).
// numberReturned is written as len(r.Documents), whatever r.NumberReturned.
func (r *Reply) Encode(dst []byte, h Header) ([]byte, error) {
	for i, d := range r.Documents {
		if err := checkDocPrefix(d, fmt.Sprintf("document %d", i)); err != nil {
			return dst, fmt.Errorf("OP_REPLY: %w", err)
		}
	}
	start, dst := appendHeaderStart(dst, h, OpReply)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(r.ResponseFlags))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(r.CursorID))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(r.StartingFrom))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(r.Documents)))
	for _, d := range r.Documents {
		dst = append(dst, d...)
	}
	dst, err := finishFrame(dst, start)
	if err != nil {
		return dst[:start], err
	}
	return dst, nil
}

// AppendReply appends an OP_REPLY frame holding the one document doc
// (flags 0, cursor 0), as sent in answer to a legacy OP_QUERY hello.
func AppendReply(dst []byte, requestID, responseTo int32, doc []byte) []byte {
	start := len(dst)
	dst = Header{RequestID: requestID, ResponseTo: responseTo, OpCode: OpReply}.Append(dst)
	dst = binary.LittleEndian.AppendUint32(dst, 0)
	dst = binary.LittleEndian.AppendUint64(dst, 0)
	dst = binary.LittleEndian.AppendUint32(dst, 0)
	dst = binary.LittleEndian.AppendUint32(dst, 1)
	dst = append(dst, doc...)
	binary.LittleEndian.PutUint32(dst[start:], uint32(len(dst)-start))
	return dst
}
