package proxy

import (
	"errors"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/wire"
)

// upstreamRefusal is an error reply of the upstream to a command the proxy
// sent for a client (a bucket fill load, capability detection): the
// client gets it as its command's error, with the upstream's code, rather
// than a closed connection. An unauthenticated client, say, must see the
// upstream's Unauthorized error, as it would without the proxy; a closed
// connection would make its driver retry the write without end.
type upstreamRefusal struct {
	code     mongoerr.Code
	codeName string
	msg      string
}

func (e *upstreamRefusal) Error() string { return e.msg }

// refusalOf returns the refusal in an {ok: 0} reply, or nil when the reply
// is not one.
func refusalOf(reply bson.Raw) *upstreamRefusal {
	if ok, _ := reply.Lookup("ok").AsFloat64OK(); ok == 1 {
		return nil
	}
	r := &upstreamRefusal{code: mongoerr.UnknownError, codeName: mongoerr.UnknownError.Name()}
	if code, ok := reply.Lookup("code").AsInt64OK(); ok {
		r.code = mongoerr.Code(code)
	}
	if name, ok := reply.Lookup("codeName").StringValueOK(); ok {
		r.codeName = name
	}
	r.msg, _ = reply.Lookup("errmsg").StringValueOK()
	if r.msg == "" {
		r.msg = fmt.Sprintf("upstream refused the command (code %d)", r.code)
	}
	return r
}

// answerRefusal answers req with the upstream's refusal found in err (its
// message with the proxy's context); any other error is returned as is and
// closes the connection.
func (c *conn) answerRefusal(req *request, err error) error {
	var held *LeaseHeldError
	if errors.As(err, &held) {
		if req.msg.Flags&wire.MoreToCome != 0 {
			c.log.Warn("unacknowledged write refused", "err", err.Error())
			return nil
		}
		return c.replyError(req, mongoerr.ConflictingOperationInProgress, err.Error())
	}
	var r *upstreamRefusal
	if err == nil || !errors.As(err, &r) {
		return err
	}
	if req.msg.Flags&wire.MoreToCome != 0 {
		c.log.Warn("unacknowledged command refused by the upstream", "err", err.Error())
		return nil
	}
	c.s.tel.errorSeen(r.codeName)
	return c.replyBody(req, mongoerr.ReplyNamed(r.code, r.codeName, err.Error()))
}

// commandError is nil for an {ok: 1} reply and the upstream's refusal
// otherwise.
func commandError(reply bson.Raw) error {
	if r := refusalOf(reply); r != nil {
		return r
	}
	return nil
}

// isCode says whether err is an upstream refusal with code.
func isCode(err error, code mongoerr.Code) bool {
	var r *upstreamRefusal
	return errors.As(err, &r) && r.code == code
}
