package handler

import (
	"errors"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/proxy/exec"
	"github.com/tsproxy/tsproxy/proxy/tier"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/cursor"
	"github.com/tsproxy/tsproxy/rewrite/fanout"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/updates"
	"github.com/tsproxy/tsproxy/rules"
)

// settleStaged merges everything staged of rule before a command that
// reads or changes its stored events, so that the command sees every
// acknowledged event exactly once, in complete buckets. An error is the
// client's answer (the command does not run).
func (c *Conn) settleStaged(req *request, rule *rules.Rule) error {
	staged, caps, err := c.stagedRule(rule)
	if err != nil {
		return nil // no caps: the command itself meets the upstream's error
	}
	if !staged {
		c.settleJournal(rule, caps)
		return nil
	}
	if err := c.s.Tier().Flush(c, rule, caps, nil, readThrough(req, rule), tier.MakeSpare); err != nil {
		var up tier.UpstreamFailure
		if errors.As(err, &up) {
			return answered(up.Err)
		}
		return answered(c.replyError(req, mongoerr.CodeOf(err), err.Error()))
	}
	c.settleJournal(rule, caps)
	return nil
}

// settleJournal finishes the update journal's records a proxy stopped
// part way left pending (updates.Recover), so that a read does not find
// a moved event in both of its buckets until the next update on the
// rule. It looks for one (a find, no lease needed) once in each term of
// rule's writer lease this proxy holds, else at most every
// journalCheckEvery; it finishes them under the writer lease, which it
// takes if it is free, and the locks an update takes. A failure is
// logged: the read goes on, and a later one tries again.
func (c *Conn) settleJournal(rule *rules.Rule, caps caps.Upstream) {
	if rule.Layout != rules.LayoutEvents || rule.Partitioned() || len(rule.Rollups) > 0 {
		return // no updates there (updates.Plan refuses them)
	}
	ns := rule.BucketNamespace()
	term, held := c.s.Leases.Current(rule.DB, rule.Collection)
	if v, ok := c.s.JournalSettled.Load(ns); ok {
		last := v.(journalCheck)
		if held && last.term.Equal(term.Since) || !held && time.Since(last.at) < journalCheckEvery {
			return
		}
	}
	pending, err := c.journalPending(rule)
	if err == nil && pending {
		err = c.recoverJournal(rule, caps)
		term, held = c.s.Leases.Current(rule.DB, rule.Collection)
	}
	if err != nil {
		c.log.Warn("update journal: pending records not finished; reads may find a moved event twice until an update on the rule finishes them", "rule", rule.Namespace, "err", err.Error())
		return
	}
	check := journalCheck{at: time.Now()}
	if held {
		check.term = term.Since
	}
	c.s.JournalSettled.Store(ns, check)
}

// journalCheckEvery is how often a proxy that does not hold a rule's
// writer lease looks for pending journal records on a read.
const journalCheckEvery = 10 * time.Second

// journalCheck is when a proxy last found no pending journal record of a
// rule: in which term of its writer lease (zero: none held), at what time.
type journalCheck struct {
	term time.Time
	at   time.Time
}

// journalPending says whether rule's update journal holds a pending
// record.
func (c *Conn) journalPending(rule *rules.Rule) (bool, error) {
	reply, err := exec.RunDoc(c.up, bson.Raw(updates.PendingFind(rule)))
	if err != nil {
		return false, err
	}
	docs, _, err := cursor.Docs(reply)
	if mongoerr.CodeOf(err) == mongoerr.NamespaceNotFound {
		return false, nil
	}
	return len(docs) > 0, err
}

// recoverJournal finishes rule's pending journal records under its
// writer lease (taken if free) and an update's locks.
func (c *Conn) recoverJournal(rule *rules.Rule, caps caps.Upstream) error {
	if _, err := c.startWrite(rule); err != nil {
		return err
	}
	locks := c.heldLocks()
	defer locks.ReleaseAll()
	res, err := exec.Drive(c, updates.Recover(rule, c.updateEnv(rule, caps, locks)))
	if err == nil && !mongoerr.IsOK(res.Reply) {
		err = mongoerr.FromReply(res.Reply, "refused")
	}
	return err
}

// readThrough is the latest event time (ms) req, a command on rule, can
// read, or tier.AllStaged when it may read or change any event: a read
// bounded in time need not wait for a merge of staging periods that
// start after its bound (stage.WorkThrough says why), as a report on
// yesterday while today's events are staged. Only the events layout,
// whose reads filter on the events' own times.
func readThrough(req *request, rule *rules.Rule) int64 {
	if rule.Layout != rules.LayoutEvents {
		return tier.AllStaged
	}
	to, ok := fanout.ReadTimeEnd(req.msg.Body, rule)
	if ok {
		return to
	}
	return tier.AllStaged
}
