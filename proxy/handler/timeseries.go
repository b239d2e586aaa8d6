package handler

import (
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite/admin"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/wire"
)

// MongoDB's time-series API served by the proxy: create with the
// timeseries option, collMod and drop of a created namespace (the catalog
// protocol is the catalog's).

// pendingWait bounds how long a command waits for another proxy's create
// or drop of its namespace.
const pendingWait = 10 * time.Second

// catalogGate takes the rule set the request is routed by: fresh for a
// command that names a namespace (or lists a database's), after any
// create or drop of that namespace in progress. errAnswered: the request
// was answered.
func (c *Conn) catalogGate(req *request) error {
	ns, named := requestNamespace(req)
	if !named {
		c.rules = c.s.Rules()
		return nil
	}
	snap, err := c.s.Cat.Fresh()
	if err != nil {
		return answered(c.replyCatalogDown(req, err))
	}
	deadline := time.Now().Add(pendingWait)
	for ns != "" {
		e, busy := snap.Pending(ns)
		if !busy {
			break
		}
		if req.name == "drop" && c.s.Cat.StuckDrop(e) {
			rule := rules.NewCreatedRule(e.Created)
			if err := c.ensureUpstream(); err != nil {
				return answered(c.replyUpstreamDown(req, err))
			}
			if err := c.gate(req, &rule); err != nil {
				return err
			}
			return answered(c.s.Cat.FinishDrop(c.catalogClient(req), &rule, e))
		}
		if time.Now().After(deadline) {
			if req.msg.Flags&wire.MoreToCome != 0 {
				return errAnswered
			}
			return answered(c.replyError(req, mongoerr.ConflictingOperationInProgress,
				fmt.Sprintf("tsproxy: the time-series collection %s is being %s by another client; retry (run drop again if a proxy stopped during a drop)", ns, map[string]string{admin.StateCreating: "created", admin.StateDropping: "dropped"}[e.State])))
		}
		time.Sleep(50 * time.Millisecond)
		// refresh(snap): the connections waiting here share one read.
		if snap, err = c.s.Cat.Refresh(snap); err != nil {
			return answered(c.replyCatalogDown(req, err))
		}
	}
	c.rules = snap.Rules
	return nil
}

func (c *Conn) replyCatalogDown(req *request, err error) error {
	c.log.Warn("time-series catalog unreadable", "err", err.Error())
	if req.msg.Flags&wire.MoreToCome != 0 {
		return nil
	}
	return c.replyError(req, mongoerr.HostUnreachable, err.Error())
}

// requestNamespace is the namespace a command names ("" for a whole
// database's), and whether its routing depends on the catalog at all.
func requestNamespace(req *request) (ns string, named bool) {
	switch req.name {
	case "hello", "isMaster", "ismaster", "getMore", "killCursors", "endSessions":
		return "", false
	case "listCollections", "dropDatabase", "tsproxyFlush", "tsproxyStagingFormat":
		return "", true
	}
	first, err := bson.Raw(req.msg.Body).IndexErr(0)
	if err != nil {
		return "", false
	}
	if req.name == "explain" {
		inner, ok := first.Value().DocumentOK()
		if !ok {
			return "", false
		}
		if first, err = inner.IndexErr(0); err != nil {
			return "", false
		}
	}
	coll, ok := first.Value().StringValueOK()
	if !ok || req.db == "" {
		return "", false
	}
	return req.db + "." + coll, true
}

// createsTimeseries reports whether req is a create with the timeseries
// option that the proxy's catalog serves (no rule has the namespace yet).
func (c *Conn) createsTimeseries(req *request) bool {
	if req.name != "create" || !admin.HasTimeseries(req.msg.Body) {
		return false
	}
	snap := c.s.Cat.Load()
	if snap.Static {
		return false
	}
	coll, _ := bson.Raw(req.msg.Body).Index(0).Value().StringValueOK()
	return c.rules.Lookup(req.db, coll) == nil
}

// createdInDB are the created time-series collections of db.
func createdInDB(set *rules.Set, db string) []rules.Rule {
	var out []rules.Rule
	for _, r := range set.All() {
		if r.DB == db && r.Declared != nil {
			out = append(out, r)
		}
	}
	return out
}
