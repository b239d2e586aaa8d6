package tier

import (
	"errors"
	"strings"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/proxy/exec"
	"github.com/tsproxy/tsproxy/proxy/tier/lease"
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/read"
	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rewrite/stage/merge"
	"github.com/tsproxy/tsproxy/rules"
)

// The staging tier (rewrite/stage): inserts of a staged rule go to its
// staging collections with no lock, no update and no lease (into
// collections of this proxy's own where the upstream needs that, see
// stagedInsert); merges write its buckets. One merge of a rule runs at a
// time in this proxy (State's lock) and in the fleet (the rule's
// writer lease); a proxy that does not hold it freezes its own staging
// collections only. A merge runs before
// every command on the rule's namespace but inserts, getMore and
// killCursors (so reads, counts, deletes and drops see complete buckets
// only), on tsproxyFlush, and in the background once a staging
// collection has taken nothing new for the rule's mergeAfter.

// RetryHorizon is how long the records of merged retryable writes are
// kept: a driver retries within its server selection timeout (30 s by
// default), after a proxy restarts too.
const RetryHorizon = 10 * time.Minute

// MendOrphanedStaging handles reply, a staged insert's, when it says the
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
func (t *Tier) MendOrphanedStaging(cl Client, rule *rules.Rule, caps caps.Upstream, reply []byte, inflight *sync.RWMutex) bool {
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
		err := t.Flush(cl, rule, caps, nil, AllStaged, NoSpare)
		inflight.RLock()
		if err != nil {
			t.log.Warn("staging: the upstream cannot create a staging collection (an index FerretDB did not record has the name of its index), and the flush that would free the name failed", "rule", rule.Namespace, "err", err.Error())
			return false
		}
		return true
	}
	old := t.Stager(rule, caps)
	t.state.NextGen(rule.Namespace, time.Now())
	t.log.Warn("staging: the upstream cannot create a staging collection (its table outlived FerretDB's catalog entry, as a FerretDB killed while creating it leaves it, on PostgreSQL or SQLite); staging moves to collections of a new name, and the table named below can be dropped (in PostgreSQL, or in the database's SQLite file)",
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

// LogOrphanedIndex logs, at most once a minute per rule, an insert that a
// flush did not rid of an unrecorded index (MendOrphanedStaging): the
// index is then another proxy's staging collection's, which goes at that
// proxy's next merge, or one of a collection never dropped (the rule's
// records or event-id index).
func (t *Tier) LogOrphanedIndex(cl Client, rule *rules.Rule, reply []byte) {
	orphan, ok := stage.OrphanedCollection(reply)
	if !ok || !orphan.Index {
		return
	}
	if !t.OrphanLogDue(rule.Namespace, time.Minute) {
		return
	}
	t.log.Error("staging: the upstream cannot create staging collections: FerretDB (on PostgreSQL, killed while it created a collection) did not record the index named below, and gives its name to every new staging collection of the rule; a merge of the collection it belongs to frees the name, and renaming the index in PostgreSQL (ALTER INDEX \"<database>\".\"<index>\" RENAME TO ...) frees it at once, its collection keeping it",
		"rule", rule.Namespace, "err", orphan.Message)
}

// Stager is how this proxy names its staging collections of rule: its
// own on an upstream whose writes are not isolated (FerretDB); the
// shared names elsewhere (MongoDB renames atomically, so there any proxy
// freezes any staging collection).
func (t *Tier) Stager(rule *rules.Rule, caps caps.Upstream) stage.Stager {
	if !caps.SingleWriter {
		return stage.Stager{}
	}
	return stage.Stager{Tag: t.StagerTag(), Gen: t.state.Gen(rule.Namespace, t.since)}
}

// StagerTag names this proxy in its staging collections' names: its
// writer identity (host and listen address), so a proxy restarted on the
// same address knows its predecessor's collections.
func (t *Tier) StagerTag() string {
	id := t.leases.Identity()
	if last := t.tag.Load(); last != nil && last.identity == id {
		return last.tag
	}
	// A hash, asked for by every staged insert: made once per identity
	// (which changes only when the proxy starts listening).
	made := &stagerTagOf{identity: id, tag: stage.StagerTag(id)}
	t.tag.Store(made)
	return made.tag
}

// stagerTagOf is the Stager tag of one identity.
type stagerTagOf struct{ identity, tag string }

// AnnounceStaging renews this proxy's announcement that it stages rule
// (lease.Presence), with the client's privileges, where the proxy stages
// into collections of its own.
func (t *Tier) AnnounceStaging(cl Client, rule *rules.Rule, caps caps.Upstream) error {
	if !caps.SingleWriter {
		return nil
	}
	return t.presence.Announce(cl.Upstream(), rule.DB, rule.BucketCollection, t.StagerTag(), t.leases.Identity())
}

// UpstreamFailure is a merge that lost its upstream connection.
type UpstreamFailure struct{ Err error }

func (u UpstreamFailure) Error() string { return u.Err.Error() }

// mergeStaged runs one merge of rule on the client's connection: as the
// holder of the rule's writer lease when it can take it, else as a guest
// (its own staging collections frozen, nothing merged).
func (t *Tier) mergeStaged(cl Client, rule *rules.Rule, caps caps.Upstream, opts merge.MergeOptions) (merge.Stats, error) {
	err := t.EnsureWriter(cl, rule, caps)
	var held *lease.HeldError
	switch {
	case errors.As(err, &held):
		opts.Guest = true
	case err != nil:
		return merge.Stats{}, err
	}
	opts.CheckLate = t.lateDocsPossible(rule, caps)
	return t.RunMerge(cl, cl.Upstream(), rule, caps, opts, false)
}

// lateGuard is how long after the previous term of a rule's writer lease
// ran out a merge looks for late documents: an insert its holder began
// must have been stuck in the upstream that long to land after a freeze.
const lateGuard = time.Minute

// lateDocsPossible says whether a retired collection of rule may take
// documents after its freeze (merge.MergeOptions.CheckLate). Only where
// a rename changes nothing but the upstream's catalog (FerretDB, whose
// staged inserts need the writer lease): this proxy holds its own
// inserts off during a freeze, so only an insert begun under an earlier
// term (another proxy's, or this one's before a restart) can be late.
func (t *Tier) lateDocsPossible(rule *rules.Rule, caps caps.Upstream) bool {
	if !caps.SingleWriter {
		return false
	}
	term, held := t.leases.Current(rule.DB, rule.Collection)
	return !held || time.Since(term.EarlierWritesBefore) < lateGuard
}

// RunMerge runs a merge plan on r under the rule's merge lock; up asks
// whether other proxies' announcements lapsed.
func (t *Tier) RunMerge(r exec.Runner, up lease.Commander, rule *rules.Rule, caps caps.Upstream, opts merge.MergeOptions, background bool) (merge.Stats, error) {
	l := t.state.Lock(rule.Namespace)
	l.Lock()
	defer l.Unlock()
	st, err := t.runMergeLocked(r, up, rule, caps, opts, background)
	if err != nil {
		// What the merge wrote before it stopped is not known.
		t.dirs.Forget(rule.BucketNamespace())
	}
	return st, err
}

// runMergeLocked is RunMerge under the rule's merge lock: its options
// (mergeOptions), its runner (mergeRunner), then three passes: the
// retired collections left before, the freeze with this proxy's inserts
// held off, and what the freeze retired.
func (t *Tier) runMergeLocked(r exec.Runner, up lease.Commander, rule *rules.Rule, caps caps.Upstream, opts merge.MergeOptions, background bool) (st merge.Stats, err error) {
	opts = t.mergeOptions(up, rule, caps, opts)
	if caps.SingleWriter && t.kept != nil {
		// What a freeze took and no merge asked for (a guest's, a
		// merge that failed) is read back when it is merged.
		defer func() { t.kept.forgetFrozen(rule, t.state.Gen(rule.Namespace, t.since)) }()
	}
	times := map[string]stage.StepTime{}
	defer func() { stage.AddStepTimes(&st.Upstream, times) }()
	r = t.mergeRunner(r, up, rule, caps, opts, times)
	if !opts.Guest {
		// Retired collections left before (a merge cut short, another
		// proxy's freeze) are merged first, with inserts going on.
		first, err := t.mergeRetiredOnly(r, rule, caps, opts, false)
		if err != nil {
			t.state.RecordFailed(rule, first)
			return first, err
		}
		// Counted now: the passes below record their own (the first
		// pass's were dropped, and its merged events never counted).
		t.state.RecordCounts(rule, first)
	}
	// The freeze, with this proxy's inserts into the rule held off.
	freezeOpts := opts
	freezeOpts.FreezeOnly = true
	freeze := merge.NewMerge(rule, freezeOpts)
	inflight := t.state.Inserts(rule.Namespace)
	inflight.Lock()
	res, err := exec.Drive(r, freeze)
	for _, why := range freeze.Stats.PresenceErrors {
		t.log.Warn("staging: could not read whether a proxy stopped; its staging collections wait", "rule", rule.Namespace, "err", why)
	}
	if freeze.Stats.Frozen > 0 || err != nil || !mongoerr.IsOK(res.Reply) {
		// This proxy's next inserts go to collections of a new
		// generation: none of the names frozen is created again. A
		// freeze cut short (a failed rename, a lost reply) may have
		// renamed some: its next insert recreated the name, and the
		// kept documents of the renamed one took that insert too,
		// merged twice.
		t.state.NextGen(rule.Namespace, opts.Now)
	}
	if err == nil && mongoerr.IsOK(res.Reply) && freeze.Stats.Pending == 0 {
		t.state.FrozeAll(rule)
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
		t.state.Record(rule, freeze.Stats, background)
		return freeze.Stats, nil
	}
	st, err = t.mergeRetiredOnly(r, rule, caps, opts, true)
	st.Pending, st.Markers, st.Others = freeze.Stats.Pending, freeze.Stats.Markers, freeze.Stats.Others
	if err != nil {
		t.state.RecordFailed(rule, st)
		return st, err
	}
	t.state.Record(rule, st, background)
	if st.Collections > 0 {
		slowest, took := exec.SlowestStep(times)
		t.log.Debug("staging merged", "rule", rule.Namespace, "collections", st.Collections, "events", st.Events, "buckets", st.Buckets,
			"slowestStep", slowest, "slowestStepMs", took.Milliseconds())
	}
	return st, nil
}

// mergeOptions completes opts for a merge of rule on an upstream with
// caps: what the upstream lets it do, and what the tier keeps for it
// (its Host, the directory, the records, the stale entries).
func (t *Tier) mergeOptions(up lease.Commander, rule *rules.Rule, caps caps.Upstream, opts merge.MergeOptions) merge.MergeOptions {
	if opts.Now.IsZero() {
		opts.Now = time.Now()
	}
	opts.RetryHorizon = RetryHorizon
	h := t.hostOf(&opts, rule)
	lookups := read.IDLookupIndexed
	if !opts.Guest {
		// How the merge reads the buckets it writes or probes.
		lookups = t.host.IDLookupCost(up, rule, caps)
		h.lookups, h.hasLookups = lookups, true
	}
	opts.RollupStatements = caps.MaxUpdateStatements
	opts.PackedEvents = caps.PackedEvents
	if caps.SingleWriter {
		opts.Self, opts.Since = t.StagerTag(), t.since
		if t.kept != nil {
			h.kept = true
		}
		opts.TakeOver = true
		// Deletes run under the writer lease here, as the merge does,
		// and lock the keys they rewrite as the merge's top-ups do.
		opts.TopUp = true
		h.locks = true // and claim shells
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
			opts.Known = t.dirs.Known(rule.BucketNamespace(), t.heldTerm(rule))
			opts.Known.NoRead = lookups == read.IDLookupIndexed
			// The holder's merges are the only writers of the records of
			// merged retryable writes too, on every upstream: it keeps
			// them between merges rather than read them all at each.
			opts.Records = t.dirs.RecordCache(rule.BucketNamespace(), t.heldTerm(rule))
			// And it leaves the entries its top-ups made stale to be
			// deleted many at a time.
			opts.Stale = t.dirs.StaleEntries(rule.BucketNamespace(), t.heldTerm(rule)())
			// It widens the series entries only past what its term's
			// merges wrote.
			opts.Series = t.dirs.SeriesSeen(rule.BucketNamespace(), t.heldTerm(rule)())
		}
	}
	if !opts.Guest {
		opts.InsertStreams = exec.MergeInsertStreams
	}
	return opts
}

// mergeRunner is the runner every step of a merge of rule goes through,
// composed here once, innermost first: r (the merge's connection), the
// bucket inserts spread over helper connections, the mend of an orphaned
// table, the step timings (into times), and the writer lease renewed as
// the holder's merge goes.
func (t *Tier) mergeRunner(r exec.Runner, up lease.Commander, rule *rules.Rule, caps caps.Upstream, opts merge.MergeOptions, times map[string]stage.StepTime) exec.Runner {
	if !opts.Guest {
		r = exec.Parallel{R: r, Helpers: t.helpers}
		if t.dropOrphan != nil {
			r = orphanMender{r: r, t: t}
		}
	}
	r = exec.Timed{R: r, Rule: rule, Times: times}
	if !opts.Guest && caps.SingleWriter {
		// Every step of the holder's merge runs under the writer lease,
		// renewed as it goes: a merge of many collections outlasts a
		// lease, and two proxies merging at once would give different
		// buckets the same ids.
		r = leasedRunner{r: r, renew: func() error { return t.leases.Ensure(up, rule.DB, rule.Collection, t.log) }}
	}
	return r
}

// heldTerm is the number of the term of rule's writer lease this proxy
// holds now (0: none), for what its merges keep between them.
func (t *Tier) heldTerm(rule *rules.Rule) func() int64 {
	return func() int64 {
		t, held := t.leases.Current(rule.DB, rule.Collection)
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
func (t *Tier) mergeRetiredOnly(r exec.Runner, rule *rules.Rule, caps caps.Upstream, opts merge.MergeOptions, retired bool) (merge.Stats, error) {
	opts.All, opts.RetiredOnly = false, true
	opts.Host = t.hostOf(&opts, rule).withoutDue()
	m := merge.NewMerge(rule, opts)
	if retired {
		_ = t.host.EnsureBucketIndex(r, rule, caps) // logged; the merge works without it
	}
	res, err := exec.Drive(r, m)
	if len(m.Stats.RollupErrors) > 0 {
		// Rollups count at most once (rewrite/stage countRollups).
		t.log.Error("rollups not updated for merged events; they are stored but these rollup documents lag (tsproxy rollups rebuild recounts them)",
			"rule", rule.Namespace, "errors", strings.Join(m.Stats.RollupErrors, "; "))
	}
	for _, name := range m.Stats.Lost {
		// Its events were merged before; the catalog
		// entry FerretDB cannot drop stays, renamed.
		t.log.Warn("staging: a retired staging collection had lost its table (FerretDB on PostgreSQL killed while dropping it after its merge) and was set aside; its catalog entry can be deleted in PostgreSQL's _ferretdb_database_metadata",
			"rule", rule.Namespace, "collection", name, "renamedTo", stage.LostName(rule, name))
	}
	if m.Stats.Collections > 0 {
		_ = t.host.EnsureBucketIndex(r, rule, caps)
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
	return UpstreamFailure{Err: err}
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
