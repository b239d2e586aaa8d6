package handler

import (
	"errors"

	"github.com/tsproxy/tsproxy/proxy/tier/lease"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/upstream"
	"github.com/tsproxy/tsproxy/wire"
)

// answerRefusal answers req with the upstream's refusal found in err (its
// message with the proxy's context); any other error is returned as is and
// closes the connection.
func (c *Conn) answerRefusal(req *request, err error) error {
	var held *lease.HeldError
	if errors.As(err, &held) {
		if req.msg.Flags&wire.MoreToCome != 0 {
			c.log.Warn("unacknowledged write refused", "err", err.Error())
			return nil
		}
		return c.replyError(req, mongoerr.ConflictingOperationInProgress, err.Error())
	}
	var r *upstream.Refusal
	if err == nil || !errors.As(err, &r) {
		return err
	}
	if req.msg.Flags&wire.MoreToCome != 0 {
		c.log.Warn("unacknowledged command refused by the upstream", "err", err.Error())
		return nil
	}
	c.s.Tel.ErrorSeen(r.CodeName)
	return c.replyBody(req, mongoerr.ReplyNamed(r.Code, r.CodeName, err.Error()))
}
