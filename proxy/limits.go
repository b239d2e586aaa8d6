package proxy

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/wire"
)

// drainOversized bounds how long the proxy reads and drops the rest of a
// message it refused for its size, so that its error reply reaches the
// client (closing a socket with unread input resets it, and the client
// would lose the reply) without letting a slow sender hold the goroutine.
const drainOversized = 5 * time.Second

// refuseOversized answers a request whose header announced more than
// limits.maxMessageBytes (yet no more than the protocol's 48,000,000
// bytes, in a request opcode) with an error naming the limit, then drains what
// the client still sends of it; the caller closes the connection, as
// MongoDB does. Other read errors are left to the caller.
func (c *conn) refuseOversized(h wire.Header, err error) {
	var le *wire.LimitError
	if !errors.As(err, &le) || le.Min || le.Size > wire.MaxMsgLen {
		return // not a message a MongoDB client could send: close silently
	}
	switch h.OpCode {
	case wire.OpMsg, wire.OpQuery, wire.OpCompressed:
	default:
		return
	}
	msg := fmt.Sprintf("tsproxy: message of %d bytes is larger than the limit of %d bytes (limits.maxMessageBytes)", le.Size, le.Limit)
	c.log.Warn("refusing an oversized message", "size", le.Size, "limit", le.Limit)
	if rerr := c.h.Refuse(h, mongoerr.BSONObjectTooLarge, msg); rerr != nil {
		return
	}
	_ = c.nc.SetReadDeadline(time.Now().Add(drainOversized))
	_, _ = io.CopyN(io.Discard, c.r, le.Size-wire.HeaderLen)
}
