package handler

import (
	"log/slog"

	"github.com/tsproxy/tsproxy/proxy/admin"
	"github.com/tsproxy/tsproxy/proxy/catalog"
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/upstream"
	"github.com/tsproxy/tsproxy/wire"
)

// catalogClient is a request on c as the packages that serve whole
// commands see it: the time-series API (catalog.Client) and the proxy's
// own commands (admin.Client).
type catalogClient struct {
	c   *Conn
	req *request
}

func (c *Conn) catalogClient(req *request) catalogClient { return catalogClient{c: c, req: req} }

func (k catalogClient) RunStep(step rewrite.Step) ([][]byte, error) { return k.c.RunStep(step) }
func (k catalogClient) Name() string                                { return k.req.name }
func (k catalogClient) DB() string                                  { return k.req.db }
func (k catalogClient) Body() []byte                                { return k.req.msg.Body }
func (k catalogClient) Unacked() bool                               { return k.req.msg.Flags&wire.MoreToCome != 0 }
func (k catalogClient) Reply(body []byte) error                     { return k.c.replyBody(k.req, body) }
func (k catalogClient) ReplyError(code mongoerr.Code, msg string) error {
	return k.c.replyError(k.req, code, msg)
}
func (k catalogClient) ReplyRewriteError(err error) error { return k.c.replyRewriteError(k.req, err) }
func (k catalogClient) ReplyUpstreamDown(err error) error { return k.c.replyUpstreamDown(k.req, err) }
func (k catalogClient) ReplyCatalogDown(err error) error  { return k.c.replyCatalogDown(k.req, err) }
func (k catalogClient) EnsureUpstream() error             { return k.c.ensureUpstream() }
func (k catalogClient) Upstream() *upstream.Conn          { return k.c.up }
func (k catalogClient) Gate(rule *rules.Rule) error       { return k.c.gate(k.req, rule) }
func (k catalogClient) RunPlan(rule *rules.Rule, p rewrite.Plan) (rewrite.Result, error) {
	return k.c.runPlan(k.req, rule, routeRewrite, p)
}
func (k catalogClient) Answer(rule *rules.Rule, res rewrite.Result) error {
	return k.c.answer(k.req, rule, res)
}
func (k catalogClient) UpCommand(body []byte) ([]byte, error) { return k.c.upCommand(body) }
func (k catalogClient) AuthInfo() (rewrite.AuthInfo, error)   { return k.c.authInfo() }
func (k catalogClient) EnsureBucketIndex(rule *rules.Rule)    { k.c.ensureBucketIndex(rule) }
func (k catalogClient) ForgetNamespace(ns string)             { k.c.s.ForgetNamespace(ns) }
func (k catalogClient) Log() *slog.Logger                     { return k.c.log }

func (k catalogClient) Rules() *rules.Set { return k.c.rules }
func (k catalogClient) Authorize(rule *rules.Rule) ([]byte, error) {
	return k.c.authorize(k.req, rule)
}
func (k catalogClient) StagedRule(rule *rules.Rule) (bool, caps.Upstream, error) {
	return k.c.stagedRule(rule)
}

var (
	_ catalog.Client = catalogClient{}
	_ admin.Client   = catalogClient{}
)

func (c *Conn) serveFlush(req *request) error {
	return admin.ServeFlush(c.s.Tier(), c.catalogClient(req))
}

func (c *Conn) serveStagingFormat(req *request) error {
	return admin.ServeStagingFormat(c.s.Tier(), c.catalogClient(req))
}
