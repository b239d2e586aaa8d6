package engine

import (
	"github.com/tsproxy/tsproxy/proxy/exec"
	"github.com/tsproxy/tsproxy/proxy/tier/lease"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/read"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/upstream"
)

// tierHost is what the staging tier asks of the Server (tier.Host).
type tierHost struct{ s *Engine }

func (h tierHost) CapsOn(up *upstream.Conn) (caps.Upstream, error) { return h.s.Abilities.Caps(up) }

func (h tierHost) RoutesRule(rule *rules.Rule) bool { return h.s.routesRule(rule) }

func (h tierHost) ServedHere(rule *rules.Rule) bool { return h.s.servedHere(rule) }

func (h tierHost) EnsureBucketIndex(r exec.Runner, rule *rules.Rule, caps caps.Upstream) error {
	err := h.s.EnsureIndexOn(r, rule, rule.BucketCollection, BucketIndexFailure, caps)
	h.s.indexIDIndexLookups(rule)
	return err
}

func (h tierHost) IDLookupCost(up lease.Commander, rule *rules.Rule, caps caps.Upstream) read.IDLookupCost {
	return h.s.Abilities.IDLookupCost(up, rule, caps)
}

func (h tierHost) LockBuckets(bucketNS string, keys []bucket.Key) func() {
	l := h.s.Fills.Lock(bucketNS, keys)
	return func() {
		l.ForgetAll() // the direct path's fills of these keys changed
		l.Unlock()
	}
}

func (h tierHost) ClaimShells(bucketNS string, keys []bucket.Key) []bucket.Key {
	return h.s.Shells.Claim(bucketNS, keys)
}
