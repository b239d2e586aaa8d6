package stage

import (
	"bytes"
	"fmt"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/source"
	"github.com/tsproxy/tsproxy/rules"
)

// MergeOptions say what one merge takes.
type MergeOptions struct {
	// All merges every staging collection (a flush). Otherwise only the
	// retired ones (an earlier merge was cut, or a freeze ran) and those
	// Due says.
	All bool
	// FreezeOnly freezes (renames) the staging collections to merge and
	// merges nothing: the caller holds off its own inserts into the rule
	// while a freeze runs, and merges the retired collections before and
	// after it with RetiredOnly (see the package comment).
	FreezeOnly bool
	// RetiredOnly merges the retired collections and freezes nothing.
	// With neither option a merge does both: the retired collections
	// left before, the freeze, what it froze.
	RetiredOnly bool
	// Due says whether staging collection c is due for merging (it took
	// nothing new for long enough, or holds enough). Nil: none is. The
	// merge does not count staged documents to decide: a count decodes
	// every document on FerretDB, and the caller knows what it staged.
	Due func(c Collection) bool
	// CheckLate looks for documents that reached a retired collection
	// after the merge read it, and moves them back to staging (see
	// moveLate). Only an upstream whose rename changes nothing but its
	// catalog (FerretDB) can take such documents, and only from another
	// proxy's insert that began before this one held the rule's writer
	// lease; the caller knows when that may be.
	CheckLate bool
	// Now is the time of the merge: its tokens and its records.
	Now time.Time
	// RetryHorizon is how long the records of merged retryable writes
	// are kept: a driver's retry arriving later than that is not
	// recognised once its first attempt was merged.
	RetryHorizon time.Duration

	// Self and Since name the merging proxy: its Stager tag and the
	// first generation of its current run. Its own staging collections
	// of this run are frozen as All, AllMine or Due say; those of its
	// tag and an older generation are a previous run's, which stopped:
	// taken over.
	Self  string
	Since int64
	// AllMine freezes every staging collection of this proxy's own,
	// whatever Due says (another proxy asked for a flush).
	AllMine bool
	// Guest: the proxy does not hold the rule's writer lease. It freezes
	// only its own staging collections, and merges nothing: the holder
	// merges what is retired. The zero value is the holder's merge.
	Guest bool
	// Gone says whether the proxy tagged owner stopped (its presence
	// lapsed): the holder then takes its staging collections over. Nil:
	// none has.
	Gone func(owner string) bool
	// RollupStatements bounds the statements of one rollup update, and of
	// one update of topped-up buckets
	// (caps.Upstream.MaxUpdateStatements; 0: rollup's default).
	RollupStatements int
	// PackedEvents: the buckets written keep their events packed
	// (caps.Upstream.PackedEvents).
	PackedEvents bool
	// TopUp fills each key's last bucket, when it has room, before new
	// buckets are started (topup.go). Only where deletes of the rule run
	// under its writer lease, as the merge does (FerretDB).
	TopUp bool
	// Lock locks bucket keys as a delete locks them, for a top-up's read
	// and rewrite of a bucket; the returned func unlocks them. Nil:
	// nothing to lock (no concurrent delete on this proxy).
	Lock func(keys []bucket.Key) func()
	// OneScanBeats says whether one find of n buckets by {_id: {$in}}
	// costs less than n lookups by _id (read.IDLookupCost.OneScanBeats):
	// how a counter or slots merge reads the buckets it writes. Nil: the
	// lookups.
	OneScanBeats func(n int) bool
	// Shells claims the preallocated shells of a slots rule not tried yet
	// among keys (rewrite/layout's ShellsAfter); nil: none are written.
	Shells func(keys []bucket.Key) []bucket.Key
	// Kept gives, once, what this proxy kept of its inserts into the
	// staging collection that retired collection r was frozen from: the
	// staged documents, and the _id of the marker document that proves r
	// is where they went (kept.go). ok is false when it kept nothing
	// whole. Asked only for this proxy's own collections of this run. Nil:
	// every retired collection is read back.
	Kept func(r Collection) (docs [][]byte, marker string, ok bool)
	// Known is the proxy's directory of the rule's buckets, which the
	// events merges use instead of asking the upstream, for where
	// lookups by _id scan the bucket collection: the merge reads every
	// bucket's key once (one scan) when the directory has not, rather
	// than probing merge after merge (directory.go). Nil: they ask. Only
	// with TopUp: its key locks order the directory's checks against
	// deletes.
	Known *Known
	// Records keeps the records of merged retryable writes between
	// merges (RecordCache). Nil: each merge reads them.
	Records *RecordCache
	// Stale keeps the event-id index entries that top-ups left stale
	// until enough wait to delete them in one command (stale.go). Nil:
	// each merge deletes its own.
	Stale *StaleEntries
	// DropStale deletes every stale entry Stale keeps at the end of the
	// merge: a flush settles the event-id index too.
	DropStale bool
	// Recycle, when set, names the spare collection that retired
	// collection r becomes once merged, rather than being dropped
	// (spare.go): asked only for a collection of this proxy's run that
	// the merge read from what the proxy kept. made is called with
	// whether r became the spare, and its marker's _id. ok false: r is
	// dropped. The proxy asks for spares in its merges before reads.
	Recycle func(r Collection) (spare string, made func(ok bool, marker string), ok bool)
	// InsertStreams is how many insert commands, run at once, a merge's
	// buckets are split into when they are large (parallelInsertBytes):
	// FerretDB encodes every document, and on PostgreSQL a second
	// connection takes a second core (rewrite.Upstream.Parallel). 0 or
	// 1: one command at a time.
	InsertStreams int
}

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
	Counted int // events counted into the rule's rollups
	Kept    int // retired collections merged from what the proxy kept, not read back (kept.go)
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
	// (MergeOptions.Recycle).
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
	// lost, moved to their LostName (lost.go).
	Lost []string
	// Upstream is the time the merge waited on the upstream, by StepKind:
	// the runner that ran its steps (the proxy's) fills it.
	Upstream map[string]StepTime
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
	// idIndexListed: the rule's event-id index collection existed when
	// the merge listed the collections (see writeIDIndex).
	idIndexListed bool
	// next is the first free seq of each key (by Key.String()) after the
	// retired collections this merge planned so far: the next one's
	// buckets go after them without probing the bucket collection again
	// (on FerretDB a probe decodes every bucket). Nobody else writes
	// buckets meanwhile: the merge runs under the rule's writer lease.
	next map[string]int
	// last is what the merge of the current retired collection left in
	// each key, for the directory (MergeOptions.Known).
	last map[string]KnownKey
	// planKnown is what the directory knew of the keys of the current
	// retired collection when its merge was planned.
	planKnown map[string]KnownKey
	// planColl is the bucket collection's uuid when that plan was made.
	planColl string
	// expired: loadRecords found records past the retry horizon.
	expired bool
	// keptMarkers are the markers of the retired collections merged from
	// what the proxy kept, by name (a spare keeps it: spare.go).
	keptMarkers map[string]string
}

// Release ends the merge's script when its driver gives it up (see
// rewrite.ReleasePlan): its deferred unlocks then run.
func (m *Merge) Release() { rewrite.ReleasePlan(m.Plan) }

// NewMerge plans a merge of rule's staging tier.
func NewMerge(rule *rules.Rule, opts MergeOptions) *Merge {
	m := &Merge{rule: rule, opts: opts}
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
	due, err := m.due(open)
	if err != nil {
		return err
	}
	for _, c := range due {
		name := RetiredName(c.Name, token)
		if m.takenOver(c) {
			name = TakenOverName(c.Name, token)
		}
		reply, ok := x.One(renameCommand(m.rule.DB, c.Name, name))
		if !ok {
			return rewrite.ErrAborted
		}
		if err := mongoerr.ReplyError(reply); err != nil {
			if mongoerr.CodeOf(err) == mongoerr.NamespaceNotFound {
				continue // merged by someone else meanwhile
			}
			return fmt.Errorf("merge %s: freeze %s: %w", m.rule.Namespace, c.Name, err)
		}
		retired = append(retired, Collection{Name: name, Window: c.Window, Owner: c.Owner, Gen: c.Gen, Token: token, TakenOver: m.takenOver(c)})
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
func (m *Merge) own(c Collection) bool {
	return c.OwnedBy(m.opts.Self, m.opts.Since)
}

// takenOver says whether freezing c takes it over from an owner that
// stopped (an insert it began may still land: CheckLate).
func (m *Merge) takenOver(c Collection) bool {
	return c.Owner != "" && !m.own(c)
}

// mergeRetired merges retired collections, then expires old records:
// first those a merge that was cut had planned, then the others, each in
// token order. A plan records the seqs its buckets take; planning
// another collection before those buckets are written would give its
// buckets the same seqs. (Proxies freeze their own staging collections
// at any time, so a collection planned by a holder that died may have a
// higher token than one frozen after.)
func (m *Merge) mergeRetired(x *rewrite.Exec, retired []Collection) error {
	planned, gone := map[string]bool{}, map[string]bool{}
	for _, r := range retired {
		if len(retired) == 1 {
			break // nothing to order (and the check scans it on FerretDB)
		}
		docs, err := drainAll(x, m.rule.DB, r.Name, findCommand(m.rule.DB, r.Name, bsoncore.NewDocumentBuilder().AppendString("_id", planID).Build(), bsoncore.NewDocumentBuilder().AppendInt32("_id", 1).Build()), 0)
		if err != nil {
			if err := m.setAsideLost(x, r, lostIn(r.Name, err)); err != nil {
				return fmt.Errorf("merge %s: %s: %w", m.rule.Namespace, r.Name, err)
			}
			gone[r.Name] = true // set aside, or dropped meanwhile
			continue
		}
		planned[r.Name] = len(docs) > 0
	}
	retired = slices.DeleteFunc(retired, func(r Collection) bool { return gone[r.Name] })
	slices.SortFunc(retired, func(a, b Collection) int {
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
func (m *Merge) list(x *rewrite.Exec) (open, retired []Collection, err error) {
	take := func(docs []bsoncore.Document) error {
		for _, d := range docs {
			name, _ := d.Lookup("name").StringValueOK()
			if name == m.rule.IDIndexCollection() {
				m.idIndexListed = true
			}
			if IsFlushMarker(m.rule, name) {
				m.Stats.Markers = append(m.Stats.Markers, name)
			}
			if c, ok := Parse(m.rule, name); ok {
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
	slices.SortFunc(open, func(a, b Collection) int { return cmpInt(a.Window, b.Window) })
	return open, retired, nil
}

// due picks the staging collections to freeze now: this proxy's own as
// All, AllMine or Due say; the holder's (no owner) as All or Due say, by
// the holder; a stopped proxy's, by the holder. Another proxy's that
// still runs are its own to freeze (Stats.Others).
func (m *Merge) due(open []Collection) ([]Collection, error) {
	var due []Collection
	for _, c := range open {
		switch {
		case m.own(c):
			if m.opts.All || m.opts.AllMine || m.opts.Due != nil && m.opts.Due(c) {
				due = append(due, c)
			} else {
				m.Stats.Pending++
			}
		case m.opts.Guest:
			// Another proxy's, the holder's, or a previous run's of this
			// one: the holder's to take over.
			m.Stats.Others = append(m.Stats.Others, c.Name)
		case c.Owner == "":
			if m.opts.All || m.opts.Due != nil && m.opts.Due(c) {
				due = append(due, c)
			} else {
				m.Stats.Pending++
			}
		case c.Owner == m.opts.Self || m.opts.Gone != nil && m.opts.Gone(c.Owner):
			due = append(due, c)
		default:
			m.Stats.Others = append(m.Stats.Others, c.Name)
		}
	}
	return due, nil
}

// countCommand counts db.coll's documents.
func countCommand(db, coll string) []byte {
	return bsoncore.NewDocumentBuilder().AppendString("count", coll).AppendString("$db", db).Build()
}

// renameCommand renames db.from to db.to (never over an existing one).
func renameCommand(db, from, to string) []byte {
	return bsoncore.NewDocumentBuilder().AppendString("renameCollection", db+"."+from).
		AppendString("to", db+"."+to).AppendBoolean("dropTarget", false).AppendString("$db", "admin").Build()
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

// findCommand finds filter's documents of coll (projection may be nil).
func findCommand(db, coll string, filter, projection bsoncore.Document) []byte {
	return findProjected(db, coll, filter, projection, 10_000)
}

// findBatched is findCommand of whole documents, batchSize at a time.
func findBatched(db, coll string, filter bsoncore.Document, batchSize int32) []byte {
	return findProjected(db, coll, filter, nil, batchSize)
}

func findProjected(db, coll string, filter, projection bsoncore.Document, batchSize int32) []byte {
	b := bsoncore.NewDocumentBuilder().AppendString("find", coll)
	if filter != nil {
		b.AppendDocument("filter", filter)
	}
	if projection != nil {
		b.AppendDocument("projection", projection)
	}
	return b.AppendInt32("batchSize", batchSize).AppendString("$db", db).Build()
}

// idsIn is the filter {_id: {$in: ids}}.
func idsIn(ids []bson.ObjectID) bsoncore.Document {
	arr := bsoncore.NewArrayBuilder()
	for _, id := range ids {
		arr.AppendObjectID(id)
	}
	in := bsoncore.NewDocumentBuilder().AppendArray("$in", arr.Build()).Build()
	return bsoncore.NewDocumentBuilder().AppendDocument("_id", in).Build()
}

// idOf reads a document's ObjectID _id; ok is false for another type.
func idOf(d bsoncore.Document) (bson.ObjectID, bool) {
	return d.Lookup("_id").ObjectIDOK()
}

// sortByID orders documents by their _id's bytes: the order a merge
// reads staged documents in, the same on every run.
func sortByID(docs []bsoncore.Document) {
	slices.SortStableFunc(docs, func(a, b bsoncore.Document) int {
		return bytes.Compare(a.Lookup("_id").Data, b.Lookup("_id").Data)
	})
}

// seriesOf counts the distinct series among keys.
func seriesOf(keys []bucket.Key) int {
	seen := make(map[string]struct{}, len(keys))
	for _, k := range keys {
		seen[string(k.Meta)] = struct{}{}
	}
	return len(seen)
}
