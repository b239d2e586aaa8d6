package proxy

import (
	"go.mongodb.org/mongo-driver/v2/bson"

	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tsproxy/tsproxy/proxy/catalog"
	"github.com/tsproxy/tsproxy/proxy/cursors"
	"github.com/tsproxy/tsproxy/proxy/exec"
	"github.com/tsproxy/tsproxy/proxy/retention"
	"github.com/tsproxy/tsproxy/proxy/tier"

	"github.com/tsproxy/tsproxy/proxy/replycache"
	"github.com/tsproxy/tsproxy/proxy/telemetry"
	"github.com/tsproxy/tsproxy/proxy/tier/lease"

	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/upstream"
)

// Options configures a Server.
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

// Server is a running proxy.
type Server struct {
	opts Options
	log  *slog.Logger
	tel  *telemetry.Instruments
	// stopMetrics ends the staging figures' reports on the global meter.
	stopMetrics func() error
	state       *upstreamState
	cursors     *cursors.Registry
	replies     *replycache.Cache
	life        *lifecycleState
	sweep       *sweeper
	retention   *retention.Retainer
	leases      *lease.Set // writer leases (package lease)
	tier        *tier.Tier
	merges      *tier.State // tier.State(), used on every staged insert
	once        *onceSteps
	shells      *shellMemory
	writes      *writeIDs
	// idIndexOff: bucket namespace -> the writer-lease term (its start;
	// zero without leases) in which this proxy stopped the event-id
	// index before writing directly.
	idIndexOff sync.Map
	idIndexes  *idIndexCache
	cat        *catalog.Catalog
	served     sync.Map   // namespace → struct{}: created rules served here
	background *exec.Pool // connections of the background loops' rounds
	// serviceID names this proxy to drivers in load-balanced mode: one per
	// process, as a mongos behind a balancer has.
	serviceID bson.ObjectID

	mu       sync.Mutex
	ln       net.Listener
	more     []net.Listener // Serve's other listeners (Unix sockets)
	conns    map[*conn]struct{}
	closing  atomic.Bool
	connWG   sync.WaitGroup
	nextID   atomic.Uint64
	numConns atomic.Int64
}

// New checks opts and returns a Server ready to Serve.
func New(opts Options) (*Server, error) {
	if opts.Dialer == nil {
		return nil, errors.New("proxy: Options.Dialer is required")
	}
	if opts.Rules == nil {
		opts.Rules = rules.NewSet(nil)
	}
	if opts.MaxConnections <= 0 {
		opts.MaxConnections = rules.DefaultMaxConnections
	}
	if opts.MaxMessageBytes <= 0 || opts.MaxMessageBytes > maxMsgLen {
		opts.MaxMessageBytes = maxMsgLen
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
	tel, err := telemetry.New(opts.Tracing, commandNames())
	if err != nil {
		return nil, fmt.Errorf("proxy: telemetry: %w", err)
	}
	s := &Server{
		opts:       opts,
		log:        opts.Logger,
		tel:        tel,
		state:      newUpstreamState(),
		cursors:    cursors.New(opts.MaxCursors, opts.CursorTTL),
		replies:    replycache.New(opts.RetryCacheSize, opts.RetryCacheTTL),
		life:       newLifecycleState(),
		leases:     lease.NewSet(opts.WriterLease, opts.WriterID),
		once:       newOnceSteps(),
		shells:     newShellMemory(),
		writes:     newWriteIDs(time.Now()),
		idIndexes:  newIDIndexCache(),
		serviceID:  bson.NewObjectID(),
		conns:      make(map[*conn]struct{}),
		background: exec.NewPool(opts.Dialer.Dial, backgroundMaxIdle),
	}
	s.tier = tier.New(tier.Config{Host: tierHost{s}, Log: s.log, Leases: s.leases, Presence: lease.NewPresence(opts.WriterLease),
		Helpers: exec.NewPool(opts.Dialer.Dial, exec.HelperMaxIdle), Background: s.background,
		StagedMemory: opts.StagedMemory, DropOrphanedTable: opts.DropOrphanedTable})
	s.merges = s.tier.State()
	s.cat = catalog.New(catalog.Config{Pool: s.background, Log: s.log, Rules: opts.Rules, OnRules: s.syncLoops,
		Lease: opts.CatalogLease, Timeout: opts.CatalogTimeout, Mode: opts.CreateTimeseries})
	s.retention = retention.New(retentionHost{s}, s.log)
	stop, err := telemetry.ObserveStaging(s.merges.Snapshot)
	if err != nil {
		return nil, fmt.Errorf("proxy: telemetry: %w", err)
	}
	s.stopMetrics = stop
	return s, nil
}

// Serve accepts clients on ln, and on the listeners of more (Unix
// sockets for apps on this host: without TLS, which their permissions
// make needless), until Shutdown; it returns nil after a Shutdown and
// ln's accept error otherwise (one of more's is logged, and ends only
// that listener). ln's address names the proxy in writer leases: it is
// set before any listener accepts, so that every client's staged inserts
// go to collections of the same name.
func (s *Server) Serve(ln net.Listener, more ...net.Listener) error {
	if s.opts.TLS != nil {
		ln = tls.NewListener(ln, s.opts.TLS)
	}
	s.mu.Lock()
	s.ln, s.more = ln, more
	if s.closing.Load() {
		// Shutdown ran before Serve got here and found no listener to
		// close: close them now rather than accept forever.
		s.mu.Unlock()
		ln.Close()
		for _, l := range more {
			l.Close()
		}
		return nil
	}
	s.mu.Unlock()
	if s.opts.WriterID == "" {
		s.leases.SetIdentity(ln.Addr().String())
	}
	s.startSweeper()
	for _, l := range more {
		go func() {
			if err := s.accept(l); err != nil {
				s.log.Error("listener stopped", "addr", l.Addr().String(), "err", err)
			}
		}()
	}
	return s.accept(ln)
}

// accept serves the clients of ln until it is closed.
func (s *Server) accept(ln net.Listener) error {
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if s.closing.Load() {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				time.Sleep(backoff)
				continue
			}
			return fmt.Errorf("proxy: accept: %w", err)
		}
		backoff = 0
		s.startConn(nc)
	}
}

func (s *Server) startConn(nc net.Conn) {
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	c := newConn(s, nc, s.nextID.Add(1))
	over := s.numConns.Add(1) > int64(s.opts.MaxConnections)
	s.mu.Lock()
	if s.closing.Load() {
		s.mu.Unlock()
		s.numConns.Add(-1)
		nc.Close()
		return
	}
	s.conns[c] = struct{}{}
	s.connWG.Add(1)
	s.mu.Unlock()
	s.tel.ConnOpened()
	go func() {
		defer func() {
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
			s.numConns.Add(-1)
			s.tel.ConnClosed()
			s.connWG.Done()
		}()
		if tc, ok := nc.(*tls.Conn); ok {
			// The handshake, bounded: run by the first read otherwise,
			// a client that never sent its hello held a slot for good.
			_ = tc.SetDeadline(time.Now().Add(s.opts.FrameTimeout))
			if err := tc.Handshake(); err != nil {
				c.log.Warn("closing client connection: TLS handshake failed", "err", err.Error())
				s.tel.ErrorSeen("tls_handshake")
				nc.Close()
				return
			}
			_ = tc.SetDeadline(time.Time{})
		}
		if over {
			c.refuse(fmt.Sprintf("tsproxy: connection limit of %d reached", s.opts.MaxConnections))
			return
		}
		c.serve()
	}()
}

// Addr is the address Serve listens on (nil before Serve).
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return nil
	}
	return s.ln.Addr()
}

// Shutdown stops accepting, lets each connection finish the request it is
// serving, closes idle ones, and waits until all are gone or ctx ends (then
// it closes the rest).
func (s *Server) Shutdown(ctx context.Context) error {
	s.closing.Store(true)
	s.stopSweeper()
	defer s.stopMetrics()
	s.merges.Close() // nothing merges now: inserts waiting for room are refused
	defer s.cat.Close()
	defer s.tier.Close()
	defer s.background.Close()
	s.mu.Lock()
	if s.ln != nil {
		s.ln.Close()
	}
	for _, l := range s.more {
		l.Close()
	}
	for c := range s.conns {
		c.closeIfIdle()
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.connWG.Wait(); s.tier.ReleaseLeases(ctx, s.opts.Dialer.Dial); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		// A connection may wait on cat.mu behind a catalog read the
		// upstream stopped answering: ending the catalog's context closes
		// its connection, which ends that read.
		s.cat.Cancel()
		s.mu.Lock()
		for c := range s.conns {
			c.forceClose()
		}
		s.mu.Unlock()
		<-done
		return ctx.Err()
	}
}

// Ready reports whether the proxy can serve now (for /readyz, which a
// load balancer's health check reads): not shutting down, the upstream
// reachable, and the time-series catalog read (commands on namespaces
// wait for it otherwise).
func (s *Server) Ready(ctx context.Context) error {
	if s.closing.Load() {
		return errors.New("shutting down")
	}
	up, err := s.opts.Dialer.Dial(ctx)
	if err != nil {
		return err
	}
	if err := up.Close(); err != nil {
		return err
	}
	if _, err := s.cat.Fresh(); err != nil {
		return err
	}
	return nil
}

// OpenCursors is the number of rewritten-read cursors the proxy tracks.
func (s *Server) OpenCursors() int { return s.cursors.Len() }

// Connections is the number of open client connections.
func (s *Server) Connections() int { return int(s.numConns.Load()) }

// backgroundMaxIdle is how many background connections stay open between
// rounds: the rules' rounds start at random points of their second, so a few
// serve them all.
const backgroundMaxIdle = 4
