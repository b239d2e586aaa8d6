package admin

import (
	"github.com/tsproxy/tsproxy/proxy/tier"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
)

// Client is the request being served, as the connection gives it.
type Client interface {
	tier.Client
	// Body is the command's body.
	Body() []byte
	// EnsureUpstream opens the client's upstream connection.
	EnsureUpstream() error
	// Reply, ReplyError and ReplyUpstreamDown answer the request.
	Reply(body []byte) error
	ReplyError(code mongoerr.Code, msg string) error
	ReplyUpstreamDown(err error) error
	// Rules is the rule set the request is routed by.
	Rules() *rules.Set
	// Authorize asks the upstream whether the client may read rule's
	// namespace: denied is the upstream's refusal, for the client.
	Authorize(rule *rules.Rule) (denied []byte, err error)
	// StagedRule says whether rule stages on the upstream, with its caps.
	StagedRule(rule *rules.Rule) (staged bool, caps caps.Upstream, err error)
}
