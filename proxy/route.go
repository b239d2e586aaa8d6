package proxy

import (
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rules"
)

// route says how a request is served.
type route uint8

const (
	routePassthrough route = iota // bytes through unchanged
	routeRewrite                  // a command on a bucketed namespace
	routeCursor                   // getMore/killCursors of a rewritten read's cursor
)

func (r route) String() string {
	switch r {
	case routeRewrite:
		return "rewritten"
	case routeCursor:
		return "cursor"
	}
	return "passthrough"
}

// bucketedTarget finds the rule a request is subject to. Commands name
// their collection as the value of their first field; getMore names a
// cursor, which is the proxy's if a rewritten read opened it; explain
// wraps another command.
func (c *conn) bucketedTarget(req *request) (*rules.Rule, route) {
	if c.rules.Len() == 0 {
		return nil, routePassthrough
	}
	body := bson.Raw(req.msg.Body)
	first, err := body.IndexErr(0)
	if err != nil {
		return nil, routePassthrough
	}
	switch req.name {
	case "getMore":
		// Any number: a registered cursor's id sent as a double or an int32
		// must meet the proxy's owner check (rewriteGetMore then refuses
		// the type, as MongoDB does), not reach the upstream unchecked.
		id, ok := first.Value().AsInt64OK()
		if !ok {
			return nil, routePassthrough
		}
		if rule := c.s.cursors.Rule(id); rule != nil {
			return rule, routeCursor
		}
		// A cursor on a rule's namespace that this proxy does not hold
		// (another proxy's, behind a load balancer, or one that expired):
		// CursorNotFound from the proxy. Passed through, it could meet the
		// upstream's cursor of the same id on the bucket collection.
		if coll, ok := body.Lookup("collection").StringValueOK(); ok {
			if rule := c.rules.Lookup(req.db, coll); rule != nil {
				return rule, routeCursor
			}
		}
		return nil, routePassthrough
	case "explain":
		inner, ok := first.Value().DocumentOK()
		if !ok {
			return nil, routePassthrough
		}
		if ie, err := inner.IndexErr(0); err == nil {
			if coll, ok := ie.Value().StringValueOK(); ok {
				if rule := c.rules.Lookup(req.db, coll); rule != nil {
					return rule, routeRewrite
				}
			}
		}
		return nil, routePassthrough
	}
	coll, ok := first.Value().StringValueOK()
	if !ok {
		return nil, routePassthrough
	}
	if rule := c.rules.Lookup(req.db, coll); rule != nil {
		return rule, routeRewrite
	}
	return nil, routePassthrough
}
