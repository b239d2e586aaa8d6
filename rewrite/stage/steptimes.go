package stage

import (
	"strings"
	"time"

	"github.com/tsproxy/tsproxy/rules"
)

// StepTime is how many steps of one kind a merge sent and how long it
// waited on the upstream for them (Stats.Upstream).
type StepTime struct {
	Steps int
	Time  time.Duration
}

// StepKind names a merge step by its first command and what that command
// targets of rule ("update buckets", "insert records", "drop staging"),
// so that a merge's upstream time can be told apart by what it did: on
// FerretDB v1.24 an update of a bucket by _id scans the rule's buckets
// where an insert does not (README, Known gaps).
func StepKind(rule *rules.Rule, command, coll string) string {
	if coll == "" {
		return command // listCollections: 1, a lease's findAndModify on another db...
	}
	return command + " " + StepTarget(rule, coll)
}

// StepTarget says which of rule's collections coll is.
func StepTarget(rule *rules.Rule, coll string) string {
	switch {
	case coll == rule.BucketCollection:
		return "buckets"
	case coll == TxnsCollection(rule):
		return "records"
	case coll == rule.IDIndexCollection():
		return "event-id index"
	case strings.HasPrefix(coll, rule.StagePrefix()):
		return "staging"
	case coll == rules.LeaseCollection:
		return "leases"
	case strings.HasPrefix(coll, rule.Collection+rules.RollupCollectionInfix):
		return "rollups"
	}
	return "other"
}

// AddStepTimes adds from's step times to *to.
func AddStepTimes(to *map[string]StepTime, from map[string]StepTime) {
	if len(from) == 0 {
		return
	}
	if *to == nil {
		*to = make(map[string]StepTime, len(from))
	}
	for k, v := range from {
		t := (*to)[k]
		t.Steps += v.Steps
		t.Time += v.Time
		(*to)[k] = t
	}
}
