// Package wire frames, decodes and encodes MongoDB wire-protocol messages:
// OP_MSG (body and document sequences, CRC-32C checksums), the legacy
// OP_QUERY / OP_REPLY pair used by the handshake, and OP_COMPRESSED
// (snappy, zlib, zstd).
//
// It knows nothing of rules or rewriting. Its public API uses only plain Go
// types and BSON documents as []byte (directly usable as bson.Raw); the
// driver's x/ packages it builds on are an implementation detail.
//
// # Frames and aliasing
//
// A frame is one whole message, its 16-byte header included. Every Decode
// method takes a whole frame and checks that the header's messageLength equals
// len(frame) and that the opcode matches. Decoded documents ([]byte fields)
// alias the frame: they stay valid only as long as the frame's bytes do (see
// ReadMessage for the lifetime of a frame read into a reused buffer). Copy
// them (bytes.Clone) to keep them longer.
//
// Every Encode method appends one whole frame to dst, computing the
// messageLength itself (h.MessageLength is ignored) and writing the opcode of
// the message type (h.OpCode is ignored); h supplies RequestID and ResponseTo.
//
// # Errors
//
// Every error caused by bad input satisfies errors.Is(err, ErrMalformed) and
// says what is wrong; errors about size limits are also *LimitError. No input
// makes this package panic.
package wire
