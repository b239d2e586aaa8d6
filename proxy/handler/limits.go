package handler

import (
	"errors"
	"fmt"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/wire"
)

// tooManyCursors is the refusal of a cursor over limits.maxCursors.
func (c *Conn) tooManyCursors(rule *rules.Rule) []byte {
	c.log.Warn("open cursor limit reached", "rule", rule.Namespace, "limit", c.s.Opts.MaxCursors)
	c.s.Tel.ErrorSeen(mongoerr.TooManyCursors.Name())
	return mongoerr.ReplyNamed(mongoerr.TooManyCursors, "", fmt.Sprintf(
		"tsproxy rule %s: the proxy holds its limit of %d open cursors (limits.maxCursors); exhaust or kill cursors, or raise the limit", rule.Namespace, c.s.Opts.MaxCursors))
}

// refuseDecompressed answers a compressed request whose original message
// is over limits.maxMessageBytes as refuseOversized answers one that says
// so in its header: the limit holds however the message is sent. The
// frame was read whole, so nothing is left to drain; the caller closes the
// connection.
func (c *Conn) refuseDecompressed(h wire.Header, err error) {
	var le *wire.LimitError
	if !errors.As(err, &le) || le.Min {
		return
	}
	msg := fmt.Sprintf("tsproxy: message of %d bytes (sent compressed in %d) is larger than the limit of %d bytes (limits.maxMessageBytes)", le.Size, h.MessageLength, le.Limit)
	c.log.Warn("refusing an oversized message", "size", le.Size, "compressed", h.MessageLength, "limit", le.Limit)
	_ = c.replyError(&request{h: h}, mongoerr.BSONObjectTooLarge, msg)
}
