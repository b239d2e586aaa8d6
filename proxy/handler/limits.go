package handler

import (
	"errors"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/wire"
)

// helloEnvelope is the room left in a message for the command around the
// largest document a driver may send (insert, lsid, $clusterTime...).
const helloEnvelope = 4096

// capHelloLimits lowers the sizes a hello reply announces to the proxy's
// own message limit, so that drivers split batches and refuse documents
// under it instead of sending messages the proxy must refuse.
func (c *Conn) capHelloLimits(reply []byte) []byte {
	limits := map[string]int64{
		"maxMessageSizeBytes": int64(c.s.opts.MaxMessageBytes),
		// A document must fit in a message with its command around it.
		"maxBsonObjectSize": int64(c.s.opts.MaxMessageBytes) - helloEnvelope,
	}
	raw := bson.Raw(reply)
	over := func(key string) bool {
		v, ok := raw.Lookup(key).AsInt64OK()
		return ok && v > limits[key]
	}
	if !over("maxMessageSizeBytes") && !over("maxBsonObjectSize") {
		return reply
	}
	var d bson.D
	if err := bson.Unmarshal(reply, &d); err != nil {
		return reply
	}
	for i, e := range d {
		if limit, ok := limits[e.Key]; ok && over(e.Key) {
			d[i].Value = int32(limit)
		}
	}
	out, err := bson.Marshal(d)
	if err != nil {
		return reply
	}
	return out
}

// tooManyCursors is the refusal of a cursor over limits.maxCursors.
func (c *Conn) tooManyCursors(rule *rules.Rule) []byte {
	c.log.Warn("open cursor limit reached", "rule", rule.Namespace, "limit", c.s.opts.MaxCursors)
	c.s.tel.ErrorSeen(mongoerr.TooManyCursors.Name())
	return mongoerr.ReplyNamed(mongoerr.TooManyCursors, "", fmt.Sprintf(
		"tsproxy rule %s: the proxy holds its limit of %d open cursors (limits.maxCursors); exhaust or kill cursors, or raise the limit", rule.Namespace, c.s.opts.MaxCursors))
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
