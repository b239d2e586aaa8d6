package proxy

import (
	"errors"
	"strings"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/proxy/exec"
	"github.com/tsproxy/tsproxy/proxy/lease"
	"github.com/tsproxy/tsproxy/proxy/tier"
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/insert"
	"github.com/tsproxy/tsproxy/rewrite/layout"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/read"
	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rules"
)

// The staging tier (rewrite/stage): inserts of a staged rule go to its
// staging collections with no lock, no update and no lease (into
// collections of this proxy's own where the upstream needs that, see
// stagedInsert); merges write its buckets. One merge of a rule runs at a
// time in this proxy (tier.State's lock) and in the fleet (the rule's
// writer lease); a proxy that does not hold it freezes its own staging
// collections only. A merge runs before
// every command on the rule's namespace but inserts, getMore and
// killCursors (so reads, counts, deletes and drops see complete buckets
// only), on tsproxyFlush, and in the background once a staging
// collection has taken nothing new for the rule's mergeAfter.

// stagedRule says whether rule stages its events on this upstream.
// RetryHorizon is how long the records of merged retryable writes are
// kept: a driver retries within its server selection timeout (30 s by
// default), after a proxy restarts too.
const RetryHorizon = 10 * time.Minute

func (c *conn) stagedRule(rule *rules.Rule) (bool, caps.Upstream, error) {
	caps, err := c.upstreamCaps()
	if err != nil {
		return false, caps, err
	}
	return rule.Staged(caps.CostlyUpdates), caps, nil
}

// stagedInsert stores an insert's events in the rule's staging tier: no
// key lock, no fills, no update, and no writer lease. On an upstream
// whose rename changes only its catalog (FerretDB) the proxy inserts
// into staging collections of its own (stage.Stager), which only it
// freezes while it runs, holding its own inserts off: another proxy's
// insert that looked a staging collection up before a merge renamed it
// would commit into the renamed collection after the merge read it, and
// be lost (TestStageThreeProxies found 51 of 22,926 events so on the
// stock ferretdb command, when the proxies shared staging collections).
// Before its first insert into a rule, and then every half lease, it
// announces that it runs (lease.Presence): the holder of the rule's
// writer lease takes its collections over once that lapsed.
func (c *conn) stagedInsert(req *request, rule *rules.Rule) error {
	caps, err := c.upstreamCaps()
	if err != nil {
		return err
	}
	// Before the announcement: a rule's first stager makes its format
	// record before it leaves any trace of staging it.
	format := c.s.stagingFormat(c.up, rule)
	if err := c.announceStaging(rule, caps); err != nil {
		return err
	}
	cmd := commandOf(req)
	identity, err := c.identity()
	if err != nil {
		return err
	}
	prepared, err := prepareStaged(cmd, rule)
	c.ensureLifecycle(rule)
	if err == nil {
		// Backpressure: wait for room in staging (before the insert holds
		// off the freeze that makes it).
		if _, full := c.s.merges.Admit(rule, waitDeadline(req, stagedWait)); full != nil {
			code := mongoerr.MaxTimeMSExpired
			if full == tier.ErrShuttingDown {
				code = mongoerr.InterruptedAtShutdown
			}
			return c.replyError(req, code, full.Error())
		}
	}
	// Held from the generation read to the reply: a freeze of this
	// proxy's collections (which moves it on) waits for it.
	inflight := c.s.merges.Inserts(rule.Namespace)
	inflight.RLock()
	var p rewrite.Plan
	// An upstream that keeps no session state (no stmtIds: FerretDB)
	// takes concurrent clients' staged inserts as one.
	env := stage.InsertEnv{Identity: identity, NewObjectID: bson.NewObjectID,
		Combinable: !caps.StmtIDs, Stager: c.s.stager(rule, caps), Retry: req.retry, Format: format}
	if rule.Layout == rules.LayoutSlots {
		env.Stamp = c.s.arrival.next // the last write of a slot wins
	}
	planned := err == nil
	if planned {
		p = stage.Insert(cmd, prepared, env)
	} else {
		p = rewrite.Fail(mongoerr.Errorf(mongoerr.FailedToParse, "%s", err.Error()))
	}
	res, err := c.runPlan(req, rule, routeRewrite, p)
	if err == nil && planned && c.mendOrphanedStaging(rule, caps, res.Reply, inflight) {
		env.Stager = c.s.stager(rule, caps)
		res, err = c.runPlan(req, rule, routeRewrite, stage.Insert(cmd, prepared, env))
		if err == nil {
			c.logOrphanedIndex(rule, res.Reply)
		}
	}
	if err == nil && mongoerr.IsOK(res.Reply) {
		n, _ := bson.Raw(res.Reply).Lookup("n").AsInt64OK()
		// Its rollups count these events when they are merged
		// (stage.Merge), not here. Counted before the insert lets a
		// freeze go: a count after it (once the client had its reply)
		// could land after a freeze that took the events and reset the
		// backlog, and leave it counting events nothing staged, which
		// no freeze then reset: every later insert waited for room.
		c.s.merges.Staged(rule, n)
	}
	inflight.RUnlock()
	if err == nil {
		err = c.answer(req, rule, res)
	}
	return err
}

// mendOrphanedStaging handles reply, a staged insert's, when it says the
// upstream cannot create one of the rule's staging collections because a
// relation of that name outlived FerretDB's record of it
// (stage.OrphanedCollection: FerretDB, on PostgreSQL or SQLite, killed while it
// created a collection). It says whether the insert may run again, only
// ever when it stored nothing, since an insert without a session gets new
// _ids when it is planned again.
//
// A table is a staging collection's of that name: this proxy's staging
// of the rule moves to collections of a new generation. An index is one
// FerretDB made for an earlier collection but did not record, under the
// name it now gives the next collection of the rule (every staging
// collection's table name begins alike): the name is free once that
// collection is dropped, which a merge does to a staging collection. So
// the insert waits out a flush of the rule (inflight, which the insert
// holds read-locked, is released meanwhile: the flush's freeze takes
// it).
func (c *conn) mendOrphanedStaging(rule *rules.Rule, caps caps.Upstream, reply []byte, inflight *sync.RWMutex) bool {
	if !caps.SingleWriter {
		return false
	}
	orphan, ok := stage.OrphanedCollection(reply)
	if !ok || !storedNothing(reply) {
		return false
	}
	if orphan.Index {
		inflight.RUnlock()
		// Dropped, not kept as spares: the name is freed only when the
		// collection holding the index goes (a spare too may hold it).
		err := c.flushStaged(rule, caps, nil, allStaged, noSpare)
		inflight.RLock()
		if err != nil {
			c.log.Warn("staging: the upstream cannot create a staging collection (an index FerretDB did not record has the name of its index), and the flush that would free the name failed", "rule", rule.Namespace, "err", err.Error())
			return false
		}
		return true
	}
	old := c.s.stager(rule, caps)
	c.s.merges.NextGen(rule.Namespace, time.Now())
	c.log.Warn("staging: the upstream cannot create a staging collection (its table outlived FerretDB's catalog entry, as a FerretDB killed while creating it leaves it, on PostgreSQL or SQLite); staging moves to collections of a new name, and the table named below can be dropped (in PostgreSQL, or in the database's SQLite file)",
		"rule", rule.Namespace, "generation", old.Gen, "err", orphan.Message)
	return true
}

// storedNothing says whether reply, an insert's (or another write's that
// reports n), stored no document.
func storedNothing(reply []byte) bool {
	if !mongoerr.IsOK(reply) {
		return true // the command failed whole
	}
	n, ok := bson.Raw(reply).Lookup("n").AsInt64OK()
	return ok && n == 0
}

// logOrphanedIndex logs, at most once a minute per rule, an insert that a
// flush did not rid of an unrecorded index (mendOrphanedStaging): the
// index is then another proxy's staging collection's, which goes at that
// proxy's next merge, or one of a collection never dropped (the rule's
// records or event-id index).
func (c *conn) logOrphanedIndex(rule *rules.Rule, reply []byte) {
	orphan, ok := stage.OrphanedCollection(reply)
	if !ok || !orphan.Index {
		return
	}
	if !c.s.orphanLogDue(rule.Namespace, time.Minute) {
		return
	}
	c.log.Error("staging: the upstream cannot create staging collections: FerretDB (on PostgreSQL, killed while it created a collection) did not record the index named below, and gives its name to every new staging collection of the rule; a merge of the collection it belongs to frees the name, and renaming the index in PostgreSQL (ALTER INDEX \"<database>\".\"<index>\" RENAME TO ...) frees it at once, its collection keeping it",
		"rule", rule.Namespace, "err", orphan.Message)
}

// prepareStaged validates and prepares the events of an insert into a
// staged rule, with its layout's checks.
func prepareStaged(cmd rewrite.Command, rule *rules.Rule) (*insert.Prepared, error) {
	if rule.Layout != rules.LayoutEvents {
		return layout.PrepareStaged(cmd, rule, bson.NewObjectID)
	}
	return insert.Prepare(cmd, rule, bson.NewObjectID)
}

// stagedWait is how long a staged insert without maxTimeMS waits for
// room in staging (rules.Rule.MaxStaged) before it fails.
const stagedWait = time.Minute

// waitDeadline is when req stops waiting (for room in staging, for a
// writer lease): after its maxTimeMS when it has one above zero, else
// after fallback.
func waitDeadline(req *request, fallback time.Duration) time.Time {
	if ms, ok := bson.Raw(req.msg.Body).Lookup("maxTimeMS").AsInt64OK(); ok && ms > 0 {
		return time.Now().Add(time.Duration(ms) * time.Millisecond)
	}
	return time.Now().Add(fallback)
}

// stager is how this proxy names its staging collections of rule: its
// own on an upstream whose writes are not isolated (FerretDB); the
// shared names elsewhere (MongoDB renames atomically, so there any proxy
// freezes any staging collection).
func (s *Server) stager(rule *rules.Rule, caps caps.Upstream) stage.Stager {
	if !caps.SingleWriter {
		return stage.Stager{}
	}
	return stage.Stager{Tag: s.stagerTag(), Gen: s.merges.Gen(rule.Namespace, s.stagerSince)}
}

// stagerTag names this proxy in its staging collections' names: its
// writer identity (host and listen address), so a proxy restarted on the
// same address knows its predecessor's collections.
func (s *Server) stagerTag() string {
	id := s.leases.Identity()
	if t := s.tag.Load(); t != nil && t.identity == id {
		return t.tag
	}
	// A hash, asked for by every staged insert: made once per identity
	// (which changes only when the proxy starts listening).
	t := &stagerTagOf{identity: id, tag: stage.StagerTag(id)}
	s.tag.Store(t)
	return t.tag
}

// stagerTagOf is the stager tag of one identity.
type stagerTagOf struct{ identity, tag string }

// announceStaging renews this proxy's announcement that it stages rule
// (lease.Presence), with the client's privileges, where the proxy stages
// into collections of its own.
func (c *conn) announceStaging(rule *rules.Rule, caps caps.Upstream) error {
	if !caps.SingleWriter {
		return nil
	}
	return c.s.presence.Announce(c.up, rule.DB, rule.BucketCollection, c.s.stagerTag(), c.s.leases.Identity())
}

// upstreamFailure is a merge that lost its upstream connection.
type upstreamFailure struct{ err error }

func (u upstreamFailure) Error() string { return u.err.Error() }

// mergeStaged runs one merge of rule on the client's connection: as the
// holder of the rule's writer lease when it can take it, else as a guest
// (its own staging collections frozen, nothing merged).
func (c *conn) mergeStaged(rule *rules.Rule, caps caps.Upstream, opts stage.MergeOptions) (stage.Stats, error) {
	err := c.ensureWriter(rule, caps)
	var held *lease.HeldError
	switch {
	case errors.As(err, &held):
		opts.Guest = true
	case err != nil:
		return stage.Stats{}, err
	}
	opts.CheckLate = c.s.lateDocsPossible(rule, caps)
	return c.s.runMerge(c, c.up, rule, caps, opts, false)
}

// lateGuard is how long after the previous term of a rule's writer lease
// ran out a merge looks for late documents: an insert its holder began
// must have been stuck in the upstream that long to land after a freeze.
const lateGuard = time.Minute

// lateDocsPossible says whether a retired collection of rule may take
// documents after its freeze (stage.MergeOptions.CheckLate). Only where
// a rename changes nothing but the upstream's catalog (FerretDB, whose
// staged inserts need the writer lease): this proxy holds its own
// inserts off during a freeze, so only an insert begun under an earlier
// term (another proxy's, or this one's before a restart) can be late.
func (s *Server) lateDocsPossible(rule *rules.Rule, caps caps.Upstream) bool {
	if !caps.SingleWriter {
		return false
	}
	term, held := s.leases.Current(rule.DB, rule.Collection)
	return !held || time.Since(term.EarlierWritesBefore) < lateGuard
}

// runMerge runs a merge plan on r under the rule's merge lock; up asks
// whether other proxies' announcements lapsed.
func (s *Server) runMerge(r exec.Runner, up lease.Commander, rule *rules.Rule, caps caps.Upstream, opts stage.MergeOptions, background bool) (stage.Stats, error) {
	l := s.merges.Lock(rule.Namespace)
	l.Lock()
	defer l.Unlock()
	st, err := s.runMergeLocked(r, up, rule, caps, opts, background)
	if err != nil {
		// What the merge wrote before it stopped is not known.
		s.dirs.Forget(rule.BucketNamespace())
	}
	return st, err
}

// runMergeLocked is runMerge under the rule's merge lock.
func (s *Server) runMergeLocked(r exec.Runner, up lease.Commander, rule *rules.Rule, caps caps.Upstream, opts stage.MergeOptions, background bool) (st stage.Stats, err error) {
	if opts.Now.IsZero() {
		opts.Now = time.Now()
	}
	opts.RetryHorizon = RetryHorizon
	lookups := read.IDLookupIndexed
	if !opts.Guest {
		// How the merge reads the buckets it writes or probes.
		lookups = s.idLookupCost(up, s.log, rule, caps)
		opts.OneScanBeats = lookups.OneScanBeats
	}
	opts.RollupStatements = caps.MaxUpdateStatements
	opts.PackedEvents = caps.PackedEvents
	if caps.SingleWriter {
		opts.Self, opts.Since = s.stagerTag(), s.stagerSince
		if s.kept != nil {
			opts.Kept = func(r stage.Collection) ([][]byte, string, bool) { return s.kept.take(rule.DB + "." + r.OpenName()) }
			// What a freeze took and no merge asked for (a guest's, a
			// merge that failed) is read back when it is merged.
			defer func() { s.kept.forgetFrozen(rule, s.merges.Gen(rule.Namespace, s.stagerSince)) }()
		}
		opts.TakeOver = true
		// Deletes run under the writer lease here, as the merge does,
		// and lock the keys they rewrite as the merge's top-ups do.
		opts.TopUp = true
		opts.Shells = func(keys []bucket.Key) []bucket.Key { return s.shells.claim(rule.BucketNamespace(), keys) }
		opts.Lock = func(keys []bucket.Key) func() {
			l := s.state.bucketCache().Lock(rule.BucketNamespace(), keys)
			return func() {
				l.ForgetAll() // the direct path's fills of these keys changed
				l.Unlock()
			}
		}
		if !opts.Guest {
			// The holder knows its rule's buckets instead of probing
			// them: its merges are their only writers while it holds its
			// term. Where lookups by _id scan (the stock
			// command, PostgreSQL) a probe scans, so the directory reads
			// every bucket's key once instead. Where they are indexed
			// (the embedded upstream) FerretDB still decodes each bucket
			// a probe finds, so probing a key at each merge before a read
			// cost every event its window held; there the directory is
			// what the merges learn, and a key it lacks is probed once
			// (a read of every bucket would cost the whole rule).
			// A counter or slots rule has no delete through the proxy;
			// its direct inserts and retention sweeps count as writes.
			opts.Known = s.dirs.Known(rule.BucketNamespace(), s.heldTerm(rule))
			opts.Known.NoRead = lookups == read.IDLookupIndexed
			// The holder's merges are the only writers of the records of
			// merged retryable writes too, on every upstream: it keeps
			// them between merges rather than read them all at each.
			opts.Records = s.dirs.RecordCache(rule.BucketNamespace(), s.heldTerm(rule))
			// And it leaves the entries its top-ups made stale to be
			// deleted many at a time.
			opts.Stale = s.dirs.StaleEntries(rule.BucketNamespace(), s.heldTerm(rule)())
		}
	}
	if !opts.Guest {
		opts.InsertStreams = exec.MergeInsertStreams
		r = exec.Parallel{R: r, Helpers: s.helpers}
		if s.opts.DropOrphanedTable != nil {
			r = orphanMender{r: r, s: s}
		}
	}
	times := map[string]stage.StepTime{}
	r = exec.Timed{R: r, Rule: rule, Times: times}
	defer func() { stage.AddStepTimes(&st.Upstream, times) }()
	if !opts.Guest && caps.SingleWriter {
		// Every step of the holder's merge runs under the writer lease,
		// renewed as it goes: a merge of many collections outlasts a
		// lease, and two proxies merging at once would give different
		// buckets the same ids.
		r = leasedRunner{r: r, renew: func() error { return s.leases.Ensure(up, rule.DB, rule.Collection, s.log) }}
	}
	if !opts.Guest {
		// Retired collections left before (a merge cut short, another
		// proxy's freeze) are merged first, with inserts going on.
		first, err := s.mergeRetiredOnly(r, rule, caps, opts, false)
		if err != nil {
			s.merges.RecordFailed(rule, first)
			return first, err
		}
		// Counted now: the passes below record their own (the first
		// pass's were dropped, and its merged events never counted).
		s.merges.RecordCounts(rule, first)
	}
	// The freeze, with this proxy's inserts into the rule held off.
	freezeOpts := opts
	freezeOpts.FreezeOnly = true
	freeze := stage.NewMerge(rule, freezeOpts)
	inflight := s.merges.Inserts(rule.Namespace)
	inflight.Lock()
	res, err := exec.Drive(r, freeze)
	for _, why := range freeze.Stats.PresenceErrors {
		s.log.Warn("staging: could not read whether a proxy stopped; its staging collections wait", "rule", rule.Namespace, "err", why)
	}
	if freeze.Stats.Frozen > 0 || err != nil || !mongoerr.IsOK(res.Reply) {
		// This proxy's next inserts go to collections of a new
		// generation: none of the names frozen is created again. A
		// freeze cut short (a failed rename, a lost reply) may have
		// renamed some: its next insert recreated the name, and the
		// kept documents of the renamed one took that insert too,
		// merged twice.
		s.merges.NextGen(rule.Namespace, opts.Now)
	}
	if err == nil && mongoerr.IsOK(res.Reply) && freeze.Stats.Pending == 0 {
		s.merges.FrozeAll(rule)
	}
	inflight.Unlock()
	if err != nil {
		return freeze.Stats, mergeFailure(err)
	}
	if !mongoerr.IsOK(res.Reply) {
		return freeze.Stats, mongoerr.FromReply(res.Reply, "merge failed")
	}
	// Nothing frozen and nothing retired since the first pass: done. (A
	// collection another proxy froze meanwhile is merged now, not left:
	// a flush that found nothing to wait for reads next.)
	if opts.Guest || freeze.Stats.Frozen == 0 && len(freeze.Stats.Retired) == 0 {
		s.merges.Record(rule, freeze.Stats, background)
		return freeze.Stats, nil
	}
	st, err = s.mergeRetiredOnly(r, rule, caps, opts, true)
	st.Pending, st.Markers, st.Others = freeze.Stats.Pending, freeze.Stats.Markers, freeze.Stats.Others
	if err != nil {
		s.merges.RecordFailed(rule, st)
		return st, err
	}
	s.merges.Record(rule, st, background)
	if st.Collections > 0 {
		slowest, took := exec.SlowestStep(times)
		s.log.Debug("staging merged", "rule", rule.Namespace, "collections", st.Collections, "events", st.Events, "buckets", st.Buckets,
			"slowestStep", slowest, "slowestStepMs", took.Milliseconds())
	}
	return st, nil
}

// heldTerm is the number of the term of rule's writer lease this proxy
// holds now (0: none), for what its merges keep between them.
func (s *Server) heldTerm(rule *rules.Rule) func() int64 {
	return func() int64 {
		t, held := s.leases.Current(rule.DB, rule.Collection)
		if !held {
			return 0
		}
		return t.Number
	}
}

// mergeRetiredOnly merges rule's retired collections on r, into a bucket
// collection with its index. The index is made first when something is
// known to be retired (on an empty collection it costs nothing; built
// over the buckets, 100 ms for 50,000 events on the embedded upstream),
// else once something was merged: a create or drop of the namespace
// settles first, and must not find the collection made by that.
func (s *Server) mergeRetiredOnly(r exec.Runner, rule *rules.Rule, caps caps.Upstream, opts stage.MergeOptions, retired bool) (stage.Stats, error) {
	opts.All, opts.Due, opts.RetiredOnly = false, nil, true
	m := stage.NewMerge(rule, opts)
	if retired {
		_ = s.ensureIndexOn(r, rule, rule.BucketCollection, bucketIndexFailure, caps) // logged; the merge works without it
	}
	res, err := exec.Drive(r, m)
	if len(m.Stats.RollupErrors) > 0 {
		// Rollups count at most once (rewrite/stage countRollups).
		s.log.Error("rollups not updated for merged events; they are stored but these rollup documents lag (tsproxy rollups rebuild recounts them)",
			"rule", rule.Namespace, "errors", strings.Join(m.Stats.RollupErrors, "; "))
	}
	for _, name := range m.Stats.Lost {
		// Its events were merged before; the catalog
		// entry FerretDB cannot drop stays, renamed.
		s.log.Warn("staging: a retired staging collection had lost its table (FerretDB on PostgreSQL killed while dropping it after its merge) and was set aside; its catalog entry can be deleted in PostgreSQL's _ferretdb_database_metadata",
			"rule", rule.Namespace, "collection", name, "renamedTo", stage.LostName(rule, name))
	}
	if m.Stats.Collections > 0 {
		_ = s.ensureIndexOn(r, rule, rule.BucketCollection, bucketIndexFailure, caps)
	}
	if err != nil {
		return m.Stats, mergeFailure(err)
	}
	if !mongoerr.IsOK(res.Reply) {
		return m.Stats, mongoerr.FromReply(res.Reply, "merge failed")
	}
	return m.Stats, nil
}

// mergeFailure is what a merge's runner error means for the caller: a
// lost writer lease is the lease's error (the merge stopped; the next one
// finishes it); anything else lost the upstream connection.
func mergeFailure(err error) error {
	var held *lease.HeldError
	if errors.As(err, &held) || errors.Is(err, lease.ErrLost) {
		return err
	}
	return upstreamFailure{err: err}
}

// leasedRunner runs each step of a merge after making sure the proxy
// still holds the rule's writer lease (renewing it when half used).
type leasedRunner struct {
	r     exec.Runner
	renew func() error
}

func (l leasedRunner) RunStep(step rewrite.Step) ([][]byte, error) {
	if err := l.renew(); err != nil {
		return nil, err
	}
	return l.r.RunStep(step)
}
