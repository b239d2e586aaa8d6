package tier

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tsproxy/tsproxy/proxy/exec"
	"github.com/tsproxy/tsproxy/proxy/tier/lease"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/read"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/upstream"
)

// Host is what the staging tier asks of the proxy it runs in: the
// upstream's abilities, the rule set, the one-time index step, and the
// direct path's state of the buckets a merge rewrites.
type Host interface {
	// CapsOn is what the upstream supports, detected on up once.
	CapsOn(up *upstream.Conn) (caps.Upstream, error)
	// RoutesRule says whether rule is still routed (a created collection
	// being dropped is not).
	RoutesRule(rule *rules.Rule) bool
	// ServedHere says whether this proxy served a command on rule's
	// namespace (its merger then runs at full pace).
	ServedHere(rule *rules.Rule) bool
	// EnsureBucketIndex makes rule's bucket index once, on r.
	EnsureBucketIndex(r exec.Runner, rule *rules.Rule, caps caps.Upstream) error
	// IDLookupCost is what a find by _id on rule's buckets costs.
	IDLookupCost(up lease.Commander, rule *rules.Rule, caps caps.Upstream) read.IDLookupCost
	// LockBuckets locks keys of bucketNS against the direct path's
	// writers; the func unlocks them, its fills forgotten.
	LockBuckets(bucketNS string, keys []bucket.Key) func()
	// ClaimShells returns the keys of keys whose bucket shells were not
	// tried yet, and marks them tried.
	ClaimShells(bucketNS string, keys []bucket.Key) []bucket.Key
}

// Client is the connection a tier operation for a client runs on: its
// steps go to the client's upstream connection, with its privileges.
type Client interface {
	exec.Runner
	// Upstream is the client's upstream connection (for leases).
	Upstream() *upstream.Conn
}

// Config is what a Tier is made of.
type Config struct {
	Host   Host
	Log    *slog.Logger
	Leases *lease.Set
	// Presence is this proxy's announcements that it stages.
	Presence *lease.Presence
	// Helpers are the connections of merges' parallel inserts; Background
	// those of the background rounds.
	Helpers, Background *exec.Pool
	// StagedMemory bounds what staged inserts keep for their merge (0:
	// rules.DefaultStagedMemory; negative: nothing kept).
	StagedMemory int64
	// DropOrphanedTable, when set, drops a table the upstream's catalog
	// does not name (the embedded upstream's mend; proxy.Options).
	DropOrphanedTable func(ctx context.Context, db, table string) (bool, error)
}

// Tier is one proxy's staging tier: staged inserts, the settling of a
// rule before a command, flushes, and the background merges, with the
// state they share.
type Tier struct {
	host       Host
	log        *slog.Logger
	state      *State
	dirs       *Directories
	leases     *lease.Set
	presence   *lease.Presence
	helpers    *exec.Pool
	background *exec.Pool
	kept       *keptStore        // what staged inserts stored, for their merge; nil: nothing kept
	spares     *spareCollections // spare staging collections, made by merges before reads
	listings   *dbListings       // the merge rounds' listings, shared by a database's rules
	formats    *stagingFormats   // the staged rules' format records, as last read
	combiner   combiner          // staged inserts sharing upstream inserts
	arrival    arrivalClock      // staged slots writes in arrival order
	dropOrphan func(ctx context.Context, db, table string) (bool, error)
	// since is the first generation of this proxy's own staging
	// collections (when it started, in ms).
	since     int64
	tag       atomic.Pointer[stagerTagOf] // StagerTag's last answer
	orphanLog sync.Map                    // namespace → time.Time: the last warning of an unrecorded index
}

// New makes the staging tier of one proxy.
func New(cfg Config) *Tier {
	memory := cfg.StagedMemory
	if memory == 0 {
		memory = rules.DefaultStagedMemory
	}
	return &Tier{
		host:       cfg.Host,
		log:        cfg.Log,
		state:      NewState(),
		dirs:       NewDirectories(),
		leases:     cfg.Leases,
		presence:   cfg.Presence,
		helpers:    cfg.Helpers,
		background: cfg.Background,
		kept:       newKeptStore(memory),
		spares:     newSpareCollections(),
		listings:   newDBListings(),
		formats:    newStagingFormats(),
		dropOrphan: cfg.DropOrphanedTable,
		since:      time.Now().UnixMilli(),
	}
}

// State is the tier's per-rule state (locks, generations, figures).
func (t *Tier) State() *State { return t.state }

// Directories is what the merges know of their rules' buckets.
func (t *Tier) Directories() *Directories { return t.dirs }

// Close closes the connections of the merges' parallel inserts.
func (t *Tier) Close() { t.helpers.Close() }

// Keeps says whether staged inserts keep what they stored for their
// merge (RunKept).
func (t *Tier) Keeps() bool { return t.kept != nil }

// Stamp is the next arrival stamp of a staged insert
// (stage.InsertEnv.Stamp): the last write of a slot wins.
func (t *Tier) Stamp() int64 { return t.arrival.next() }

// Since is the first generation of this proxy's own staging collections
// (when it started, in ms).
func (t *Tier) Since() int64 { return t.since }
