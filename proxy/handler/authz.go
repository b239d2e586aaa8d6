package handler

import (
	"github.com/tsproxy/tsproxy/proxy/authz"
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/wire"
)

// Authorization is package authz's, on the client's own upstream
// connection (upCommand).

// noteAuthChange forgets what the connection knew of its authentication
// when req may change it.
func (c *Conn) noteAuthChange(req *request) {
	if authz.Changes(req.name, req.msg.Body) {
		c.auth.Forget()
		c.upAuth = true
	}
}

func (c *Conn) authInfo() (rewrite.AuthInfo, error) { return c.auth.Info(c.upCommand) }
func (c *Conn) users() ([]string, error)            { return c.auth.Users(c.upCommand) }
func (c *Conn) identity() (string, error)           { return c.auth.Identity(c.upCommand) }

func (c *Conn) authorize(req *request, rule *rules.Rule) (denied []byte, err error) {
	return c.auth.Authorize(c.upCommand, req.name, rule)
}

// gateList asks the server to list db as the client before the proxy
// lists it (or refuses a filter) with what it knows of db's rules; done
// is true when req was answered (refused) already.
func (c *Conn) gateList(req *request, db string) error {
	reply, err := c.upCommand(rewrite.ListProbe(db))
	if err != nil || mongoerr.IsOK(reply) {
		return err
	}
	c.s.Tel.ErrorSeen("Unauthorized")
	return answered(c.replyBody(req, reply))
}

// gate authorizes req before the proxy serves it; done is true when it
// was answered (refused) already.
func (c *Conn) gate(req *request, rule *rules.Rule) error {
	denied, err := c.authorize(req, rule)
	if err != nil || denied == nil {
		return err
	}
	c.s.Tel.ErrorSeen("Unauthorized")
	c.log.Info("command refused by the upstream's authorization", "rule", rule.Namespace, "command", req.name)
	if req.msg.Flags&wire.MoreToCome != 0 {
		return errAnswered
	}
	return answered(c.replyBody(req, denied))
}
