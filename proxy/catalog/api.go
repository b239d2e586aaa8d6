package catalog

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/tsproxy/tsproxy/proxy/exec"
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/admin"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/upstream"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// MongoDB's time-series API as the proxy serves it on a created
// namespace: create with the timeseries option, collMod, drop and
// dropDatabase, each a protocol of catalog writes around the upstream
// commands that make or drop the collections. The handler of a client's
// command gives its connection as a Client.

// Client is the client connection a time-series command runs on: the
// command, its replies, and the steps that run with the client's
// privileges on its upstream connection.
type Client interface {
	// The steps of the command's plans run on the client's upstream
	// connection.
	exec.Runner
	// Name, DB and Body are the client's command; Unacked says the
	// client reads no reply (moreToCome).
	Name() string
	DB() string
	Body() []byte
	Unacked() bool
	// Reply answers the client with body; the others answer with an
	// error.
	Reply(body []byte) error
	ReplyError(code mongoerr.Code, msg string) error
	ReplyRewriteError(err error) error
	ReplyUpstreamDown(err error) error
	ReplyCatalogDown(err error) error
	// EnsureUpstream dials the client's upstream connection if it has
	// none; Upstream is it.
	EnsureUpstream() error
	Upstream() *upstream.Conn
	// Gate runs the gates of a command on rule's namespace (errAnswered
	// style: an error that is the client's answer).
	Gate(rule *rules.Rule) error
	// RunPlan runs a plan of the command on rule's namespace; Answer
	// sends its reply.
	RunPlan(rule *rules.Rule, p rewrite.Plan) (rewrite.Result, error)
	Answer(rule *rules.Rule, res rewrite.Result) error
	// UpCommand sends body upstream as it is and returns the reply.
	UpCommand(body []byte) ([]byte, error)
	// AuthInfo is what the upstream says the client may do.
	AuthInfo() (rewrite.AuthInfo, error)
	// EnsureBucketIndex makes rule's bucket index once.
	EnsureBucketIndex(rule *rules.Rule)
	// ForgetNamespace forgets what the proxy keeps of a namespace
	// dropped.
	ForgetNamespace(ns string)
	Log() *slog.Logger
}

// ServeCreate serves a create with the timeseries option: see the
// protocol in the catalog.
func (cat *Catalog) ServeCreate(cl Client) error {
	if err := cl.EnsureUpstream(); err != nil {
		return cl.ReplyUpstreamDown(err)
	}
	created, err := admin.ParseTimeseriesCreate(cl.Body(), cl.DB())
	if err != nil {
		return cl.ReplyRewriteError(err)
	}
	rule := rules.NewCreatedRule(created)
	if err := cl.Gate(&rule); err != nil {
		return err
	}
	if err := cat.checkNameFree(cl, &rule); err != nil {
		return cl.ReplyRewriteError(err)
	}
	entry := admin.CatalogEntry{Created: created, State: admin.StateCreating, Nonce: NewNonce()}
	if _, err := cat.Write(admin.CatalogInsert(entry)); err != nil {
		return cat.createRace(cl, created, err)
	}
	cat.WaitOut()
	reply, err := cat.finishCreate(cl, &rule, entry)
	if err != nil {
		cat.abortCreate(cl, entry)
		if mongoerr.IsOK(reply) || reply == nil {
			return cl.ReplyRewriteError(err)
		}
		return cl.Reply(reply)
	}
	cat.Reread("create")
	cl.Log().Info("time-series collection created", "ns", rule.Namespace, "timeField", rule.TimeField, "metaField", rule.MetaField, "span", rule.Span)
	return cl.Reply(okReply())
}

// finishCreate checks again that the name is free (an insert sent on a
// stale snapshot may have created it), creates the bucket collection with
// the client's privileges, and marks the entry ready. A non-nil reply is
// the upstream's refusal, for the client.
func (cat *Catalog) finishCreate(cl Client, rule *rules.Rule, entry admin.CatalogEntry) ([]byte, error) {
	if err := cat.checkNameFree(cl, rule); err != nil {
		return nil, err
	}
	createCmd := bson.D{{Key: "create", Value: rule.Collection}, {Key: "$db", Value: rule.DB}}
	body, _ := bson.Marshal(createCmd)
	res, err := cl.RunPlan(rule, admin.Create(body, rule))
	if err != nil {
		return nil, err
	}
	if !mongoerr.IsOK(res.Reply) && QuotedCreateFailed(rule.Collection, res.Reply) {
		// Its buckets go to collections the merge creates as it goes.
		return mongoerr.ReplyNamed(mongoerr.InvalidNamespace, "", fmt.Sprintf(
			"tsproxy: the upstream cannot hold the time-series collection %q of database %q: its name holds '\"', which FerretDB 1.x on SQLite cannot create (choose a name without it)", rule.Collection, rule.DB)), errors.New("create refused")
	}
	if !mongoerr.IsOK(res.Reply) {
		return res.Reply, errors.New("create refused")
	}
	cl.EnsureBucketIndex(rule)
	ready := entry
	ready.State = admin.StateReady
	n, err := cat.Write(admin.CatalogReplace(ready, entry.Nonce, admin.StateCreating))
	if err != nil {
		return nil, mongoerr.Errorf(mongoerr.HostUnreachable, "tsproxy: create of %s: marking it ready in the catalog: %v", rule.Namespace, err)
	}
	if n != 1 {
		return nil, mongoerr.Errorf(mongoerr.ConflictingOperationInProgress, "tsproxy: create of %s took too long and another proxy gave it up; retry", rule.Namespace)
	}
	return nil, nil
}

// abortCreate deletes the entry of a create that failed.
func (cat *Catalog) abortCreate(cl Client, entry admin.CatalogEntry) {
	if _, err := cat.Write(admin.CatalogDelete(entry.Namespace(), entry.Nonce)); err != nil {
		cl.Log().Warn("catalog: deleting a failed create's entry failed; another proxy deletes it later", "ns", entry.Namespace(), "err", err.Error())
	}
}

// createRace answers a create whose catalog insert failed: a duplicate
// key is another create of the name, answered as MongoDB answers a
// create of an existing collection.
func (cat *Catalog) createRace(cl Client, created rules.Created, err error) error {
	var we *WriteError
	if !errors.As(err, &we) || we.Code != int64(mongoerr.DuplicateKey) {
		return cl.ReplyError(mongoerr.HostUnreachable, fmt.Sprintf("tsproxy: create of %s.%s: writing the catalog: %v", created.DB, created.Collection, err))
	}
	snap, rerr := cat.Refresh(nil)
	if rerr != nil {
		return cl.ReplyCatalogDown(rerr)
	}
	ns := created.DB + "." + created.Collection
	if e, busy := snap.Pending(ns); busy {
		return cl.ReplyError(mongoerr.ConflictingOperationInProgress, fmt.Sprintf("tsproxy: the time-series collection %s is being %s by another client; retry", ns, e.State))
	}
	if rule := snap.Rules.Lookup(created.DB, created.Collection); rule != nil {
		if admin.SameTimeseries(created, rule) {
			return cl.Reply(okReply())
		}
		return cl.ReplyRewriteError(admin.ExistsError(created, rule))
	}
	return cl.ReplyError(mongoerr.ConflictingOperationInProgress, fmt.Sprintf("tsproxy: the time-series collection %s was dropped while this create ran; retry", ns))
}

// checkNameFree: MongoDB's NamespaceExists when a plain collection has
// the name, or when the bucket collection holds documents (a rule
// removed from config.yaml left them).
func (cat *Catalog) checkNameFree(cl Client, rule *rules.Rule) error {
	for _, name := range []string{rule.Collection, rule.BucketCollection} {
		cmd := bson.D{{Key: "listCollections", Value: 1}, {Key: "filter", Value: bson.D{{Key: "name", Value: name}}}, {Key: "nameOnly", Value: true}, {Key: "$db", Value: rule.DB}}
		reply, err := exec.RunDoc(cl.Upstream(), cmd)
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
		count, err := exec.RunDoc(cl.Upstream(), bson.D{{Key: "count", Value: name}, {Key: "$db", Value: rule.DB}})
		if err != nil {
			return mongoerr.Errorf(mongoerr.HostUnreachable, "tsproxy: create of %s: %v", rule.Namespace, err)
		}
		if n, _ := count.Lookup("n").AsInt64OK(); n > 0 {
			return mongoerr.Errorf(mongoerr.NamespaceExists, "Collection %s already exists. (it holds %d documents of an earlier bucketed namespace; drop it first)", rule.BucketNamespace(), n)
		}
	}
	return nil
}

// ServeCreateOfRule answers a create of a created rule's namespace: ok for
// the same options (MongoDB 7.1+), NamespaceExists otherwise.
func (cat *Catalog) ServeCreateOfRule(cl Client, rule *rules.Rule) error {
	if !admin.HasTimeseries(cl.Body()) {
		// Any other create of the name (capped, a validator...) meets
		// the collection: NamespaceExists, before its options are read
		// as a time-series create's (they answered InvalidOptions).
		return cl.ReplyRewriteError(admin.ExistsError(rule.CreatedOf(), rule))
	}
	created, err := admin.ParseTimeseriesCreate(cl.Body(), cl.DB())
	if err != nil {
		return cl.ReplyRewriteError(err)
	}
	if admin.SameTimeseries(created, rule) {
		return cl.Reply(okReply())
	}
	return cl.ReplyRewriteError(admin.ExistsError(created, rule))
}

// ServeCollMod changes a created rule's granularity or
// expireAfterSeconds; a config rule changes only in config.yaml.
func (cat *Catalog) ServeCollMod(cl Client, rule *rules.Rule) error {
	if rule.Declared == nil {
		return cl.ReplyRewriteError(mongoerr.Errorf(mongoerr.NotImplemented, "tsproxy rule %s: collMod of a namespace bucketed by config.yaml is not supported; change its rule there", rule.Namespace))
	}
	created, err := admin.ParseTimeseriesCollMod(cl.Body(), rule)
	if err != nil {
		return cl.ReplyRewriteError(err)
	}
	if err := cat.replaceReady(rule.Namespace, func(rules.Created) rules.Created { return created }, "collMod"); err != nil {
		return cl.ReplyRewriteError(err)
	}
	return cl.Reply(okReply())
}

// replaceReady replaces the ready catalog entry of ns by what change
// makes of its Created, then waits out every proxy's snapshot from
// before and reads the catalog again: once it returns, the change is
// what every proxy lists, sweeps and writes by. what names the command.
func (cat *Catalog) replaceReady(ns string, change func(rules.Created) rules.Created, what string) error {
	changed := mongoerr.Errorf(mongoerr.ConflictingOperationInProgress, "tsproxy: the time-series collection %s changed meanwhile; retry", ns)
	old, ok := cat.Load().Entries[ns]
	if !ok || old.State != admin.StateReady {
		return changed
	}
	entry := admin.CatalogEntry{Created: change(old.Created), State: admin.StateReady, Nonce: NewNonce()}
	n, err := cat.Write(admin.CatalogReplace(entry, old.Nonce, admin.StateReady))
	if err != nil {
		return mongoerr.Errorf(mongoerr.HostUnreachable, "tsproxy: %s of %s: writing the catalog: %v", what, ns, err)
	}
	if n != 1 {
		return changed
	}
	cat.WaitOut()
	cat.Reread(what)
	return nil
}

// ServeDrop drops a created rule's namespace: the entry goes
// "dropping", every proxy stops routing to it, then its collections and
// its entry go.
func (cat *Catalog) ServeDrop(cl Client, rule *rules.Rule) error {
	snap := cat.Load()
	old, ok := snap.Entries[rule.Namespace]
	if !ok || old.State != admin.StateReady {
		return cl.ReplyError(mongoerr.ConflictingOperationInProgress, fmt.Sprintf("tsproxy: the time-series collection %s changed meanwhile; retry", rule.Namespace))
	}
	dropping := old
	dropping.State = admin.StateDropping
	n, err := cat.Write(admin.CatalogReplace(dropping, old.Nonce, admin.StateReady))
	if err != nil || n != 1 {
		return cl.ReplyError(mongoerr.ConflictingOperationInProgress, fmt.Sprintf("tsproxy: drop of %s: the catalog entry changed meanwhile (%v); retry", rule.Namespace, err))
	}
	return cat.FinishDrop(cl, rule, dropping)
}

// FinishDrop is the rest of a drop once the entry is "dropping" (also a
// drop run again after a proxy stopped mid-drop).
func (cat *Catalog) FinishDrop(cl Client, rule *rules.Rule, dropping admin.CatalogEntry) error {
	cat.Reread("drop began")
	cat.WaitOut()
	res, err := cl.RunPlan(rule, admin.Drop(cl.Body(), rule))
	if err != nil {
		cat.restoreEntries(cl, dropping)
		return err
	}
	if !mongoerr.IsOK(res.Reply) && !isNamespaceNotFound(res.Reply) {
		// Refused (the client's privileges, say): the namespace stays a
		// time-series collection, whatever of it the drop removed, and a
		// drop run again finishes.
		cat.restoreEntries(cl, dropping)
		return cl.Answer(rule, res)
	}
	cat.dropStaging(cl, rule)
	if _, err := cat.Write(admin.CatalogDelete(rule.Namespace, dropping.Nonce)); err != nil {
		return cl.ReplyError(mongoerr.HostUnreachable, fmt.Sprintf("tsproxy: drop of %s: deleting its catalog entry: %v; run drop again", rule.Namespace, err))
	}
	cl.ForgetNamespace(rule.BucketNamespace())
	cat.Reread("drop")
	return cl.Answer(rule, res)
}

// restoreEntries puts entries left "dropping" by a drop that did not
// happen back to "ready", so that the namespaces keep serving instead of
// waiting for a drop run again.
func (cat *Catalog) restoreEntries(cl Client, dropping ...admin.CatalogEntry) {
	for _, e := range dropping {
		ready := e
		ready.State, ready.Nonce = admin.StateReady, NewNonce()
		if _, err := cat.Write(admin.CatalogReplace(ready, e.Nonce, admin.StateDropping)); err != nil {
			cl.Log().Warn("catalog: an entry of a failed drop was left dropping; run drop again", "ns", e.Namespace(), "err", err.Error())
		}
	}
	cat.Reread("failed drop")
}

// dropStaging drops the rule's staging collections (events not merged
// yet), so a later create of the name starts empty.
func (cat *Catalog) dropStaging(cl Client, rule *rules.Rule) {
	res, err := exec.Drive(cl, admin.DropStaging(rule))
	if err == nil && res.Reply != nil && !mongoerr.IsOK(res.Reply) {
		err = errors.New(string(bson.Raw(res.Reply).Lookup("errmsg").StringValue()))
	}
	if err != nil {
		cl.Log().Warn("drop: staging collections were left", "rule", rule.Namespace, "err", err.Error())
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

// markDropping marks every ready catalog entry of db "dropping", from a
// catalog read now: one marked on an older snapshot failed its
// compare-and-set when a collMod or a create had changed it meanwhile,
// was skipped, and survived the database. A mark that loses such a race
// is tried again on a new read, a few times, then the drop is refused
// rather than run with an entry unmarked.
func (cat *Catalog) markDropping(cl Client, db string) (marked []admin.CatalogEntry, err error) {
	done := map[string]bool{}
	for attempt := 0; attempt < 5; attempt++ {
		snap, err := cat.Refresh(nil)
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
			n, err := cat.Write(admin.CatalogReplace(dropping, old.Nonce, admin.StateReady))
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
func (cat *Catalog) forgetDroppedDB(cl Client, db string, marked []admin.CatalogEntry) {
	entries := map[string]admin.CatalogEntry{}
	for _, e := range marked {
		entries[e.Namespace()] = e
	}
	if snap, err := cat.Refresh(nil); err == nil {
		for ns, e := range snap.Entries {
			if e.Created.DB == db {
				entries[ns] = e
			}
		}
	} else {
		cl.Log().Warn("catalog: read after dropDatabase failed; only the entries it marked are deleted", "db", db, "err", err.Error())
	}
	for _, e := range entries {
		if _, err := cat.Write(admin.CatalogDelete(e.Namespace(), e.Nonce)); err != nil {
			cl.Log().Warn("catalog: an entry of a dropped database was left; drop the namespace again", "ns", e.Namespace(), "err", err.Error())
		}
		r := rules.NewCreatedRule(e.Created)
		cl.ForgetNamespace(r.BucketNamespace())
	}
}

// ServeDropDatabase serves dropDatabase of a database with created
// time-series collections: their entries go "dropping" (every proxy
// stops routing to them) before the database goes, then the entries go.
func (cat *Catalog) ServeDropDatabase(cl Client, created []rules.Rule) error {
	if err := cl.EnsureUpstream(); err != nil {
		return cl.ReplyUpstreamDown(err)
	}
	// The catalog changes before the upstream sees the command: the
	// client's privilege is checked first, where the upstream reports
	// privileges (MongoDB; FerretDB allows its users everything).
	info, err := cl.AuthInfo()
	if err != nil {
		return err
	}
	if !info.Allows(rewrite.ActionDropDatabase, cl.DB(), "") {
		if cl.Unacked() {
			return nil
		}
		return cl.ReplyRewriteError(rewrite.NotAuthorized(cl.DB(), cl.Name()))
	}
	marked, err := cat.markDropping(cl, cl.DB())
	if err != nil {
		cat.restoreEntries(cl, marked...)
		if cl.Unacked() {
			return nil
		}
		return cl.ReplyRewriteError(err)
	}
	cat.Reread("dropDatabase began")
	cat.WaitOut()
	reply, err := cl.UpCommand(cl.Body())
	if err != nil {
		cat.restoreEntries(cl, marked...)
		return err
	}
	reply = append([]byte(nil), reply...)
	if !mongoerr.IsOK(reply) {
		cat.restoreEntries(cl, marked...)
	} else {
		cat.forgetDroppedDB(cl, cl.DB(), marked)
	}
	cat.Reread("dropDatabase")
	if cl.Unacked() {
		return nil
	}
	return cl.Reply(reply)
}

// QuotedCreateFailed: reply is an upstream's internal error to a create
// of coll, whose name holds '"' (see makeQuoted).
func QuotedCreateFailed(coll string, reply []byte) bool {
	if !strings.Contains(coll, `"`) {
		return false
	}
	r := upstream.RefusalOf(reply)
	return r != nil && r.Code == mongoerr.InternalError
}

// AddAggregates makes a created rule keep the min and max of fields in
// every bucket written from now on, for an index on them (MongoDB keeps
// control.min and max of every field): the entry gets them, every
// proxy's snapshot from before is waited out, as for a collMod, and the
// rule that has them is returned. Buckets written before keep no
// summaries of the fields and say so (bucket.FieldSummed), so reads
// never prune by them and the summaries never answer for them.
func (cat *Catalog) AddAggregates(rule *rules.Rule, fields []string) (*rules.Rule, error) {
	add := func(c rules.Created) rules.Created {
		c.Aggregates = slices.Clone(c.Aggregates)
		for _, f := range fields {
			if !slices.Contains(c.Aggregates, f) {
				c.Aggregates = append(c.Aggregates, f)
			}
		}
		return c
	}
	if err := cat.replaceReady(rule.Namespace, add, "createIndexes"); err != nil {
		return nil, err
	}
	r := cat.Load().Rules.Lookup(rule.DB, rule.Collection)
	for _, f := range fields {
		if r == nil || !slices.Contains(r.Aggregates, f) {
			return nil, mongoerr.Errorf(mongoerr.ConflictingOperationInProgress, "tsproxy: the time-series collection %s changed meanwhile; retry", rule.Namespace)
		}
	}
	return r, nil
}
