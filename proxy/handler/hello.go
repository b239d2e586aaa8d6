package handler

import (
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/proxy/exec"
	"github.com/tsproxy/tsproxy/rewrite/hello"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/wire"
)

// handleHello forwards the client's hello (its authentication mechanisms
// and speculative authentication reach the upstream) and presents the proxy
// as a router in the reply, so drivers never learn of, nor connect to,
// anything but the proxy. The proxy negotiates compression itself.
func (c *Conn) handleHello(req *request) error {
	hs, err := hello.Request(req.msg.Body)
	if err != nil {
		return c.replyError(req, mongoerr.InvalidBSON, "tsproxy: "+err.Error())
	}
	var opts hello.ReplyOptions
	for _, name := range hs.Compressors {
		if id, ok := wire.CompressorID(name); ok && id != 0 {
			opts.Compressor, c.compressor = name, id
			break
		}
	}
	if hs.LoadBalanced {
		// This proxy is the service behind the client's load balancer;
		// the driver pins cursors and transactions to this connection.
		opts.ServiceID = &c.s.ServiceID
	}
	if err := c.ensureUpstream(); err != nil {
		// Answer as a router anyway so that drivers select the proxy and
		// the commands that follow fail at once with the upstream error,
		// instead of each waiting out server selection.
		c.log.Warn("upstream unreachable; answering hello alone", "err", err.Error())
		reply := hello.RouterHello(req.name != "hello", c.s.Abilities.HelloLimits(), time.Now().UnixMilli(), opts)
		return c.replyBody(req, hello.CapLimits(reply, c.s.Opts.MaxMessageBytes))
	}
	frame := wire.AppendMsg(c.outBuf[:0], req.h.RequestID, 0, 0, hs.Body)
	c.outBuf = frame[:0]
	span := c.s.Tel.Start(req.name, req.db, routePassthrough.String(), req.start)
	upStart := time.Now()
	_, rf, err := exec.Forward(c.up, frame)
	c.endAfterReply(span, time.Since(upStart), err)
	if err != nil {
		return err
	}
	var m wire.Msg
	if err := m.Decode(rf); err != nil {
		return fmt.Errorf("upstream hello reply: %w", err)
	}
	c.s.Abilities.RememberHello(bson.Raw(m.Body))
	reply, err := hello.Reply(m.Body, opts)
	if err != nil {
		return fmt.Errorf("upstream hello reply: %w", err)
	}
	return c.replyBody(req, hello.CapLimits(reply, c.s.Opts.MaxMessageBytes))
}

// replyUpstreamDown answers a request the upstream could not be reached for.
func (c *Conn) replyUpstreamDown(req *request, err error) error {
	if req.msg.Flags&wire.MoreToCome != 0 {
		return nil
	}
	return c.replyError(req, mongoerr.HostUnreachable, "tsproxy: "+err.Error())
}

// replyError answers req with {ok: 0, errmsg, code, codeName}.
func (c *Conn) replyError(req *request, code mongoerr.Code, msg string) error {
	c.s.Tel.ErrorSeen(code.Name())
	return c.replyBody(req, mongoerr.ReplyNamed(code, "", msg))
}
