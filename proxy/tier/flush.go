package tier

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/proxy/exec"
	"github.com/tsproxy/tsproxy/proxy/tier/lease"
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/source"
	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rewrite/stage/merge"
	"github.com/tsproxy/tsproxy/rules"
)

// This file serves tsproxyFlush and the settling of a staged rule before
// a command that reads or changes its events (staged and merged by the staging
// tier).

// AllStaged is Flush's through for a flush of everything staged.
const AllStaged = math.MaxInt64

// SpareUse says what a flush does about the rule's spare staging
// collection.
type SpareUse bool

const (
	// MakeSpare: before a command, what the merge merged becomes the
	// spare that the next insert takes.
	MakeSpare SpareUse = true
	// NoSpare: tsproxyFlush, and the mending of an unrecorded index
	// (which needs the collection that holds the index dropped, not
	// renamed): no staging collection is left, spares included.
	NoSpare SpareUse = false
)

// Flush merges everything staged into rule before it began: this
// proxy freezes its own staging collections and, holding the rule's
// writer lease, merges; what is left (other proxies' collections, or all
// of it when another holds the lease) it asks for and waits for
// (requestFlush). total, when not nil, adds up what this proxy merged.
// It merges only when something staged may hold an event at or before
// through (ms; AllStaged: anything staged), and then everything. spares
// says whether it makes a spare or drops the one there is.
func (t *Tier) Flush(cl Client, rule *rules.Rule, caps caps.Upstream, total *merge.Stats, through int64, spares SpareUse) (err error) {
	defer func() {
		if err != nil {
			t.state.Failed(rule) // the metric of merges that failed
		}
	}()
	// The admin commands (those that count what they merged) settle the
	// event-id index too, with nothing staged as well: the merges before
	// reads leave its stale entries waiting.
	dropStale := total != nil
	opts := merge.MergeOptions{All: true, DropStale: dropStale}
	if spares == MakeSpare {
		// Before a read (or a delete): the collections merged become
		// spares, which the next inserts take rather than create one.
		// (Only where staging names carry their owner: SingleWriter.)
		h := t.hostOf(&opts, rule)
		h.recycle = caps.SingleWriter
		defer h.cleanRenamed()
	} else {
		defer func() {
			if err == nil {
				err = t.dropSpare(cl, rule)
			}
		}()
	}
	idle, err := t.nothingStaged(cl, rule, through)
	if err != nil || idle && !(dropStale && t.dirs.StaleWaiting(rule.BucketNamespace())) {
		return err
	}
	st, err := t.mergeStaged(cl, rule, caps, opts)
	if err != nil {
		return err
	}
	if total != nil {
		addStats(total, st)
	}
	if waitFor := append(st.Others, st.Retired...); len(waitFor) > 0 {
		return t.requestFlush(cl, rule, caps, waitFor)
	}
	return nil
}

// nothingStaged says whether rule's database lists no staging collection
// of rule, open or retired, and no flush request: then every event
// acknowledged so far is in buckets (an insert creates its staging
// collection before it is answered, and a merge drops one only after
// its buckets are written), and a flush or a read has nothing to settle.
// It spares them the writer lease, whose renewal is a write (2-3 ms on
// FerretDB/PostgreSQL): {tsproxyFlush: 1} over 40 rules, one of them
// staged, took 0.23-0.34 s instead of 0.10-0.13 s. With through before
// AllStaged, only what may hold an event at or before it counts
// (stage.WorkThrough).
func (t *Tier) nothingStaged(cl Client, rule *rules.Rule, through int64) (bool, error) {
	list, work, err := stagedWork(cl, rule)
	if err == nil && work && through != AllStaged {
		work, err = stage.WorkThrough(rule, list, through)
		if err != nil {
			err = fmt.Errorf("list the collections of %s: %w", rule.DB, err)
		}
	}
	return err == nil && !work, err
}

// stagedWork lists rule's database on r: the listing, and whether it
// holds a staging collection of rule, open or retired, or a flush
// request (stage.HasWork).
func stagedWork(r exec.Runner, rule *rules.Rule) (list []byte, work bool, err error) {
	res, err := exec.Drive(r, rewrite.Passthrough(source.ListCommand(rule.DB), nil))
	if err != nil {
		return nil, false, UpstreamFailure{Err: err}
	}
	if err := mongoerr.ReplyError(res.Reply); err != nil {
		return nil, false, fmt.Errorf("list the collections of %s: %w", rule.DB, err)
	}
	work, err = workIn(rule, res.Reply)
	if err != nil {
		return nil, false, err
	}
	return res.Reply, work, nil
}

// workIn reads from list, a listing of rule's database, whether it holds
// staged work of rule (stage.HasWork).
func workIn(rule *rules.Rule, list []byte) (bool, error) {
	work, err := stage.HasWork(rule, list)
	if err != nil {
		return false, fmt.Errorf("list the collections of %s: %w", rule.DB, err)
	}
	return work, nil
}

// dbListings shares the background rounds' listings of a database among
// its rules: each rule's merger asks whether the rule has staged work
// once a second, and a database with many rules was listed as many times
// a second (FerretDB reads its catalog for each). A listing younger than
// listingShared serves every rule of its database. The answer is a hint:
// a merge lists the collections again itself, so a listing that is a
// little old only moves a round's merge to the next round.
type dbListings struct {
	mu   sync.Mutex
	byDB map[string]dbListing
}

type dbListing struct {
	at    time.Time
	reply []byte
}

// listingShared is how long a background listing of a database serves
// its other rules' rounds.
const listingShared = 250 * time.Millisecond

func newDBListings() *dbListings {
	return &dbListings{byDB: map[string]dbListing{}}
}

// stagedWork is stagedWork (above) from a listing of rule's database
// taken within listingShared before now, or from a new one.
func (l *dbListings) stagedWork(r exec.Runner, rule *rules.Rule, now time.Time) (list []byte, work bool, err error) {
	l.mu.Lock()
	got, ok := l.byDB[rule.DB]
	l.mu.Unlock()
	if ok && now.Sub(got.at) < listingShared && !now.Before(got.at) {
		work, err := workIn(rule, got.reply)
		if err != nil {
			return nil, false, err
		}
		return got.reply, work, nil
	}
	if list, work, err = stagedWork(r, rule); err != nil {
		return nil, false, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for db, old := range l.byDB { // a dropped database's listing goes
		if now.Sub(old.at) >= listingShared {
			delete(l.byDB, db)
		}
	}
	l.byDB[rule.DB] = dbListing{at: now, reply: list}
	return list, work, nil
}

func addStats(total *merge.Stats, st merge.Stats) {
	total.Collections += st.Collections
	total.Events += st.Events
	total.Buckets += st.Buckets
	total.ToppedUp += st.ToppedUp
	total.Retries += st.Retries
	total.Late += st.Late
	total.Kept += st.Kept
	total.DirectoryReads += st.DirectoryReads
	total.KnownBuckets += st.KnownBuckets
	total.ParallelInserts += st.ParallelInserts
	total.RecordReads += st.RecordReads
	stage.AddStepTimes(&total.Upstream, st.Upstream)
}

// flushWaitLeases bounds, in lease lifetimes, how long a proxy waits for
// a flush it asked for while none of the collections it waits for is
// merged (flushPatience): a proxy that died is taken over, and a holder
// that died replaced, once its announcement or lease lapsed.
const flushWaitLeases = 3

// requestFlush asks the other proxies to freeze their staging collections
// of rule and the holder of its writer lease to merge them, and waits
// until the collections of waitFor (open or retired, listed when this
// flush began) are merged: it creates a flush request collection, which
// every proxy's background merger (one round a second at most) sees, and
// drops it when done. Meanwhile it merges now and then itself, which
// does what the holder would once it holds the lease.
func (t *Tier) requestFlush(cl Client, rule *rules.Rule, caps caps.Upstream, waitFor []string) error {
	marker := stage.FlushMarker(rule, bson.NewObjectID().Hex())
	res, err := exec.Drive(cl, rewrite.Passthrough(stage.FlushRequestCommand(rule, marker), nil))
	if err != nil {
		return UpstreamFailure{Err: err}
	}
	if err := mongoerr.ReplyError(res.Reply); err != nil {
		return fmt.Errorf("tsproxy rule %s: request a merge of the staged events: %w", rule.Namespace, err)
	}
	withdraw := func() error {
		_, err := exec.Drive(cl, rewrite.Passthrough(source.DropCommand(rule.DB, marker), nil))
		return err
	}
	wait := flushWaitLeases * t.leases.TTL()
	patience := newFlushPatience(time.Now(), wait, len(waitFor))
	for tries := 1; ; tries++ {
		names, err := t.listNames(cl, rule.DB)
		if err != nil {
			return err
		}
		waitFor = stage.Remaining(rule, names, waitFor)
		// Done; or a request for a namespace dropped meanwhile (its
		// collections dropped already, or about to be), which nobody
		// answers.
		if len(waitFor) == 0 || !t.host.RoutesRule(rule) {
			return withdraw()
		}
		patience.merged(time.Now(), len(waitFor))
		if tries%10 == 0 {
			// The holder may be gone: once its lease lapsed, this proxy
			// merges (as a guest it would only freeze its own again).
			err := t.EnsureWriter(cl, rule, caps)
			var held *lease.HeldError
			switch {
			case err == nil:
				if _, err := t.mergeStaged(cl, rule, caps, merge.MergeOptions{All: true}); err != nil {
					return err
				}
			case !errors.As(err, &held):
				return err
			}
		}
		if patience.over(time.Now()) {
			// Withdrawn, so that the proxies stop freezing for a client
			// that gave up (a failed drop is logged: the holder drops
			// requests older than staleFlushRequest).
			if err := withdraw(); err != nil {
				t.log.Warn("staging: a flush request was left", "rule", rule.Namespace, "request", marker, "err", err.Error())
			}
			return mongoerr.Errorf(mongoerr.ConflictingOperationInProgress, "tsproxy rule %s: staged events not merged: %s (still staged: %s)", rule.Namespace, patience.reason(), strings.Join(waitFor, ", "))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// flushPatience is how long a flush waits for the collections it listed
// to be merged: wait from its start, and wait again from each time one
// more of them is merged, so that a holder merging much on a loaded
// machine (a dead proxy's staging just taken over) is waited for and
// only one that merges nothing is given up on; never past
// staleFlushRequest less wait from its start, before the holder drops
// the request.
type flushPatience struct {
	wait     time.Duration
	start    time.Time
	last     time.Time // the latest deadline progress may earn
	deadline time.Time
	left     int // collections not merged yet
}

func newFlushPatience(start time.Time, wait time.Duration, left int) *flushPatience {
	return &flushPatience{wait: wait, start: start, last: start.Add(staleFlushRequest - wait), deadline: start.Add(wait), left: left}
}

// merged notes that left collections remain at now.
func (p *flushPatience) merged(now time.Time, left int) {
	if left >= p.left {
		return
	}
	p.left = left
	next := now.Add(p.wait)
	if next.After(p.last) {
		next = p.last
	}
	if next.After(p.deadline) {
		p.deadline = next
	}
}

// over says whether the flush gives up at now.
func (p *flushPatience) over(now time.Time) bool { return now.After(p.deadline) }

// reason says why a flush that is over gave up.
func (p *flushPatience) reason() string {
	if p.deadline.Equal(p.last) && p.last.After(p.start.Add(p.wait)) {
		return fmt.Sprintf("some of their collections merged, not all within %s", p.last.Sub(p.start))
	}
	return fmt.Sprintf("none of their collections merged in %s", p.wait)
}

// listNames lists db's collection names on the client's connection.
func (t *Tier) listNames(cl Client, db string) ([]string, error) {
	list := source.ListNames(db)
	res, err := exec.Drive(cl, list)
	if err != nil {
		return nil, UpstreamFailure{Err: err}
	}
	if res.Reply != nil {
		return nil, fmt.Errorf("list the collections of %s: %w", db, mongoerr.ReplyError(res.Reply))
	}
	return list.Names(), nil
}
