package engine

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/proxy/abilities"
	"github.com/tsproxy/tsproxy/proxy/catalog"
	"github.com/tsproxy/tsproxy/proxy/cursors"
	"github.com/tsproxy/tsproxy/proxy/exec"
	"github.com/tsproxy/tsproxy/proxy/fills"
	"github.com/tsproxy/tsproxy/proxy/loops"
	"github.com/tsproxy/tsproxy/proxy/replycache"
	"github.com/tsproxy/tsproxy/proxy/retention"
	"github.com/tsproxy/tsproxy/proxy/telemetry"
	"github.com/tsproxy/tsproxy/proxy/tier"
	"github.com/tsproxy/tsproxy/proxy/tier/lease"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/upstream"
	"github.com/tsproxy/tsproxy/wire"
)

// Options configures a proxy (proxy.Options): the front door reads its
// listener and frame settings, the Engine the rest.
type Options struct {
	// Dialer opens the upstream connection of each client connection.
	Dialer *upstream.Dialer
	// Rules says which namespaces are bucketed; nil means none.
	Rules *rules.Set
	// TLS, when non-nil, is required of every client.
	TLS *tls.Config
	// MaxConnections bounds concurrent client connections (0: 10000).
	MaxConnections int
	// MaxMessageBytes bounds one client message (0: 48,000,000).
	MaxMessageBytes int
	// FrameTimeout bounds a client frame's arrival once its first byte
	// came, and a TLS handshake; WriteTimeout the write of a reply (0:
	// 2 minutes each: a 48 MB frame over a 400 KB/s link). An idle client
	// is never timed out.
	FrameTimeout, WriteTimeout time.Duration
	// ClientWatchAfter is how long a request runs before the proxy
	// watches for its client leaving, to end the request's wait on the
	// upstream (0: 1s).
	ClientWatchAfter time.Duration
	// MaxCursors bounds the cursor registry of rewritten reads (0: 100000).
	MaxCursors int
	// AggregateMemory bounds each blocking stage of an aggregation the
	// proxy runs itself (0: 100 MiB).
	AggregateMemory int
	// StagedMemory bounds the bytes of staged documents the proxy keeps
	// to merge its staging collections without reading them back
	// (0: 64 MiB; negative: none).
	StagedMemory int64
	// CursorTTL forgets registered cursors idle this long (0: 10m).
	CursorTTL time.Duration
	// RetryCacheSize bounds the sessions whose last retryable rewritten
	// write the proxy remembers, to answer a driver's retry with its reply
	// (0: 100,000).
	RetryCacheSize int
	// RetryCacheTTL forgets such a record after this long (0: 30m).
	RetryCacheTTL time.Duration
	// Logger receives structured logs; slog.Default() when nil.
	Logger *slog.Logger
	// Tracing makes a span per command; off by default because a span per
	// command costs microseconds the proxy otherwise does not spend.
	Tracing bool
	// IndexIDs, when set, is called once for each bucket collection after
	// the proxy created its index; the embedded upstream uses it to make
	// point reads and updates by _id index lookups (see
	// upstream.Embedded.IndexIDs). Other upstreams need nothing.
	IndexIDs func(ctx context.Context, db, coll string) error
	// DropOrphanedTable, when set, drops table from db's storage if the
	// upstream's catalog names no collection stored there, and says
	// whether it did: the embedded upstream's mend for a collection whose
	// create a crash cut after its table (upstream.Embedded.
	// DropOrphanedTable), which no create of that name gets past. Merges
	// use it. Other upstreams offer none.
	DropOrphanedTable func(ctx context.Context, db, table string) (bool, error)
	// WriterLease is how long a writer lease lasts without renewal, on
	// upstreams whose updates are not isolated (0: 30s).
	WriterLease time.Duration
	// WriterID names this proxy in writer leases; empty means its host and
	// listen address.
	WriterID string
	// CreateTimeseries says who serves a create with the timeseries option
	// on a namespace without a rule: rules.CreateTimeseriesAuto (""), ...Proxy
	// or ...Upstream (see rules.Config.CreateTimeseries).
	CreateTimeseries string
	// CatalogLease is how old a catalog snapshot may be when the proxy
	// routes by it (0: catalog.DefaultLease).
	CatalogLease time.Duration
	// CatalogTimeout bounds one read or write of the catalog on its
	// connection (0: catalog.DefaultTimeout).
	CatalogTimeout time.Duration
}

// Engine is what a proxy's connections share: the upstream's abilities,
// the rules and the catalog, the cursor registry, the reply cache, the
// staging tier, the writer leases and the background loops. It holds no
// listener: the front door (package proxy) accepts connections and gives
// each a handler.Conn (handler.NewConn).
type Engine struct {
	Opts Options
	log  *slog.Logger
	Tel  *telemetry.Instruments
	// stopMetrics ends the staging figures' reports on the global meter.
	stopMetrics func() error
	Abilities   *abilities.Upstream // what the upstream can do, learned once
	Fills       *fills.Cache        // the open buckets' fills
	Cursors     *cursors.Registry
	Replies     *replycache.Cache
	Life        *lifecycleState
	retention   *retention.Retainer
	loops       *loops.Loops // the rules' background loops, from Start to Stop
	Leases      *lease.Set   // writer leases (package lease)
	tier        *tier.Tier
	Merges      *tier.State // tier.State(), used on every staged insert
	Once        *onceSteps
	Shells      *shellMemory
	Writes      *writeIDs
	// idIndexOff: bucket namespace -> the writer-lease term (its start;
	// zero without leases) in which this proxy stopped the event-id
	// index before writing directly.
	IdIndexOff sync.Map
	// JournalSettled: bucket namespace -> the writer-lease term (its
	// start) in which this proxy finished the update journal's pending
	// records (handler settleJournal).
	JournalSettled sync.Map
	IdIndexes      *idIndexCache
	Cat            *catalog.Catalog
	served         sync.Map   // namespace → struct{}: created rules served here
	background     *exec.Pool // connections of the background loops' rounds
	// ServiceID names this proxy to drivers in load-balanced mode: one per
	// process, as a mongos behind a balancer has.
	ServiceID bson.ObjectID

	Closing atomic.Bool
}

// NewEngine checks opts, sets its defaults, and returns an Engine ready
// to Start.
func New(opts Options, commands []string) (*Engine, error) {
	if opts.Dialer == nil {
		return nil, errors.New("proxy: Options.Dialer is required")
	}
	if opts.Rules == nil {
		opts.Rules = rules.NewSet(nil)
	}
	if opts.MaxConnections <= 0 {
		opts.MaxConnections = rules.DefaultMaxConnections
	}
	if opts.MaxMessageBytes <= 0 || opts.MaxMessageBytes > wire.MaxMsgLen {
		opts.MaxMessageBytes = wire.MaxMsgLen
	}
	if opts.FrameTimeout <= 0 {
		opts.FrameTimeout = rules.DefaultFrameTimeout
	}
	if opts.WriteTimeout <= 0 {
		opts.WriteTimeout = rules.DefaultWriteTimeout
	}
	if opts.ClientWatchAfter <= 0 {
		opts.ClientWatchAfter = time.Second
	}
	if opts.MaxCursors <= 0 {
		opts.MaxCursors = rules.DefaultMaxCursors
	}
	if opts.CursorTTL <= 0 {
		opts.CursorTTL = rules.DefaultCursorTTL
	}
	if opts.RetryCacheSize <= 0 {
		opts.RetryCacheSize = replycache.DefaultSize
	}
	if opts.RetryCacheTTL <= 0 {
		opts.RetryCacheTTL = replycache.DefaultTTL
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	tel, err := telemetry.New(opts.Tracing, commands)
	if err != nil {
		return nil, fmt.Errorf("proxy: telemetry: %w", err)
	}
	s := &Engine{
		Opts:       opts,
		log:        opts.Logger,
		Tel:        tel,
		Fills:      fills.New(fills.DefaultSize),
		Cursors:    cursors.New(opts.MaxCursors, opts.CursorTTL),
		Replies:    replycache.New(opts.RetryCacheSize, opts.RetryCacheTTL),
		Life:       newLifecycleState(),
		Leases:     lease.NewSet(opts.WriterLease, opts.WriterID),
		Once:       newOnceSteps(),
		Shells:     newShellMemory(),
		Writes:     NewWriteIDs(time.Now()),
		IdIndexes:  NewIDIndexCache(),
		ServiceID:  bson.NewObjectID(),
		background: exec.NewPool(opts.Dialer.Dial, backgroundMaxIdle),
	}
	s.Abilities = abilities.New(s.background, s.log, opts.IndexIDs != nil)
	s.tier = tier.New(tier.Config{Host: tierHost{s}, Log: s.log, Leases: s.Leases, Presence: lease.NewPresence(opts.WriterLease),
		Helpers: exec.NewPool(opts.Dialer.Dial, exec.HelperMaxIdle), Background: s.background,
		StagedMemory: opts.StagedMemory, DropOrphanedTable: opts.DropOrphanedTable})
	s.Merges = s.tier.State()
	s.retention = retention.New(retentionHost{s}, s.log)
	s.loops = s.newLoops()
	s.Cat = catalog.New(catalog.Config{Pool: s.background, Log: s.log, Rules: opts.Rules, OnRules: s.syncLoops,
		Lease: opts.CatalogLease, Timeout: opts.CatalogTimeout, Mode: opts.CreateTimeseries})
	stop, err := telemetry.ObserveStaging(s.Merges.Snapshot)
	if err != nil {
		return nil, fmt.Errorf("proxy: telemetry: %w", err)
	}
	s.stopMetrics = stop
	return s, nil
}

// Options is the engine's options, with their defaults set.
func (s *Engine) Options() Options { return s.Opts }

// Telemetry is the proxy's metrics and spans.
func (s *Engine) Telemetry() *telemetry.Instruments { return s.Tel }

// Start starts the background loops; addr names the proxy in writer
// leases unless Options.WriterID does. It runs before any listener
// accepts, so that every client's staged inserts go to collections of
// the same name.
func (s *Engine) Start(addr string) {
	if s.Opts.WriterID == "" {
		s.Leases.SetIdentity(addr)
	}
	s.loops.Start(s.Rules())
}

// Stop is the first step of a shutdown: the background loops stop and
// nothing merges now (inserts waiting for room in staging are refused).
func (s *Engine) Stop() {
	s.Closing.Store(true)
	s.loops.Stop()
	s.Merges.Close()
}

// ReleaseLeases gives up every writer lease this proxy holds, on a
// connection of its own within ctx, once its clients are gone.
func (s *Engine) ReleaseLeases(ctx context.Context) {
	s.tier.ReleaseLeases(ctx, s.Opts.Dialer.Dial)
}

// Close is the last step of a shutdown: the metrics' reports, the
// catalog and the pools end.
func (s *Engine) Close() {
	_ = s.stopMetrics()
	s.Cat.Close()
	s.tier.Close()
	s.background.Close()
}

// CancelCatalog ends a catalog read the upstream stopped answering (a
// shutdown out of time: a connection may wait behind it).
func (s *Engine) CancelCatalog() { s.Cat.Cancel() }

// Ready reports whether the engine can serve now (for /readyz): the
// upstream reachable, and the time-series catalog read (commands on
// namespaces wait for it otherwise).
func (s *Engine) Ready(ctx context.Context) error {
	up, err := s.Opts.Dialer.Dial(ctx)
	if err != nil {
		return err
	}
	if err := up.Close(); err != nil {
		return err
	}
	if _, err := s.Cat.Fresh(); err != nil {
		return err
	}
	return nil
}

// OpenCursors is the number of rewritten-read cursors the proxy tracks.
func (s *Engine) OpenCursors() int { return s.Cursors.Len() }

// backgroundMaxIdle is how many background connections stay open between
// rounds: the rules' rounds start at random points of their second, so a few
// serve them all.
const backgroundMaxIdle = 4

// SharedInserts counts the upstream inserts that carried more than one
// client's staged insert, and the inserts that rode along.
func (s *Engine) SharedInserts() (inserts, riders int64) { return s.tier.SharedInserts() }

// BackgroundConns is the number of upstream connections of the proxy's
// background work open now.
func (s *Engine) BackgroundConns() int { return s.background.Open() }

// ReadySpares is how many spare staging collections wait for an insert.
func (s *Engine) ReadySpares() int { return s.tier.ReadySpares() }

// Tier is the proxy's staging tier.
func (s *Engine) Tier() *tier.Tier { return s.tier }

// CapsOn is what the upstream supports, detected on up once.
func (s *Engine) CapsOn(up *upstream.Conn) (caps.Upstream, error) { return s.Abilities.Caps(up) }

// StopLoops stops the background loops (merges, retention) and waits for
// them; Stop does it first.
func (s *Engine) StopLoops() { s.loops.Stop() }
