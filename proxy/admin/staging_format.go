package admin

import (
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/proxy/tier"
	"github.com/tsproxy/tsproxy/proxy/tier/lease"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/stage/merge"
	"github.com/tsproxy/tsproxy/rules"
)

// ServeStagingFormat answers tsproxyStagingFormat: {tsproxyStagingFormat:
// 1} reports every staged rule's recorded form, {tsproxyStagingFormat:
// "db.coll"} one's; with set: N it records N first (bucket.StagedFormat:
// 1 is read by every version, 2 since the format record exists). A form
// lowered is in force once the command answers: it waits until every
// proxy's read of the record before the change has expired, then merges
// what was staged in the higher form, so that a proxy of an older
// version may join.
func ServeStagingFormat(t *tier.Tier, c Client) error {
	const name = "tsproxyStagingFormat"
	if err := c.EnsureUpstream(); err != nil {
		return c.ReplyUpstreamDown(err)
	}
	targets, denied, err := ruleTargets(c, name)
	if denied != nil {
		return c.Reply(denied)
	}
	if err != nil {
		return c.ReplyError(mongoerr.CodeOf(err), err.Error())
	}
	set, err := formatToSet(bson.Raw(c.Body()))
	if err != nil {
		return c.ReplyError(mongoerr.BadValue, fmt.Sprintf("%s: %v", name, err))
	}
	out := bson.A{} // an empty array, not null, when no rule is staged
	var lowered []*rules.Rule
	for _, rule := range targets {
		staged, _, err := c.StagedRule(rule)
		if err != nil {
			return c.ReplyError(mongoerr.HostUnreachable, fmt.Sprintf("%s: %v", name, err))
		}
		if !staged {
			continue
		}
		entry := bson.D{{Key: "ns", Value: rule.Namespace}}
		if set != 0 {
			was, err := t.SetFormat(c.Upstream(), rule, set)
			if err != nil {
				return c.ReplyError(mongoerr.CodeOf(err), fmt.Sprintf("%s %s: %v", name, rule.Namespace, err))
			}
			entry = append(entry, bson.E{Key: "was", Value: was})
			// Nothing recorded (was 0): no proxy of this version staged
			// the rule, as each makes the record first.
			if was > int(set) {
				lowered = append(lowered, rule)
			}
		}
		n, ok, err := lease.ReadFormat(c.Upstream(), rule.DB, rule.BucketCollection)
		if err != nil {
			return c.ReplyError(mongoerr.CodeOf(err), fmt.Sprintf("%s %s: %v", name, rule.Namespace, err))
		}
		entry = append(entry, bson.E{Key: "format", Value: n}, bson.E{Key: "recorded", Value: ok})
		out = append(out, entry)
	}
	var total merge.Stats
	if len(lowered) > 0 {
		// Every proxy stages by a read of the record at most
		// tier.FormatRecheck old, and an insert planned by one is sent at once.
		time.Sleep(tier.FormatRecheck + time.Second)
		for _, rule := range lowered {
			_, caps, err := c.StagedRule(rule)
			if err == nil {
				err = t.Flush(c, rule, caps, &total, tier.AllStaged, tier.NoSpare)
			}
			var up tier.UpstreamFailure
			if errors.As(err, &up) {
				return up.Err
			}
			if err != nil {
				return c.ReplyError(mongoerr.CodeOf(err), fmt.Sprintf("%s %s: the format is lowered, and merging what was staged in the higher one failed (run tsproxyFlush before a proxy of an older version joins): %v", name, rule.Namespace, err))
			}
		}
	}
	reply, err := bson.Marshal(bson.D{
		{Key: "rules", Value: out},
		{Key: "mergedEvents", Value: total.Events},
		{Key: "ok", Value: 1.0},
	})
	if err != nil {
		return err
	}
	return c.Reply(reply)
}

// formatToSet reads the command's set: 0 when it has none.
func formatToSet(body bson.Raw) (bucket.StagedFormat, error) {
	v, err := body.LookupErr("set")
	if err != nil {
		return 0, nil
	}
	n, ok := v.AsInt64OK()
	if !ok || !bucket.StagedFormat(n).Valid() {
		return 0, fmt.Errorf("set takes a staged document form, %d or %d, not %s", bucket.StagedKeyed, bucket.LatestStagedFormat, v)
	}
	return bucket.StagedFormat(n), nil
}
