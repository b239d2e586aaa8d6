package handler

import (
	"time"

	"github.com/tsproxy/tsproxy/proxy/exec"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/upstream"
)

// stopIDIndex deletes the marker of rule's event-id index (see
// rewrite/bucket's IDIndexEntry) before this proxy writes the rule's
// buckets directly: those buckets get no index entries, so from then on
// a find by event _id reads every bucket. It runs once per writer-lease
// term, so a staged merge of another proxy that started the index again
// in between (after a drop) is undone before the next direct write; on
// upstreams without leases, once per process and drop.
func (c *Conn) stopIDIndex(rule *rules.Rule) error {
	if rule.Layout != rules.LayoutEvents || rule.Partitioned() {
		return nil
	}
	ns := rule.BucketNamespace()
	term, _ := c.s.Leases.Current(rule.DB, rule.Collection)
	if v, ok := c.s.IdIndexOff.Load(ns); ok && v.(time.Time).Equal(term.Since) {
		return nil
	}
	reply, err := exec.RunDoc(c.up, bucket.IDIndexStopCommand(rule))
	if err != nil {
		return err
	}
	if r := upstream.RefusalOf(reply); r != nil {
		return mongoerr.Errorf(r.Code, "tsproxy rule %s: stop the event-id index before a direct write: %s", rule.Namespace, r.Error())
	}
	c.s.IdIndexOff.Store(ns, term.Since)
	return nil
}
