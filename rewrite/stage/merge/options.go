package merge

import (
	"time"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/stage"
)

// MergeOptions say what one merge takes.
type MergeOptions struct {
	// All merges every staging collection (a flush). Otherwise only the
	// retired ones (an earlier merge was cut, or a freeze ran) and those
	// Host.Due says.
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
	// Host answers what the merge asks of the proxy running it (which
	// staging collections are due, locks, what it kept, spares). Nil:
	// NoHost.
	Host Host
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
	// of this run are frozen as All, AllMine or Host.Due say; those of its
	// tag and an older generation are a previous run's, which stopped:
	// taken over.
	Self  string
	Since int64
	// AllMine freezes every staging collection of this proxy's own,
	// whatever Host.Due says (another proxy asked for a flush).
	AllMine bool
	// Guest: the proxy does not hold the rule's writer lease. It freezes
	// only its own staging collections, and merges nothing: the holder
	// merges what is retired. The zero value is the holder's merge.
	Guest bool
	// TakeOver: the holder takes over the staging collections of the
	// proxies whose announcements lapsed (PresenceID); it reads them
	// once a merge, for the owners of the collections it lists.
	TakeOver bool
	// RollupStatements bounds the statements of one rollup update, and of
	// one update of topped-up buckets
	// (caps.Upstream.MaxUpdateStatements; 0: rollup's default).
	RollupStatements int
	// PackedEvents: the buckets written keep their events packed
	// (caps.Upstream.PackedEvents).
	PackedEvents bool
	// TopUp fills each key's last bucket, when it has room, before new
	// buckets are started. Only where deletes of the rule run
	// under its writer lease, as the merge does (FerretDB).
	TopUp bool
	// TopUpFloor: a last bucket holding fewer events than this is topped
	// up however few events the merge adds to it; a fuller one only when
	// it holds at most topUpRatio times what the merge adds.
	// 0: DefaultTopUpFloor.
	TopUpFloor int
	// Known is the proxy's directory of the rule's buckets, which the
	// events merges use instead of asking the upstream, for where
	// lookups by _id scan the bucket collection: the merge reads every
	// bucket's key once (one scan) when the directory has not, rather
	// than probing merge after merge. Nil: they ask. Only
	// with TopUp: its key locks order the directory's checks against
	// deletes.
	Known *stage.Known
	// Records keeps the records of merged retryable writes between
	// merges (RecordCache). Nil: each merge reads them.
	Records *stage.RecordCache
	// Stale keeps the event-id index entries that top-ups left stale
	// until enough wait to delete them in one command. Nil:
	// each merge deletes its own.
	Stale *stage.StaleEntries
	// Series keeps what this term's merges wrote of the event-id index's
	// series entries, so a merge widens only those its windows fall
	// outside of. Nil: each merge widens the entries of all its keys.
	Series *stage.SeriesSeen
	// DropStale deletes every stale entry Stale keeps at the end of the
	// merge: a flush settles the event-id index too.
	DropStale bool
	// InsertStreams is how many insert commands, run at once, a merge's
	// buckets are split into when they are large (parallelInsertBytes):
	// FerretDB encodes every document, and on PostgreSQL a second
	// connection takes a second core (rewrite.Upstream.Parallel). 0 or
	// 1: one command at a time.
	InsertStreams int
}

// Host is what a merge asks of the proxy that runs it, between its
// steps. Its answers come from the proxy's memory, never from I/O: the
// merge's I/O is its own steps, which the caller's runner runs. Embed
// NoHost for the defaults of what a host does not keep.
type Host interface {
	// Due says whether staging collection c is due for merging (it took
	// nothing new for long enough, or holds enough). The merge does not
	// count staged documents to decide: a count decodes every document
	// on FerretDB, and the proxy knows what it staged.
	Due(c stage.Collection) bool
	// LockBuckets locks bucket keys as a delete locks them, for a
	// top-up's read and rewrite of a bucket, until unlock.
	LockBuckets(keys []bucket.Key) (unlock func())
	// OneScanBeats says whether one find of n buckets by {_id: {$in}}
	// costs less than n lookups by _id (read.IDLookupCost.OneScanBeats):
	// how a merge reads the buckets it writes. known false: not
	// measured, and a counter or slots merge looks them up.
	OneScanBeats(n int) (beats, known bool)
	// ClaimShells claims the preallocated shells of a slots rule not
	// tried yet among keys (rewrite/layout's ShellsAfter).
	ClaimShells(keys []bucket.Key) []bucket.Key
	// TakeKept gives, once, what the proxy kept of its inserts into the
	// staging collection that retired collection r was frozen from: the
	// staged documents, and the _id of the marker document that proves
	// r is where they went. ok is false when it kept nothing whole (r is
	// read back). Asked only for the proxy's own collections of this
	// run.
	TakeKept(r stage.Collection) (docs [][]byte, marker string, ok bool)
	// ReserveSpare names the spare collection that retired collection r
	// becomes once merged, rather than being dropped (ok false: r is
	// dropped). Asked only for a collection the merge read from what the
	// proxy kept; SpareRenamed then says whether r became it.
	ReserveSpare(r stage.Collection) (spare string, ok bool)
	// SpareRenamed says whether a collection became spare, with its
	// marker's _id.
	SpareRenamed(spare string, ok bool, marker string)
}

// NoHost is a host that keeps nothing: no collection is due, nothing is
// locked, kept or recycled, no shell claimed, lookup costs unknown.
type NoHost struct{}

func (NoHost) Due(stage.Collection) bool                          { return false }
func (NoHost) LockBuckets([]bucket.Key) func()                    { return func() {} }
func (NoHost) OneScanBeats(int) (beats, known bool)               { return false, false }
func (NoHost) ClaimShells([]bucket.Key) []bucket.Key              { return nil }
func (NoHost) TakeKept(stage.Collection) ([][]byte, string, bool) { return nil, "", false }
func (NoHost) ReserveSpare(stage.Collection) (string, bool)       { return "", false }
func (NoHost) SpareRenamed(string, bool, string)                  {}
