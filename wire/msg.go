package wire

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/wiremessage"
)

// MsgFlags are the OP_MSG flag bits.
type MsgFlags uint32

// OP_MSG flags. Bits 0-15 are required: a receiver must reject a message
// with one it does not know. Bits 16-31 are optional.
const (
	ChecksumPresent MsgFlags = 1 << 0
	MoreToCome      MsgFlags = 1 << 1
	ExhaustAllowed  MsgFlags = 1 << 16

	requiredFlags = 0xffff
	knownRequired = ChecksumPresent | MoreToCome
)

// Section kinds.
const (
	sectionBody     = byte(wiremessage.SingleDocument)   // 0
	sectionSequence = byte(wiremessage.DocumentSequence) // 1
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Sequence is an OP_MSG document sequence section (kind 1).
type Sequence struct {
	Identifier string
	Documents  [][]byte
}

// Msg is an OP_MSG message. Body and Documents alias the decoded frame.
type Msg struct {
	Flags     MsgFlags
	Body      []byte
	Sequences []Sequence

	// bodyPos is how many sequences came before the body on the wire, so
	// that Encode reproduces a decoded message byte for byte. Zero (body
	// first, the usual order) for messages built by hand.
	bodyPos int
}

// Decode decodes a whole OP_MSG frame (header included) into m, replacing
// its contents. When ChecksumPresent is set it verifies the CRC-32C and
// cuts it off before reading any section; then it checks every structural
// rule (see checkSections). The checksum is not kept: Encode recomputes it
// when m.Flags has ChecksumPresent.
//
// Decode reuses the memory of m.Sequences and of their Documents slices, so
// slices taken from m before are overwritten. On error the contents of m
// are unspecified.
func (m *Msg) Decode(frame []byte) error {
	*m = Msg{Sequences: m.Sequences[:0]}
	_, rest, err := checkFrame(frame, OpMsg)
	if err != nil {
		return err
	}
	if len(rest) < 4 {
		return malformed("OP_MSG: message of %d bytes too short for flags", len(frame))
	}
	m.Flags = MsgFlags(binary.LittleEndian.Uint32(rest))
	if unknown := m.Flags & requiredFlags &^ knownRequired; unknown != 0 {
		return malformed("OP_MSG: unknown required flag bits 0x%04x", uint32(unknown))
	}
	rest = rest[4:]
	if m.Flags&ChecksumPresent != 0 {
		if len(rest) < 4 {
			return malformed("OP_MSG: checksum flag set but only %d bytes after flags", len(rest))
		}
		end := len(frame) - 4
		want := binary.LittleEndian.Uint32(frame[end:])
		if got := crc32.Checksum(frame[:end], castagnoli); got != want {
			return malformed("OP_MSG: checksum mismatch: message has 0x%08x, computed 0x%08x", want, got)
		}
		rest = rest[:len(rest)-4]
	}
	return m.checkSections(rest)
}

// checkSections reads the sections in src (flags and checksum already cut
// off) into m and enforces every OP_MSG structure rule:
//   - only section kinds 0 (body) and 1 (document sequence);
//   - exactly one body;
//   - every document length-bounded (MaxDocLen, and within its section) and
//     valid BSON (bsoncore Validate, nesting at most MaxDepth);
//   - a sequence's size covers exactly its identifier and whole documents;
//   - sequence identifiers non-empty and unique;
//   - no top-level field of the body named like a sequence identifier.
func (m *Msg) checkSections(src []byte) error {
	bodies := 0
	for len(src) > 0 {
		kind := src[0]
		src = src[1:]
		switch kind {
		case sectionBody:
			bodies++
			doc, rem, err := readDoc(src, "body")
			if err != nil {
				return fmt.Errorf("OP_MSG: %w", err)
			}
			if bodies == 1 {
				m.Body = doc
				m.bodyPos = len(m.Sequences)
			}
			src = rem
		case sectionSequence:
			var reuse [][]byte
			if n := len(m.Sequences); n < cap(m.Sequences) {
				reuse = m.Sequences[:n+1][n].Documents
			}
			seq, rem, err := readSequence(src, reuse)
			if err != nil {
				return err
			}
			m.Sequences = append(m.Sequences, seq)
			src = rem
		default:
			return malformed("OP_MSG: unknown section kind %d", kind)
		}
	}
	switch {
	case bodies == 0:
		return malformed("OP_MSG: no body section")
	case bodies > 1:
		return malformed("OP_MSG: %d body sections", bodies)
	}
	return checkIdentifiers(m.Body, m.Sequences)
}

// readSequence reads one kind-1 section (after the kind byte), appending
// its documents to docs[:0].
func readSequence(src []byte, docs [][]byte) (Sequence, []byte, error) {
	if len(src) < 4 {
		return Sequence{}, src, malformed("OP_MSG: truncated document sequence: %d bytes left for its size", len(src))
	}
	size := int32(binary.LittleEndian.Uint32(src))
	if size < 5 || int64(size) > int64(len(src)) {
		return Sequence{}, src, malformed("OP_MSG: document sequence size %d but %d bytes left", size, len(src))
	}
	id, data, rem, ok := wiremessage.ReadMsgSectionRawDocumentSequence(src)
	if !ok {
		return Sequence{}, src, malformed("OP_MSG: document sequence identifier not NUL-terminated within its size %d", size)
	}
	if id == "" {
		return Sequence{}, src, malformed("OP_MSG: document sequence with empty identifier")
	}
	seq := Sequence{Identifier: id, Documents: docs[:0]}
	for len(data) > 0 {
		doc, r, err := readDocNamed(data, docName{seq: id})
		if err != nil {
			return Sequence{}, src, fmt.Errorf("OP_MSG: document %d: %w", len(seq.Documents), err)
		}
		seq.Documents = append(seq.Documents, doc)
		data = r
	}
	return seq, rem, nil
}

// checkIdentifiers enforces unique identifiers that are not body fields.
func checkIdentifiers(body []byte, seqs []Sequence) error {
	if len(seqs) == 0 {
		return nil
	}
	var set map[string]struct{}
	if len(seqs) > 8 {
		set = make(map[string]struct{}, len(seqs))
	}
	for i, s := range seqs {
		if set != nil {
			if _, dup := set[s.Identifier]; dup {
				return malformed("OP_MSG: document sequence %q appears twice", s.Identifier)
			}
			set[s.Identifier] = struct{}{}
			continue
		}
		for _, t := range seqs[:i] {
			if t.Identifier == s.Identifier {
				return malformed("OP_MSG: document sequence %q appears twice", s.Identifier)
			}
		}
	}
	// The body is valid, so its elements read cleanly.
	elems := body[4 : len(body)-1]
	for len(elems) > 0 {
		e, rem, ok := bsoncore.ReadElement(elems)
		if !ok {
			break
		}
		elems = rem
		key := e.KeyBytes()
		found := false
		if set != nil {
			_, found = set[string(key)]
		} else {
			for _, s := range seqs {
				if s.Identifier == string(key) {
					found = true
					break
				}
			}
		}
		if found {
			return malformed("OP_MSG: document sequence %q also a field of the body", key)
		}
	}
	return nil
}

// Encode appends m as a whole OP_MSG frame (see the package doc). Sections
// are written in the order they were decoded in (body first for a Msg built
// by hand); a checksum is computed and appended when m.Flags has
// ChecksumPresent. Encode checks the structure (one body, identifiers
// non-empty, NUL-free and unique, document length prefixes) but does not
// re-validate the BSON inside documents.
func (m *Msg) Encode(dst []byte, h Header) ([]byte, error) {
	if err := checkDocPrefix(m.Body, "body"); err != nil {
		return dst, fmt.Errorf("OP_MSG: %w", err)
	}
	for i, s := range m.Sequences {
		if s.Identifier == "" {
			return dst, malformed("OP_MSG: document sequence with empty identifier")
		}
		for j := 0; j < len(s.Identifier); j++ {
			if s.Identifier[j] == 0 {
				return dst, malformed("OP_MSG: document sequence identifier %q contains NUL", s.Identifier)
			}
		}
		for _, t := range m.Sequences[:i] {
			if t.Identifier == s.Identifier {
				return dst, malformed("OP_MSG: document sequence %q appears twice", s.Identifier)
			}
		}
		for k, d := range s.Documents {
			// The name is formatted for an error only: this runs for every
			// document of every insert the proxy sends.
			if checkDocPrefix(d, "") == nil {
				continue
			}
			return dst, fmt.Errorf("OP_MSG: %w", checkDocPrefix(d, fmt.Sprintf("document sequence %q document %d", s.Identifier, k)))
		}
	}
	start, dst := appendHeaderStart(dst, h, OpMsg)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(m.Flags))
	bodyPos := min(max(m.bodyPos, 0), len(m.Sequences))
	for i := 0; i <= len(m.Sequences); i++ {
		if i == bodyPos {
			dst = append(dst, sectionBody)
			dst = append(dst, m.Body...)
		}
		if i == len(m.Sequences) {
			break
		}
		s := m.Sequences[i]
		dst = append(dst, sectionSequence)
		at := len(dst)
		dst = append(dst, 0, 0, 0, 0)
		dst = append(dst, s.Identifier...)
		dst = append(dst, 0)
		for _, d := range s.Documents {
			dst = append(dst, d...)
		}
		if n := len(dst) - at; n > MaxMsgLen {
			return dst[:start], &LimitError{What: "message length", Size: int64(n), Limit: MaxMsgLen}
		}
		binary.LittleEndian.PutUint32(dst[at:], uint32(len(dst)-at))
	}
	if m.Flags&ChecksumPresent != 0 {
		dst = append(dst, 0, 0, 0, 0)
	}
	dst, err := finishFrame(dst, start)
	if err != nil {
		return dst[:start], err
	}
	if m.Flags&ChecksumPresent != 0 {
		putChecksum(dst[start:])
	}
	return dst, nil
}

// putChecksum writes the CRC-32C of frame[:len-4] into its last 4 bytes.
func putChecksum(frame []byte) {
	end := len(frame) - 4
	binary.LittleEndian.PutUint32(frame[end:], crc32.Checksum(frame[:end], castagnoli))
}

// checkDocPrefix checks that d is a single document whose length prefix
// equals len(d) and that fits MaxDocLen.
func checkDocPrefix(d []byte, what string) error {
	if len(d) < 5 {
		return malformed("%s: document of %d bytes, need at least 5", what, len(d))
	}
	n := int32(binary.LittleEndian.Uint32(d))
	if int64(n) != int64(len(d)) {
		return malformed("%s: document length %d but %d bytes", what, n, len(d))
	}
	if n > MaxDocLen {
		return fmt.Errorf("%s: %w", what, &LimitError{What: "document length", Size: int64(n), Limit: MaxDocLen})
	}
	return nil
}

// CommandName returns the first key of the body: the command's name.
func (m *Msg) CommandName() string { return firstKey(m.Body) }

// DB returns the body's "$db" string, or "".
func (m *Msg) DB() string {
	s, _ := lookupString(m.Body, "$db")
	return s
}

// AppendMsg appends an OP_MSG frame with body as its only section, and a
// checksum if flags has ChecksumPresent. body must be a valid document.
func AppendMsg(dst []byte, requestID, responseTo int32, flags MsgFlags, body []byte) []byte {
	start := len(dst)
	dst = wiremessage.AppendHeader(dst, 0, requestID, responseTo, wiremessage.OpMsg)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(flags))
	dst = append(dst, sectionBody)
	dst = append(dst, body...)
	if flags&ChecksumPresent != 0 {
		dst = append(dst, 0, 0, 0, 0)
	}
	binary.LittleEndian.PutUint32(dst[start:], uint32(len(dst)-start))
	if flags&ChecksumPresent != 0 {
		putChecksum(dst[start:])
	}
	return dst
}

// SetMsgFlags sets the flags of an OP_MSG frame without re-encoding its
// sections, and returns the frame. If the frame has a checksum it is first
// verified. When ChecksumPresent is unchanged the frame is modified in place
// (and its checksum, if any, recomputed); when it is cleared the checksum is
// cut off (in place, shorter frame); when it is set, a checksum is appended
// (which may reallocate). Only the header and flags are checked, not the
// sections.
func SetMsgFlags(frame []byte, flags MsgFlags) ([]byte, error) {
	_, rest, err := checkFrame(frame, OpMsg)
	if err != nil {
		return frame, err
	}
	if len(rest) < 4 {
		return frame, malformed("OP_MSG: message of %d bytes too short for flags", len(frame))
	}
	old := MsgFlags(binary.LittleEndian.Uint32(rest))
	if old&ChecksumPresent != 0 {
		if len(rest) < 8 {
			return frame, malformed("OP_MSG: checksum flag set but only %d bytes after flags", len(rest)-4)
		}
		end := len(frame) - 4
		if want, got := binary.LittleEndian.Uint32(frame[end:]), crc32.Checksum(frame[:end], castagnoli); got != want {
			return frame, malformed("OP_MSG: checksum mismatch: message has 0x%08x, computed 0x%08x", want, got)
		}
	}
	switch had, want := old&ChecksumPresent != 0, flags&ChecksumPresent != 0; {
	case had && !want:
		frame = frame[:len(frame)-4]
	case !had && want:
		if len(frame)+4 > MaxMsgLen {
			return frame, &LimitError{What: "message length", Size: int64(len(frame) + 4), Limit: MaxMsgLen}
		}
		frame = append(frame, 0, 0, 0, 0)
	}
	binary.LittleEndian.PutUint32(frame, uint32(len(frame)))
	binary.LittleEndian.PutUint32(frame[HeaderLen:], uint32(flags))
	if flags&ChecksumPresent != 0 {
		putChecksum(frame)
	}
	return frame, nil
}
