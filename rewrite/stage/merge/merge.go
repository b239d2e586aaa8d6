package merge

import (
	"fmt"
	"slices"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/source"
	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rewrite/stage/idindex"
	"github.com/tsproxy/tsproxy/rules"
)

// Stats count what a merge did.
type Stats struct {
	Collections int // staging collections merged and dropped
	Events      int // events written into buckets
	Buckets     int // buckets written
	ToppedUp    int // last buckets of their key filled up (TopUp)
	Keys        int // bucket keys (series and window) the buckets written took
	// Series is the most series one staging collection's merge took:
	// the series a rule takes at once, which sizes its next merge batch
	// (a staging collection holds a day, so its keys count each series
	// once a window: a backfill of a day of 4 series in 1-hour windows
	// is 96 keys).
	Series  int
	Retries int // staged documents left out: retries of writes merged before
	Pending int // staging collections not due yet
	Frozen  int // retired collections left to merge (after a freeze)
	Late    int // documents that reached a retired collection after it was read, moved back to staging
	// Swept counts the buckets the merge meant to top up that the
	// retention sweep deleted first (an expired window's late data).
	Swept   int
	Counted int // events counted into the rule's rollups
	Kept    int // retired collections merged from what the proxy kept, not read back
	// DirectoryReads counts the reads of every bucket's key
	// (MergeOptions.Known).
	DirectoryReads int
	// KnownBuckets counts the buckets a counter or slots merge took from
	// the directory, without reading them: none there, or the whole
	// bucket it kept.
	KnownBuckets int
	// RecordReads counts the reads of the records of merged retryable
	// writes (MergeOptions.Records).
	RecordReads int
	// StaleDropped counts the stale event-id index entries deleted
	// (MergeOptions.Stale).
	StaleDropped int
	// Spares counts the retired collections kept as spare collections
	// (Host.ReserveSpare).
	Spares int
	// ParallelInserts counts the bucket inserts sent as a step of
	// Parallel commands (MergeOptions.InsertStreams).
	ParallelInserts int
	// RollupErrors name the rollup writes that failed: those events are
	// stored but not counted (rollups count at most once).
	RollupErrors []string
	// Markers are the flush requests the merge's listing found.
	Markers []string
	// Lost are the retired collections whose tables the upstream had
	// lost, moved to their LostName.
	Lost []string
	// Upstream is the time the merge waited on the upstream, by StepKind:
	// the runner that ran its steps (the proxy's) fills it.
	Upstream map[string]stage.StepTime
	// PresenceErrors say why announcements of other proxies could not be
	// read: their staging collections wait for the next merge.
	PresenceErrors []string
	// Others are the staging collections of other proxies that still
	// take inserts (their owners freeze them), and Retired the retired
	// collections a freeze left unmerged (a guest's for the holder; the
	// holder merges them next): what a flush waits for.
	Others, Retired []string
}

// Merge is the plan of one merge of a rule's staging tier; once it is
// done, Stats says what it did. Its reply is {ok: 1} or the error that
// stopped it (what was merged before stays merged; the rest is merged by
// the next run).
type Merge struct {
	rewrite.Plan
	Stats Stats
	rule  *rules.Rule
	lim   bucket.Limits
	opts  MergeOptions
	// ids writes the rule's event-id index.
	ids *idindex.Writer
	// next is the first free seq of each key (by Key.String()) after the
	// retired collections this merge planned so far: the next one's
	// buckets go after them without probing the bucket collection again
	// (on FerretDB a probe decodes every bucket). Nobody else writes
	// buckets meanwhile: the merge runs under the rule's writer lease.
	next map[string]int
	// last is what the merge of the current retired collection left in
	// each key, for the directory (MergeOptions.Known).
	last map[string]stage.KnownKey
	// planKnown is what the directory knew of the keys of the current
	// retired collection when its merge was planned.
	planKnown map[string]stage.KnownKey
	// planProbed are the keys of that plan the merge probed and may
	// teach a directory that is never read (Known.NoRead).
	planProbed map[string]bool
	// planClosing are the keys of that plan whose window the merge saw
	// close (closingKeys) and the directory will learn so (KnownKey.Closed).
	planClosing map[string]bool
	// planColl is the bucket collection's uuid when that plan was made.
	planColl string
	// expired: loadRecords found records past the retry horizon.
	expired bool
	// keptMarkers are the markers of the retired collections merged from
	// what the proxy kept, by name (a spare keeps it).
	keptMarkers map[string]string
}

// Release ends the merge's script when its driver gives it up (see
// rewrite.ReleasePlan): its deferred unlocks then run.
func (m *Merge) Release() { rewrite.ReleasePlan(m.Plan) }

// NewMerge plans a merge of rule's staging tier.
func NewMerge(rule *rules.Rule, opts MergeOptions) *Merge {
	m := &Merge{rule: rule, opts: opts}
	m.ids = &idindex.Writer{Rule: rule, Series: opts.Series, Stale: opts.Stale, Per: m.statementsPer(),
		Lookups: func(n int) (bool, bool) { return m.host().OneScanBeats(n) }, Dropped: &m.Stats.StaleDropped}
	lim, err := bucket.LimitsOf(rule)
	if err != nil {
		m.Plan = rewrite.Fail(fmt.Errorf("merge %s: %w", rule.Namespace, err))
		return m
	}
	m.lim = lim
	m.lim.Packed = opts.PackedEvents
	m.Plan = rewrite.Script(func(x *rewrite.Exec) (rewrite.Result, error) {
		if err := m.run(x); err != nil {
			return rewrite.Result{}, err
		}
		if m.opts.DropStale {
			if err := m.dropStaleEntries(x); err != nil {
				return rewrite.Result{}, fmt.Errorf("merge %s: %w", rule.Namespace, err)
			}
		}
		return rewrite.Result{Reply: rewrite.OKReply()}, nil
	})
	return m
}

func (m *Merge) run(x *rewrite.Exec) error {
	open, retired, err := m.list(x)
	if err != nil || len(open)+len(retired) == 0 {
		return err
	}
	token := m.opts.Now.UnixMilli()
	for _, r := range retired {
		token = max(token, r.Token+1)
	}
	// Retired collections left by a merge that was cut are finished
	// first, before anything is frozen: the late documents they move
	// back to staging must be in a staging collection that this run
	// freezes after, or they would be merged twice.
	if len(retired) > 0 && !m.opts.Guest && !m.opts.FreezeOnly {
		if err := m.mergeRetired(x, retired); err != nil {
			return err
		}
		retired = nil
	}
	if m.opts.RetiredOnly {
		m.Stats.Pending = len(open)
		return nil
	}
	// Left for the holder (a guest's), or for the holder's own
	// RetiredOnly merge after its freeze.
	for _, r := range retired {
		m.Stats.Retired = append(m.Stats.Retired, r.Name)
	}
	retired = nil
	due, err := m.due(x, open)
	if err != nil {
		return err
	}
	for _, c := range due {
		name := stage.RetiredName(c.Name, token)
		if m.takenOver(c) {
			name = stage.TakenOverName(c.Name, token)
		}
		reply, ok := x.One(stage.RenameCommand(m.rule.DB, c.Name, name))
		if !ok {
			return rewrite.ErrAborted
		}
		if err := mongoerr.ReplyError(reply); err != nil {
			if mongoerr.CodeOf(err) == mongoerr.NamespaceNotFound {
				continue // merged by someone else meanwhile
			}
			return fmt.Errorf("merge %s: freeze %s: %w", m.rule.Namespace, c.Name, err)
		}
		retired = append(retired, stage.Collection{Name: name, Window: c.Window, Owner: c.Owner, Gen: c.Gen, Token: token, TakenOver: m.takenOver(c)})
		token++
	}
	m.Stats.Frozen = len(retired)
	if m.opts.Guest {
		for _, r := range retired {
			m.Stats.Retired = append(m.Stats.Retired, r.Name)
		}
		return nil
	}
	if len(retired) == 0 || m.opts.FreezeOnly {
		return nil
	}
	return m.mergeRetired(x, retired)
}

// own says whether c is a staging collection of this proxy's current
// run.
func (m *Merge) own(c stage.Collection) bool {
	return c.OwnedBy(m.opts.Self, m.opts.Since)
}

// takenOver says whether freezing c takes it over from an owner that
// stopped (an insert it began may still land: CheckLate).
func (m *Merge) takenOver(c stage.Collection) bool {
	return c.Owner != "" && !m.own(c)
}

// mergeRetired merges retired collections, then expires old records:
// first those a merge that was cut had planned, then the others, each in
// token order. A plan records the seqs its buckets take; planning
// another collection before those buckets are written would give its
// buckets the same seqs. (Proxies freeze their own staging collections
// at any time, so a collection planned by a holder that died may have a
// higher token than one frozen after.)
func (m *Merge) mergeRetired(x *rewrite.Exec, retired []stage.Collection) error {
	planned, gone := map[string]bool{}, map[string]bool{}
	for _, r := range retired {
		if len(retired) == 1 {
			break // nothing to order (and the check scans it on FerretDB)
		}
		docs, err := drainAll(x, m.rule.DB, r.Name, stage.FindCommand(m.rule.DB, r.Name, bsoncore.NewDocumentBuilder().AppendString("_id", planID).Build(), bsoncore.NewDocumentBuilder().AppendInt32("_id", 1).Build()), 0)
		if err != nil {
			if err := m.setAsideLost(x, r, lostIn(r.Name, err)); err != nil {
				return fmt.Errorf("merge %s: %s: %w", m.rule.Namespace, r.Name, err)
			}
			gone[r.Name] = true // set aside, or dropped meanwhile
			continue
		}
		planned[r.Name] = len(docs) > 0
	}
	retired = slices.DeleteFunc(retired, func(r stage.Collection) bool { return gone[r.Name] })
	slices.SortFunc(retired, func(a, b stage.Collection) int {
		if planned[a.Name] != planned[b.Name] {
			if planned[a.Name] {
				return -1
			}
			return 1
		}
		return cmpInt(a.Token, b.Token)
	})
	records, err := m.records(x)
	if err != nil {
		return err
	}
	for _, r := range retired {
		if err := m.mergeOne(x, r, records); err != nil {
			if err := m.setAsideLost(x, r, err); err != nil {
				return fmt.Errorf("merge %s: %s: %w", m.rule.Namespace, r.Name, err)
			}
		}
	}
	return m.expireRecords(x, records)
}

func cmpInt(a, b int64) int { return int(min(max(a-b, -1), 1)) }

// list finds the rule's staging and retired collections.
func (m *Merge) list(x *rewrite.Exec) (open, retired []stage.Collection, err error) {
	take := func(docs []bsoncore.Document) error {
		for _, d := range docs {
			name, _ := d.Lookup("name").StringValueOK()
			if name == m.rule.IDIndexCollection() {
				m.ids.Listed = true
			}
			if stage.IsFlushMarker(m.rule, name) {
				m.Stats.Markers = append(m.Stats.Markers, name)
			}
			if c, ok := stage.Parse(m.rule, name); ok {
				if c.Retired() {
					retired = append(retired, c)
				} else {
					open = append(open, c)
				}
			}
		}
		return nil
	}
	res, ok := x.Run(rewrite.Drain(source.ListCommand(m.rule.DB), m.rule.DB, "$cmd.listCollections", take, func() rewrite.Result { return rewrite.Result{} }))
	if !ok {
		return nil, nil, rewrite.ErrAborted
	}
	if res.Reply != nil {
		return nil, nil, fmt.Errorf("merge %s: list collections: %w", m.rule.Namespace, mongoerr.ReplyError(res.Reply))
	}
	slices.SortFunc(open, func(a, b stage.Collection) int { return cmpInt(a.Window, b.Window) })
	return open, retired, nil
}

// due picks the staging collections to freeze now: this proxy's own as
// All, AllMine or Due say; the holder's (no owner) as All or Due say, by
// the holder; a stopped proxy's, by the holder. Another proxy's that
// still runs are its own to freeze (Stats.Others).
func (m *Merge) due(x *rewrite.Exec, open []stage.Collection) ([]stage.Collection, error) {
	gone, err := m.goneOwners(x, m.othersToCheck(open))
	if err != nil {
		return nil, err
	}
	var due []stage.Collection
	for _, c := range open {
		switch {
		case m.own(c):
			if m.opts.All || m.opts.AllMine || m.host().Due(c) {
				due = append(due, c)
			} else {
				m.Stats.Pending++
			}
		case m.opts.Guest && c.Owner != "" && c.Owner == m.opts.Self:
			// A previous run's of this proxy (restarted at the same
			// address): frozen by this run, under a taken-over name, so
			// the holder looks for late documents. The holder takes over
			// only the collections of a proxy whose announcement lapsed,
			// and this run renews that same announcement: left to it,
			// they were merged by nobody while this proxy took inserts,
			// and every flush and read of the rule waited for them.
			due = append(due, c)
		case m.opts.Guest:
			// Another proxy's or the holder's: the holder's to take over.
			m.Stats.Others = append(m.Stats.Others, c.Name)
		case c.Owner == "":
			if m.opts.All || m.host().Due(c) {
				due = append(due, c)
			} else {
				m.Stats.Pending++
			}
		case c.Owner == m.opts.Self || gone[c.Owner]:
			due = append(due, c)
		default:
			m.Stats.Others = append(m.Stats.Others, c.Name)
		}
	}
	return due, nil
}

// othersToCheck are the owners of other proxies' staging collections in
// open whose announcements decide whether the holder takes them over.
func (m *Merge) othersToCheck(open []stage.Collection) []string {
	if !m.opts.TakeOver || m.opts.Guest {
		return nil
	}
	var owners []string
	for _, c := range open {
		if c.Owner != "" && c.Owner != m.opts.Self && !m.own(c) && !slices.Contains(owners, c.Owner) {
			owners = append(owners, c.Owner)
		}
	}
	return owners
}

// drainAll reads every document of find (a find command on coll), with
// getMores of batch documents (0: the upstream's default).
func drainAll(x *rewrite.Exec, db, coll string, find []byte, batch int32) ([]bsoncore.Document, error) {
	var out []bsoncore.Document
	take := func(docs []bsoncore.Document) error { out = append(out, docs...); return nil }
	res, ok := x.Run(rewrite.DrainBatched(find, db, coll, batch, take, func() rewrite.Result { return rewrite.Result{} }))
	if !ok {
		return nil, rewrite.ErrAborted
	}
	if res.Reply != nil {
		return nil, fmt.Errorf("read %s: %w", coll, mongoerr.ReplyError(res.Reply))
	}
	return out, nil
}

// seriesOf counts the distinct series among keys.
func seriesOf(keys []bucket.Key) int {
	seen := make(map[string]struct{}, len(keys))
	for _, k := range keys {
		seen[string(k.Meta)] = struct{}{}
	}
	return len(seen)
}

// dropStaleEntries deletes the stale event-id index entries waiting
// (MergeOptions.DropStale), but in a guest's merge.
func (m *Merge) dropStaleEntries(x *rewrite.Exec) error {
	if m.opts.Guest {
		return nil
	}
	return m.ids.DropStale(x)
}
