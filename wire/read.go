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
		return Header{}, nil, err
	}
	if cap(buf) < int(length) {
		buf = make([]byte, length)
	} else {
		buf = buf[:length]
	}
	copy(buf, hb) // no-op when hb is buf's own prefix
	if n, err := io.ReadFull(r, buf[HeaderLen:]); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return Header{}, nil, fmt.Errorf("reading message body: got %d of %d bytes: %w", n, length-HeaderLen, err)
	}
	h, _ := ParseHeader(buf)
	return h, buf, nil
}
