package handler

import (
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/proxy/catalog"
	"github.com/tsproxy/tsproxy/proxy/exec"
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/admin"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/upstream"
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
		c.rules = c.s.rules()
		return nil
	}
	snap, err := c.s.cat.Fresh()
	if err != nil {
		return answered(c.replyCatalogDown(req, err))
	}
	deadline := time.Now().Add(pendingWait)
	for ns != "" {
		e, busy := snap.Pending(ns)
		if !busy {
			break
		}
		if req.name == "drop" && c.s.cat.StuckDrop(e) {
			rule := rules.NewCreatedRule(e.Created)
			if err := c.ensureUpstream(); err != nil {
				return answered(c.replyUpstreamDown(req, err))
			}
			if err := c.gate(req, &rule); err != nil {
				return err
			}
			return answered(c.finishDrop(req, &rule, e))
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
		if snap, err = c.s.cat.Refresh(snap); err != nil {
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
	snap := c.s.cat.Load()
	if snap.Static {
		return false
	}
	coll, _ := bson.Raw(req.msg.Body).Index(0).Value().StringValueOK()
	return c.rules.Lookup(req.db, coll) == nil
}

// createTimeseries serves a create with the timeseries option: see the
// protocol in the catalog.
func (c *Conn) createTimeseries(req *request) error {
	if err := c.ensureUpstream(); err != nil {
		return c.replyUpstreamDown(req, err)
	}
	created, err := admin.ParseTimeseriesCreate(req.msg.Body, req.db)
	if err != nil {
		return c.replyRewriteError(req, err)
	}
	rule := rules.NewCreatedRule(created)
	if err := c.gate(req, &rule); err != nil {
		return err
	}
	if err := c.checkNameFree(&rule); err != nil {
		return c.replyRewriteError(req, err)
	}
	entry := admin.CatalogEntry{Created: created, State: admin.StateCreating, Nonce: catalog.NewNonce()}
	if _, err := c.s.cat.Write(admin.CatalogInsert(entry)); err != nil {
		return c.createRace(req, created, err)
	}
	c.s.cat.WaitOut()
	reply, err := c.finishCreate(req, &rule, entry)
	if err != nil {
		c.abortCreate(entry)
		if mongoerr.IsOK(reply) || reply == nil {
			return c.replyRewriteError(req, err)
		}
		return c.replyBody(req, reply)
	}
	c.s.cat.Reread("create")
	c.log.Info("time-series collection created", "ns", rule.Namespace, "timeField", rule.TimeField, "metaField", rule.MetaField, "span", rule.Span)
	return c.replyBody(req, okReply())
}

// finishCreate checks again that the name is free (an insert sent on a
// stale snapshot may have created it), creates the bucket collection with
// the client's privileges, and marks the entry ready. A non-nil reply is
// the upstream's refusal, for the client.
func (c *Conn) finishCreate(req *request, rule *rules.Rule, entry admin.CatalogEntry) ([]byte, error) {
	if err := c.checkNameFree(rule); err != nil {
		return nil, err
	}
	createCmd := bson.D{{Key: "create", Value: rule.Collection}, {Key: "$db", Value: rule.DB}}
	body, _ := bson.Marshal(createCmd)
	res, err := c.runPlan(req, rule, routeRewrite, admin.Create(body, rule))
	if err != nil {
		return nil, err
	}
	if !mongoerr.IsOK(res.Reply) && quotedCreateFailed(rule.Collection, res.Reply) {
		// Its buckets go to collections the merge creates as it goes.
		return mongoerr.ReplyNamed(mongoerr.InvalidNamespace, "", fmt.Sprintf(
			"tsproxy: the upstream cannot hold the time-series collection %q of database %q: its name holds '\"', which FerretDB 1.x on SQLite cannot create (choose a name without it)", rule.Collection, rule.DB)), errors.New("create refused")
	}
	if !mongoerr.IsOK(res.Reply) {
		return res.Reply, errors.New("create refused")
	}
	c.ensureBucketIndex(rule)
	ready := entry
	ready.State = admin.StateReady
	n, err := c.s.cat.Write(admin.CatalogReplace(ready, entry.Nonce, admin.StateCreating))
	if err != nil {
		return nil, mongoerr.Errorf(mongoerr.HostUnreachable, "tsproxy: create of %s: marking it ready in the catalog: %v", rule.Namespace, err)
	}
	if n != 1 {
		return nil, mongoerr.Errorf(mongoerr.ConflictingOperationInProgress, "tsproxy: create of %s took too long and another proxy gave it up; retry", rule.Namespace)
	}
	return nil, nil
}

// abortCreate deletes the entry of a create that failed.
func (c *Conn) abortCreate(entry admin.CatalogEntry) {
	if _, err := c.s.cat.Write(admin.CatalogDelete(entry.Namespace(), entry.Nonce)); err != nil {
		c.log.Warn("catalog: deleting a failed create's entry failed; another proxy deletes it later", "ns", entry.Namespace(), "err", err.Error())
	}
}

// createRace answers a create whose catalog insert failed: a duplicate
// key is another create of the name, answered as MongoDB answers a
// create of an existing collection.
func (c *Conn) createRace(req *request, created rules.Created, err error) error {
	var we *catalog.WriteError
	if !errors.As(err, &we) || we.Code != int64(mongoerr.DuplicateKey) {
		return c.replyError(req, mongoerr.HostUnreachable, fmt.Sprintf("tsproxy: create of %s.%s: writing the catalog: %v", created.DB, created.Collection, err))
	}
	snap, rerr := c.s.cat.Refresh(nil)
	if rerr != nil {
		return c.replyCatalogDown(req, rerr)
	}
	ns := created.DB + "." + created.Collection
	if e, busy := snap.Pending(ns); busy {
		return c.replyError(req, mongoerr.ConflictingOperationInProgress, fmt.Sprintf("tsproxy: the time-series collection %s is being %s by another client; retry", ns, e.State))
	}
	if rule := snap.Rules.Lookup(created.DB, created.Collection); rule != nil {
		if admin.SameTimeseries(created, rule) {
			return c.replyBody(req, okReply())
		}
		return c.replyRewriteError(req, admin.ExistsError(created, rule))
	}
	return c.replyError(req, mongoerr.ConflictingOperationInProgress, fmt.Sprintf("tsproxy: the time-series collection %s was dropped while this create ran; retry", ns))
}

// checkNameFree: MongoDB's NamespaceExists when a plain collection has
// the name, or when the bucket collection holds documents (a rule
// removed from config.yaml left them).
func (c *Conn) checkNameFree(rule *rules.Rule) error {
	for _, name := range []string{rule.Collection, rule.BucketCollection} {
		cmd := bson.D{{Key: "listCollections", Value: 1}, {Key: "filter", Value: bson.D{{Key: "name", Value: name}}}, {Key: "nameOnly", Value: true}, {Key: "$db", Value: rule.DB}}
		reply, err := exec.CommandDoc(c.up, cmd)
		if err != nil {
			return mongoerr.Errorf(mongoerr.HostUnreachable, "tsproxy: create of %s: %v", rule.Namespace, err)
		}
		if r := upstream.RefusalOf(reply); r != nil {
			return mongoerr.Errorf(r.Code, "%s", r.Msg)
		}
		batch, _ := reply.Lookup("cursor", "firstBatch").ArrayOK()
		if vals, _ := batch.Values(); len(vals) == 0 {
			continue
		}
		if name == rule.Collection {
			return admin.PlainExistsError(rule.Namespace)
		}
		count, err := exec.CommandDoc(c.up, bson.D{{Key: "count", Value: name}, {Key: "$db", Value: rule.DB}})
		if err != nil {
			return mongoerr.Errorf(mongoerr.HostUnreachable, "tsproxy: create of %s: %v", rule.Namespace, err)
		}
		if n, _ := count.Lookup("n").AsInt64OK(); n > 0 {
			return mongoerr.Errorf(mongoerr.NamespaceExists, "Collection %s already exists. (it holds %d documents of an earlier bucketed namespace; drop it first)", rule.BucketNamespace(), n)
		}
	}
	return nil
}

// createdRuleCreate answers a create of a created rule's namespace: ok for
// the same options (MongoDB 7.1+), NamespaceExists otherwise.
func (c *Conn) createdRuleCreate(req *request, rule *rules.Rule) error {
	if !admin.HasTimeseries(req.msg.Body) {
		// Any other create of the name (capped, a validator...) meets
		// the collection: NamespaceExists, before its options are read
		// as a time-series create's (they answered InvalidOptions).
		return c.replyRewriteError(req, admin.ExistsError(rule.CreatedOf(), rule))
	}
	created, err := admin.ParseTimeseriesCreate(req.msg.Body, req.db)
	if err != nil {
		return c.replyRewriteError(req, err)
	}
	if admin.SameTimeseries(created, rule) {
		return c.replyBody(req, okReply())
	}
	return c.replyRewriteError(req, admin.ExistsError(created, rule))
}

// collModTimeseries changes a created rule's granularity or
// expireAfterSeconds; a config rule changes only in config.yaml.
func (c *Conn) collModTimeseries(req *request, rule *rules.Rule) error {
	if rule.Declared == nil {
		return c.replyRewriteError(req, mongoerr.Errorf(mongoerr.NotImplemented, "tsproxy rule %s: collMod of a namespace bucketed by config.yaml is not supported; change its rule there", rule.Namespace))
	}
	created, err := admin.ParseTimeseriesCollMod(req.msg.Body, rule)
	if err != nil {
		return c.replyRewriteError(req, err)
	}
	snap := c.s.cat.Load()
	old, ok := snap.Entries[rule.Namespace]
	if !ok || old.State != admin.StateReady {
		return c.replyError(req, mongoerr.ConflictingOperationInProgress, fmt.Sprintf("tsproxy: the time-series collection %s changed meanwhile; retry", rule.Namespace))
	}
	entry := admin.CatalogEntry{Created: created, State: admin.StateReady, Nonce: catalog.NewNonce()}
	n, err := c.s.cat.Write(admin.CatalogReplace(entry, old.Nonce, admin.StateReady))
	if err != nil {
		return c.replyError(req, mongoerr.HostUnreachable, fmt.Sprintf("tsproxy: collMod of %s: writing the catalog: %v", rule.Namespace, err))
	}
	if n != 1 {
		return c.replyError(req, mongoerr.ConflictingOperationInProgress, fmt.Sprintf("tsproxy: the time-series collection %s changed meanwhile; retry", rule.Namespace))
	}
	// Once acknowledged, the change is what every proxy lists and
	// sweeps by.
	c.s.cat.WaitOut()
	c.s.cat.Reread("collMod")
	return c.replyBody(req, okReply())
}

// dropTimeseries drops a created rule's namespace: the entry goes
// "dropping", every proxy stops routing to it, then its collections and
// its entry go.
func (c *Conn) dropTimeseries(req *request, rule *rules.Rule) error {
	snap := c.s.cat.Load()
	old, ok := snap.Entries[rule.Namespace]
	if !ok || old.State != admin.StateReady {
		return c.replyError(req, mongoerr.ConflictingOperationInProgress, fmt.Sprintf("tsproxy: the time-series collection %s changed meanwhile; retry", rule.Namespace))
	}
	dropping := old
	dropping.State = admin.StateDropping
	n, err := c.s.cat.Write(admin.CatalogReplace(dropping, old.Nonce, admin.StateReady))
	if err != nil || n != 1 {
		return c.replyError(req, mongoerr.ConflictingOperationInProgress, fmt.Sprintf("tsproxy: drop of %s: the catalog entry changed meanwhile (%v); retry", rule.Namespace, err))
	}
	return c.finishDrop(req, rule, dropping)
}

// finishDrop is the rest of a drop once the entry is "dropping" (also a
// drop run again after a proxy stopped mid-drop).
func (c *Conn) finishDrop(req *request, rule *rules.Rule, dropping admin.CatalogEntry) error {
	c.s.cat.Reread("drop began")
	c.s.cat.WaitOut()
	res, err := c.runPlan(req, rule, routeRewrite, admin.Drop(req.msg.Body, rule))
	if err != nil {
		c.restoreEntries(dropping)
		return err
	}
	if !mongoerr.IsOK(res.Reply) && !isNamespaceNotFound(res.Reply) {
		// Refused (the client's privileges, say): the namespace stays a
		// time-series collection, whatever of it the drop removed, and a
		// drop run again finishes.
		c.restoreEntries(dropping)
		return c.answer(req, rule, res)
	}
	c.dropStaging(rule)
	if _, err := c.s.cat.Write(admin.CatalogDelete(rule.Namespace, dropping.Nonce)); err != nil {
		return c.replyError(req, mongoerr.HostUnreachable, fmt.Sprintf("tsproxy: drop of %s: deleting its catalog entry: %v; run drop again", rule.Namespace, err))
	}
	c.s.forgetNamespace(rule.BucketNamespace())
	c.s.cat.Reread("drop")
	return c.answer(req, rule, res)
}

// restoreEntries puts entries left "dropping" by a drop that did not
// happen back to "ready", so that the namespaces keep serving instead of
// waiting for a drop run again.
func (c *Conn) restoreEntries(dropping ...admin.CatalogEntry) {
	for _, e := range dropping {
		ready := e
		ready.State, ready.Nonce = admin.StateReady, catalog.NewNonce()
		if _, err := c.s.cat.Write(admin.CatalogReplace(ready, e.Nonce, admin.StateDropping)); err != nil {
			c.log.Warn("catalog: an entry of a failed drop was left dropping; run drop again", "ns", e.Namespace(), "err", err.Error())
		}
	}
	c.s.cat.Reread("failed drop")
}

// dropStaging drops the rule's staging collections (events not merged
// yet), so a later create of the name starts empty.
func (c *Conn) dropStaging(rule *rules.Rule) {
	res, err := exec.Drive(c, admin.DropStaging(rule))
	if err == nil && res.Reply != nil && !mongoerr.IsOK(res.Reply) {
		err = errors.New(string(bson.Raw(res.Reply).Lookup("errmsg").StringValue()))
	}
	if err != nil {
		c.log.Warn("drop: staging collections were left", "rule", rule.Namespace, "err", err.Error())
	}
}

func isNamespaceNotFound(reply []byte) bool {
	code, _ := bson.Raw(reply).Lookup("code").AsInt64OK()
	return code == int64(mongoerr.NamespaceNotFound)
}

func okReply() []byte {
	b, _ := bson.Marshal(bson.D{{Key: "ok", Value: 1.0}})
	return b
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

// markDropping marks every ready catalog entry of db "dropping", from a
// catalog read now: one marked on an older snapshot failed its
// compare-and-set when a collMod or a create had changed it meanwhile,
// was skipped, and survived the database. A mark that loses such a race
// is tried again on a new read, a few times, then the drop is refused
// rather than run with an entry unmarked.
func (c *Conn) markDropping(db string) (marked []admin.CatalogEntry, err error) {
	done := map[string]bool{}
	for attempt := 0; attempt < 5; attempt++ {
		snap, err := c.s.cat.Refresh(nil)
		if err != nil {
			return marked, err
		}
		lost := false
		for _, old := range snap.Entries {
			if old.Created.DB != db || old.State != admin.StateReady || done[old.Namespace()] {
				continue
			}
			dropping := old
			dropping.State = admin.StateDropping
			n, err := c.s.cat.Write(admin.CatalogReplace(dropping, old.Nonce, admin.StateReady))
			if err != nil {
				return marked, err
			}
			if n != 1 {
				lost = true
				continue
			}
			done[old.Namespace()] = true
			marked = append(marked, dropping)
		}
		if !lost {
			return marked, nil
		}
	}
	return marked, mongoerr.Errorf(mongoerr.ConflictingOperationInProgress, "dropDatabase %s: its time-series collections keep changing (a create or collMod through another client); try again", db)
}

// forgetDroppedDB deletes the catalog entries of db, whose database the
// upstream dropped: those it marked, and any other entry of db a catalog
// read now finds (a create that ended while the drop waited out the
// lease: its buckets went with the database, and its entry stayed ready).
func (c *Conn) forgetDroppedDB(db string, marked []admin.CatalogEntry) {
	entries := map[string]admin.CatalogEntry{}
	for _, e := range marked {
		entries[e.Namespace()] = e
	}
	if snap, err := c.s.cat.Refresh(nil); err == nil {
		for ns, e := range snap.Entries {
			if e.Created.DB == db {
				entries[ns] = e
			}
		}
	} else {
		c.log.Warn("catalog: read after dropDatabase failed; only the entries it marked are deleted", "db", db, "err", err.Error())
	}
	for _, e := range entries {
		if _, err := c.s.cat.Write(admin.CatalogDelete(e.Namespace(), e.Nonce)); err != nil {
			c.log.Warn("catalog: an entry of a dropped database was left; drop the namespace again", "ns", e.Namespace(), "err", err.Error())
		}
		r := rules.NewCreatedRule(e.Created)
		c.s.forgetNamespace(r.BucketNamespace())
	}
}

// dropDatabaseTimeseries serves dropDatabase of a database with created
// time-series collections: their entries go "dropping" (every proxy
// stops routing to them) before the database goes, then the entries go.
func (c *Conn) dropDatabaseTimeseries(req *request, created []rules.Rule) error {
	if err := c.ensureUpstream(); err != nil {
		return c.replyUpstreamDown(req, err)
	}
	// The catalog changes before the upstream sees the command: the
	// client's privilege is checked first, where the upstream reports
	// privileges (MongoDB; FerretDB allows its users everything).
	info, err := c.authInfo()
	if err != nil {
		return err
	}
	if !info.Allows(rewrite.ActionDropDatabase, req.db, "") {
		if req.msg.Flags&wire.MoreToCome != 0 {
			return nil
		}
		return c.replyRewriteError(req, rewrite.NotAuthorized(req.db, req.name))
	}
	marked, err := c.markDropping(req.db)
	if err != nil {
		c.restoreEntries(marked...)
		if req.msg.Flags&wire.MoreToCome != 0 {
			return nil
		}
		return c.replyRewriteError(req, err)
	}
	c.s.cat.Reread("dropDatabase began")
	c.s.cat.WaitOut()
	reply, err := c.upCommand(req.msg.Body)
	if err != nil {
		c.restoreEntries(marked...)
		return err
	}
	reply = append([]byte(nil), reply...)
	if !mongoerr.IsOK(reply) {
		c.restoreEntries(marked...)
	} else {
		c.forgetDroppedDB(req.db, marked)
	}
	c.s.cat.Reread("dropDatabase")
	if req.msg.Flags&wire.MoreToCome != 0 {
		return nil
	}
	return c.replyBody(req, reply)
}

// rules is the latest rule set (maybe stale: for background work, which
// re-reads it every round).
func (s *Engine) rules() *rules.Set { return s.cat.Load().Rules }

// routesRule reports whether the proxy still routes rule's namespace by a
// rule (true when the catalog cannot be read: nothing says otherwise).
func (s *Engine) routesRule(rule *rules.Rule) bool {
	if rule.Declared == nil {
		return true // config rules change with the config file only
	}
	snap, err := s.cat.Fresh()
	if err != nil {
		return true
	}
	return snap.Rules.Lookup(rule.DB, rule.Collection) != nil
}
