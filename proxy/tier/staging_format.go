package tier

import (
	"fmt"
	"regexp"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/proxy/exec"
	"github.com/tsproxy/tsproxy/proxy/tier/lease"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/upstream"
)

// The staging format: which form of staged document (bucket.StagedFormat)
// the proxies stage a rule's events in. Only the holder of a rule's
// writer lease reads staged documents (its merges), and a proxy of an
// older version fails to merge a form it does not know; so the form is
// raised only once every proxy that may merge the rule reads it, as
// MongoDB's featureCompatibilityVersion is. The rule's format record
// (lease.ReadFormat, in its database's lease collection) says which form
// that is; each proxy reads it again every FormatRecheck.
//
// A rule gets its record from the first proxy that stages it or takes its
// writer lease: bucket.LatestStagedFormat when nothing shows that a proxy
// worked on the rule before (a proxy of a version before records leaves
// leases, staging announcements, staging collections or buckets), else
// bucket.StagedKeyed, which every version reads. tsproxyStagingFormat
// reads and sets it: raise it once every proxy runs this version; lower
// it before a proxy of an older one joins (the command then waits out
// every proxy's copy of the record and merges what was staged in the
// higher form).

// FormatRecheck is how long a proxy stages by one read of a rule's format
// record.
const FormatRecheck = 5 * time.Second

// stagingFormats are this proxy's reads of its rules' format records.
type stagingFormats struct {
	mu   sync.Mutex
	byNS map[string]formatRead // by bucket namespace
}

type formatRead struct {
	format bucket.StagedFormat
	readAt time.Time // when the read was sent
	warned time.Time // when a failure to read it was last logged
}

func newStagingFormats() *stagingFormats {
	return &stagingFormats{byNS: map[string]formatRead{}}
}

// forget makes the next staged insert of ns read its record again.
func (f *stagingFormats) forget(ns string) {
	f.mu.Lock()
	delete(f.byNS, ns)
	f.mu.Unlock()
}

// StagingFormat is the form rule's events are staged in, by a read of its
// format record at most FormatRecheck old (made on up, with its
// privileges). A record that cannot be read or made gives
// bucket.StagedKeyed, which every proxy reads: it costs a little speed,
// never an event (a warning says why, at most once a minute per rule).
func (t *Tier) StagingFormat(up lease.Commander, rule *rules.Rule) bucket.StagedFormat {
	ns := rule.BucketNamespace()
	now := time.Now()
	t.formats.mu.Lock()
	last, ok := t.formats.byNS[ns]
	t.formats.mu.Unlock()
	if ok && now.Sub(last.readAt) < FormatRecheck {
		return last.format
	}
	format, err := readStagingFormat(up, rule, now)
	read := formatRead{format: format, readAt: now, warned: last.warned}
	if err != nil {
		read.format = bucket.StagedKeyed
		if now.Sub(last.warned) > time.Minute {
			read.warned = now
			t.log.Warn("staging: the rule's staging format record cannot be read or made; staging in the form every proxy reads",
				"rule", rule.Namespace, "format", int(bucket.StagedKeyed), "err", err.Error())
		}
	}
	t.formats.mu.Lock()
	t.formats.byNS[ns] = read
	t.formats.mu.Unlock()
	return read.format
}

// readStagingFormat reads rule's format record, making it when there is
// none (see the top of this file).
func readStagingFormat(up lease.Commander, rule *rules.Rule, now time.Time) (bucket.StagedFormat, error) {
	n, ok, err := lease.ReadFormat(up, rule.DB, rule.BucketCollection)
	if err != nil {
		return 0, err
	}
	if !ok {
		used, err := ruleUsed(up, rule)
		if err != nil {
			return 0, err
		}
		first := bucket.LatestStagedFormat
		if used {
			first = bucket.StagedKeyed
		}
		if n, err = lease.RecordFormat(up, rule.DB, rule.BucketCollection, int(first), now); err != nil {
			return 0, err
		}
	}
	return writableFormat(n)
}

// writableFormat is the form a proxy stages in by a record of n: n, or
// this proxy's latest when n is newer (a proxy that reads a form reads
// every earlier one).
func writableFormat(n int) (bucket.StagedFormat, error) {
	if n < int(bucket.StagedKeyed) {
		return 0, fmt.Errorf("the format record says %d, not a staged document form", n)
	}
	return min(bucket.StagedFormat(n), bucket.LatestStagedFormat), nil
}

// ruleUsed reports whether anything shows that a proxy worked on rule
// before its format record existed: writer leases or staging
// announcements of it, staging collections of it, or buckets.
func ruleUsed(up lease.Commander, rule *rules.Rule) (bool, error) {
	if used, err := lease.Used(up, rule.DB, rule.Collection, rule.BucketCollection); err != nil || used {
		return used, err
	}
	staging := bson.D{{Key: "name", Value: bson.D{{Key: "$regex", Value: "^" + regexp.QuoteMeta(rule.StagePrefix())}}}}
	for _, cmd := range []bson.D{
		{{Key: "listCollections", Value: 1}, {Key: "filter", Value: staging}, {Key: "nameOnly", Value: true}, {Key: "$db", Value: rule.DB}},
		{{Key: "find", Value: rule.BucketCollection}, {Key: "projection", Value: bson.D{{Key: "_id", Value: 1}}},
			{Key: "limit", Value: 1}, {Key: "singleBatch", Value: true}, {Key: "$db", Value: rule.DB}},
	} {
		reply, err := exec.RunDoc(up, cmd)
		if err == nil {
			err = upstream.CommandError(reply)
		}
		if err != nil {
			return false, fmt.Errorf("look for %s's staging and buckets: %s: %w", rule.Namespace, cmd[0].Key, err)
		}
		n, err := lease.FirstBatchLen(reply)
		if err != nil {
			return false, fmt.Errorf("look for %s's staging and buckets: %s: %w", rule.Namespace, cmd[0].Key, err)
		}
		if n > 0 {
			return true, nil
		}
	}
	return false, nil
}

// SetFormat records set as rule's staging format (on up, with its
// privileges) and says what was recorded before (0: nothing).
func (t *Tier) SetFormat(up lease.Commander, rule *rules.Rule, set bucket.StagedFormat) (int, error) {
	was, err := lease.SetFormat(up, rule.DB, rule.BucketCollection, int(set), time.Now())
	t.formats.forget(rule.BucketNamespace())
	return was, err
}
