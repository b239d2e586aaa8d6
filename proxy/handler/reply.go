package handler

import (
	"errors"
	"fmt"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/upstream"
	"github.com/tsproxy/tsproxy/wire"
)

// writeFrame sends a whole reply frame, compressed if the request was.
// A reply over limits.maxMessageBytes, which hello announces as the
// maxMessageSizeBytes of both directions, is answered with an error
// naming the limit: a driver drops a connection whose reply is larger
// than the server announced ("length of read message too large") and
// retried until its deadline.
func (c *Conn) writeFrame(req *request, frame []byte) error {
	if len(frame) > c.s.Opts.MaxMessageBytes {
		msg := fmt.Sprintf("tsproxy: the reply of %d bytes is larger than the limit of %d bytes (limits.maxMessageBytes, announced as maxMessageSizeBytes); ask for smaller batches (batchSize)", len(frame), c.s.Opts.MaxMessageBytes)
		c.log.Warn("refusing an oversized reply", "command", req.name, "size", len(frame), "limit", c.s.Opts.MaxMessageBytes)
		body := mongoerr.Reply(mongoerr.Errorf(mongoerr.BSONObjectTooLarge, "%s", msg))
		if req.legacy {
			frame = wire.AppendReply(nil, upstream.NextRequestID(), req.h.RequestID, body)
		} else {
			frame = wire.AppendMsg(nil, upstream.NextRequestID(), req.h.RequestID, 0, body)
		}
	}
	if req.compressor != 0 {
		cf, err := wire.Compress(frame, req.compressor)
		if err != nil {
			return fmt.Errorf("compress reply: %w", err)
		}
		frame = cf
	}
	// One Write of the whole frame: a write buffer would only copy it.
	// Bounded: a client that never reads its replies kept its
	// connection, its upstream connection and the reply for good.
	if err := c.front.Write(frame); err != nil {
		return err
	}
	req.replied = true
	c.s.Tel.BytesOut(len(frame))
	return nil
}

// replyBody sends body as the reply to req, in the opcode the client used.
func (c *Conn) replyBody(req *request, body []byte) error {
	if req.txn != nil {
		req.txn.Offer(body)
	}
	if req.msg.Flags&wire.MoreToCome != 0 {
		// The client reads no reply to a moreToCome request: one sent
		// would answer its next request. Every handler replies here.
		return nil
	}
	var frame []byte
	if req.legacy {
		frame = wire.AppendReply(c.outBuf[:0], upstream.NextRequestID(), req.h.RequestID, body)
	} else {
		frame = wire.AppendMsg(c.outBuf[:0], upstream.NextRequestID(), req.h.RequestID, 0, body)
	}
	c.outBuf = frame[:0]
	return c.writeFrame(req, frame)
}

// errAnswered ends a request's route early: a gate answered it itself
// (or it was a moreToCome request, which wants no answer). The
// connection's handle takes it for success.
var errAnswered = errors.New("tsproxy: request answered")

// answered is errAnswered, or the error answering the request met.
func answered(err error) error {
	if err != nil {
		return err
	}
	return errAnswered
}
