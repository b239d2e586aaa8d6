package admin

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/proxy/tier"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rewrite/stage/merge"
	"github.com/tsproxy/tsproxy/rules"
)

// ServeFlush answers tsproxyFlush: {tsproxyFlush: 1} merges every staged
// rule, {tsproxyFlush: "db.coll"} one; the reply counts what was merged.
func ServeFlush(t *tier.Tier, c Client) error {
	if err := c.EnsureUpstream(); err != nil {
		return c.ReplyUpstreamDown(err)
	}
	targets, denied, err := ruleTargets(c, "tsproxyFlush")
	if denied != nil {
		return c.Reply(denied)
	}
	if err != nil {
		return c.ReplyError(mongoerr.CodeOf(err), err.Error())
	}
	var total merge.Stats
	rulesMerged := 0
	for _, rule := range targets {
		staged, caps, err := c.StagedRule(rule)
		if err != nil {
			return c.ReplyError(mongoerr.HostUnreachable, fmt.Sprintf("tsproxyFlush: %v", err))
		}
		if !staged {
			continue
		}
		// What the holder merges for this flush is not counted here.
		err = t.Flush(c, rule, caps, &total, tier.AllStaged, tier.NoSpare)
		var up tier.UpstreamFailure
		if errors.As(err, &up) {
			return up.Err
		}
		if err != nil {
			return c.ReplyError(mongoerr.CodeOf(err), fmt.Sprintf("tsproxyFlush %s: %v", rule.Namespace, err))
		}
		rulesMerged++
	}
	reply, err := bson.Marshal(bson.D{
		{Key: "rules", Value: rulesMerged},
		{Key: "collections", Value: total.Collections},
		{Key: "kept", Value: total.Kept},
		{Key: "events", Value: total.Events},
		{Key: "buckets", Value: total.Buckets},
		{Key: "toppedUp", Value: total.ToppedUp},
		{Key: "retries", Value: total.Retries},
		{Key: "late", Value: total.Late},
		{Key: "directoryReads", Value: total.DirectoryReads},
		{Key: "knownBuckets", Value: total.KnownBuckets},
		{Key: "parallelInserts", Value: total.ParallelInserts},
		{Key: "recordReads", Value: total.RecordReads},
		{Key: "upstreamMs", Value: upstreamMs(total.Upstream)},
		{Key: "ok", Value: 1.0},
	})
	if err != nil {
		return err
	}
	return c.Reply(reply)
}

// upstreamMs is the flush reply's account of the time its merges waited
// on the upstream: for each kind of step (stage.StepKind), in order of
// name, its milliseconds and how many steps.
func upstreamMs(times map[string]stage.StepTime) bson.D {
	kinds := slices.Sorted(maps.Keys(times))
	out := make(bson.D, 0, len(kinds))
	for _, k := range kinds {
		t := times[k]
		out = append(out, bson.E{Key: k, Value: bson.D{
			{Key: "ms", Value: float64(t.Time.Microseconds()) / 1000},
			{Key: "steps", Value: t.Steps},
		}})
	}
	return out
}

// ruleTargets are the rules a proxy command (tsproxyFlush,
// tsproxyStagingFormat) names: 1 for every rule, or "db.collection".
// The server authorizes the client on each first (denied is its refusal,
// for the client): whether a namespace has a rule is told only to whom
// it lets read the namespace.
func ruleTargets(c Client, name string) (targets []*rules.Rule, denied []byte, err error) {
	v := bson.Raw(c.Body()).Lookup(name)
	if ns, ok := v.StringValueOK(); ok {
		db, coll, _ := strings.Cut(ns, ".")
		rule := c.Rules().Lookup(db, coll)
		if rule == nil {
			probe := &rules.Rule{Namespace: ns, DB: db, Collection: coll}
			if denied, err := c.Authorize(probe); denied != nil || err != nil {
				return nil, denied, err
			}
			return nil, nil, mongoerr.Errorf(mongoerr.NamespaceNotFound, "%s: no rule for namespace %q", name, ns)
		}
		if denied, err := c.Authorize(rule); denied != nil || err != nil {
			return nil, denied, err
		}
		return []*rules.Rule{rule}, nil, nil
	}
	if n, ok := v.AsInt64OK(); !ok || n != 1 {
		return nil, nil, mongoerr.Errorf(mongoerr.BadValue, "%s takes 1 (every rule) or a namespace \"db.collection\", not %s", name, v)
	}
	for _, r := range c.Rules().All() {
		if denied, err := c.Authorize(&r); denied != nil || err != nil {
			return nil, denied, err
		}
		targets = append(targets, &r)
	}
	return targets, nil, nil
}
