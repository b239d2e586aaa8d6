package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// ReadMessage reads one whole frame (header included) from r.
//
// The frame is read into buf when cap(buf) is large enough, otherwise into
// a newly allocated slice. Either way the returned frame aliases that
// memory: it, and everything decoded from it, is valid only until the next
// call that reuses the same buffer. Pass the returned frame's backing array
// back in (buf = frame[:0]) to reuse it across calls.
//
// A frame that does not fit buf is read into memory that grows as its
// bytes arrive, so a header claiming a large length costs only what the
// peer actually sends.
//
// maxLen bounds the messageLength (0 or anything above MaxMsgLen means
// MaxMsgLen). The length is checked before any allocation: below 16 or above
// maxLen gives a *LimitError (matching ErrMalformed) naming the length.
// End of input before the first byte gives io.EOF unwrapped (a clean close);
// end of input within a frame gives an error wrapping io.ErrUnexpectedEOF.
// Other read errors are returned wrapped.
func ReadMessage(r io.Reader, buf []byte, maxLen int) (Header, []byte, error) {
	if maxLen <= 0 || maxLen > MaxMsgLen {
		maxLen = MaxMsgLen
	}
	var small [HeaderLen]byte
	hb := small[:]
	if cap(buf) >= HeaderLen {
		hb = buf[:HeaderLen]
	}
	if n, err := io.ReadFull(r, hb); err != nil {
		if errors.Is(err, io.EOF) && n == 0 {
			return Header{}, nil, io.EOF
		}
		return Header{}, nil, fmt.Errorf("reading message header: got %d of %d bytes: %w", n, HeaderLen, err)
	}
	length := int64(int32(binary.LittleEndian.Uint32(hb)))
	if err := checkLength(length, int64(maxLen)); err != nil {
		// The header is whole: the caller can answer the request it
		// refuses (a *LimitError) before closing.
		h, _ := ParseHeader(hb)
		return h, nil, err
	}
	if cap(buf) >= int(length) {
		buf = buf[:length]
		copy(buf, hb) // no-op when hb is buf's own prefix
		if n, err := io.ReadFull(r, buf[HeaderLen:]); err != nil {
			return Header{}, nil, bodyErr(n, length, err)
		}
	} else {
		// Grow as the bytes arrive, so that a header claiming a large
		// message costs memory only for what the peer actually sends.
		buf = append(make([]byte, 0, min(length, readChunk)), hb...)
		for int64(len(buf)) < length {
			if len(buf) == cap(buf) {
				nb := make([]byte, len(buf), min(length, 2*int64(cap(buf))))
				copy(nb, buf)
				buf = nb
			}
			n, err := io.ReadFull(r, buf[len(buf):cap(buf)])
			buf = buf[:len(buf)+n]
			if err != nil {
				return Header{}, nil, bodyErr(len(buf)-HeaderLen, length, err)
			}
		}
	}
	h, _ := ParseHeader(buf)
	return h, buf, nil
}

// readChunk is the first allocation for a frame that does not fit the
// caller's buffer; it doubles from there as bytes arrive.
const readChunk = 64 << 10

func bodyErr(n int, length int64, err error) error {
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("reading message body: got %d of %d bytes: %w", n, length-HeaderLen, err)
}
