package catalog

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tsproxy/tsproxy/proxy/exec"
	"github.com/tsproxy/tsproxy/rewrite/admin"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/upstream"
)

// DefaultLease is how old a snapshot may be when the proxy routes by it.
const DefaultLease = time.Second

// catalogStuckAfter: a "creating" entry this old (as seen by one proxy)
// belongs to a proxy that died mid-create.
const catalogStuckAfter = 30 * time.Second

var errCatalogUnauthorized = errors.New("tsproxy: the catalog may not be read with the proxy's upstream credentials")

// Snap is one read of the catalog and the rules it makes.
type Snap struct {
	Rules   *rules.Set                    // config rules, then the ready entries'
	Entries map[string]admin.CatalogEntry // every entry, by namespace
	readAt  time.Time                     // when the read was sent
	Static  bool                          // no catalog: valid for ever
}

// Pending is the create or drop in progress on ns, if any.
func (s *Snap) Pending(ns string) (admin.CatalogEntry, bool) {
	e, ok := s.Entries[ns]
	return e, ok && e.State != admin.StateReady
}

// Catalog keeps the snapshot fresh.
type Catalog struct {
	cfg     Config
	lease   time.Duration
	timeout time.Duration // bounds one use of the connection
	snap    atomic.Pointer[Snap]
	bg      atomic.Bool // a background refresh is running

	mu      sync.Mutex // one read or write at a time; guards the fields below
	conn    *exec.Background
	idle    *time.Timer // closes conn once unused for catalogIdleClose
	lastUse time.Time
	mode    string // rules.CreateTimeseriesProxy or ...Upstream once known
	stuck   map[string]stuckEntry

	warnMu sync.Mutex
	warned map[string]warning // by kind: what was last logged, and when

	ctx    context.Context    // ends at Shutdown: closes conn
	Cancel context.CancelFunc // ends its context (Shutdown, when a read hangs)
}

// catalogIdleClose: the catalog's upstream connection is closed once it
// has not been used this long, so that a proxy without clients holds no
// upstream connection (it is read only while commands arrive).
const catalogIdleClose = 3 * time.Second

// warnEvery bounds how often the same catalog warning is logged: the
// catalog is read twice a lease while commands arrive.
const warnEvery = time.Minute

type warning struct {
	msg string
	at  time.Time
}

type stuckEntry struct {
	nonce string
	since time.Time
}

// Config is what a Catalog needs of its proxy.
type Config struct {
	Pool    *exec.Pool // its upstream connection comes from there
	Log     *slog.Logger
	Rules   *rules.Set       // the config file's
	OnRules func(*rules.Set) // called with each new rule set
	Lease   time.Duration    // 0: DefaultLease
	Timeout time.Duration    // 0: DefaultTimeout
	// Mode is rules.CreateTimeseriesAuto (""), ...Proxy or ...Upstream.
	Mode string
	// Now is the catalog's clock: snapshot ages, entries seen stuck,
	// warnings (nil: time.Now). Deadlines on the upstream connection
	// are the real clock's.
	Now func() time.Time
}

// New is the catalog of cfg's upstream; Close ends it.
func New(cfg Config) *Catalog {
	mode := cfg.Mode
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	cat := &Catalog{cfg: cfg, lease: cmp.Or(cfg.Lease, DefaultLease), timeout: cmp.Or(cfg.Timeout, DefaultTimeout), stuck: map[string]stuckEntry{}, warned: map[string]warning{}}
	cat.ctx, cat.Cancel = context.WithCancel(context.Background())
	if mode == rules.CreateTimeseriesUpstream {
		cat.mode = mode
	} else if mode == rules.CreateTimeseriesProxy {
		cat.mode = mode
	}
	cat.snap.Store(&Snap{Rules: cfg.Rules, Static: cat.mode == rules.CreateTimeseriesUpstream})
	return cat
}

// WaitOut waits until every snapshot read before now has expired on every
// proxy, plus a margin for a command routed by such a snapshot just
// before it expired, on its way to the upstream.
func (cat *Catalog) WaitOut() {
	time.Sleep(cat.lease + max(cat.lease, time.Second))
}

// Fresh returns a snapshot no older than the lease, reading the catalog
// when needed; half-way through the lease it is read in the background,
// so a steady stream of commands rarely waits for it.
func (cat *Catalog) Fresh() (*Snap, error) {
	snap := cat.snap.Load()
	if snap.Static {
		return snap, nil
	}
	age := cat.cfg.Now().Sub(snap.readAt)
	if age < cat.lease/2 {
		return snap, nil
	}
	if age < cat.lease {
		if cat.bg.CompareAndSwap(false, true) {
			go func() {
				defer cat.bg.Store(false)
				if _, err := cat.Refresh(snap); err != nil {
					cat.warn("read", "catalog: background read failed", err)
				}
			}()
		}
		return snap, nil
	}
	return cat.Refresh(snap)
}

// Refresh reads the catalog, unless someone did since old was current.
// With old nil it always reads.
func (cat *Catalog) Refresh(old *Snap) (*Snap, error) {
	cat.mu.Lock()
	defer cat.mu.Unlock()
	if cur := cat.snap.Load(); old != nil && cur != old {
		return cur, nil
	}
	snap, err := cat.read()
	if err != nil {
		cat.closeConn()
		return nil, err
	}
	cat.snap.Store(snap)
	return snap, nil
}

// Reread reads the catalog after this proxy changed it, so that its own
// next commands route by the change; a failure is logged (the next
// command reads again, as the snapshot is stale by then).
func (cat *Catalog) Reread(after string) {
	if _, err := cat.Refresh(nil); err != nil {
		cat.warn("reread", "catalog: read after "+after+" failed", err)
	}
}

// up is the catalog's upstream connection, dialled when needed (cat.mu
// held); each use restarts its idle timer.
func (cat *Catalog) up() (*upstream.Conn, error) {
	if cat.conn == nil {
		cat.conn = exec.NewBackground(cat.ctx, cat.cfg.Pool)
	}
	cat.lastUse = cat.cfg.Now()
	if cat.idle == nil {
		cat.idle = time.AfterFunc(catalogIdleClose, cat.closeIdle)
	} else {
		cat.idle.Reset(catalogIdleClose)
	}
	up, err := cat.conn.Get()
	if err == nil {
		// Every use of it is under cat.mu, which every client's command
		// may wait on: an upstream that stopped answering mid-reply held
		// every command of every client, and Shutdown, for good. A read
		// or write that times out closes the connection (closeConn).
		_ = up.SetDeadline(time.Now().Add(cat.timeout))
	}
	return up, err
}

// DefaultTimeout bounds one use of the catalog's connection.
const DefaultTimeout = 10 * time.Second

// closeIdle closes the connection if it was not used since the timer was
// set.
func (cat *Catalog) closeIdle() {
	cat.mu.Lock()
	defer cat.mu.Unlock()
	if cat.cfg.Now().Sub(cat.lastUse) >= catalogIdleClose {
		cat.closeConn()
	}
}

// closeConn closes the connection, if any (cat.mu held).
func (cat *Catalog) closeConn() {
	if cat.conn != nil {
		cat.conn.Close()
	}
}

// Close ends the catalog's upstream connection for good (Shutdown).
func (cat *Catalog) Close() {
	cat.Cancel()
	cat.mu.Lock()
	defer cat.mu.Unlock()
	cat.closeConn()
	if cat.idle != nil {
		cat.idle.Stop()
	}
}

// warn logs a catalog problem of a kind, unless the same was logged less
// than warnEvery ago.
func (cat *Catalog) warn(kind, msg string, err error) {
	cat.warnMu.Lock()
	last := cat.warned[kind]
	text := msg + ": " + err.Error()
	if last.msg == text && cat.cfg.Now().Sub(last.at) < warnEvery {
		cat.warnMu.Unlock()
		return
	}
	cat.warned[kind] = warning{msg: text, at: cat.cfg.Now()}
	cat.warnMu.Unlock()
	cat.cfg.Log.Warn(msg, "err", err.Error())
}

// read is one read of the catalog (cat.mu held).
func (cat *Catalog) read() (*Snap, error) {
	up, err := cat.up()
	if err != nil {
		return nil, fmt.Errorf("tsproxy: reading the time-series catalog: %w", err)
	}
	if cat.mode == "" {
		if err := cat.detectMode(up); err != nil {
			return nil, err
		}
	}
	prev := cat.snap.Load()
	if cat.mode == rules.CreateTimeseriesUpstream {
		return &Snap{Rules: cat.cfg.Rules, Static: true}, nil
	}
	sent := cat.cfg.Now()
	entries, err := cat.readAll(up)
	if errors.Is(err, errCatalogUnauthorized) {
		// Without the right to read it, this proxy's credentials cannot
		// write it either: creates pass through, as on a proxy that has
		// no catalog.
		cat.cfg.Log.Warn("time-series creates pass through to the upstream: the proxy's upstream credentials may not read " + rules.CatalogDB + "." + rules.CatalogCollection)
		cat.mode = rules.CreateTimeseriesUpstream
		return &Snap{Rules: cat.cfg.Rules, Static: true}, nil
	}
	if err != nil {
		return nil, err
	}
	cat.abortStuck(up, entries, sent)
	snap := &Snap{Entries: entries, readAt: sent, Rules: prev.Rules}
	if !sameReady(prev.Entries, entries) || prev.Rules == nil {
		snap.Rules = cat.cfg.Rules.WithRules(readyRules(entries))
		cat.cfg.OnRules(snap.Rules)
	}
	return snap, nil
}

// detectMode resolves rules.CreateTimeseriesAuto: the upstream's own
// time-series collections where it makes them (admin.TimeseriesProbe, in
// the catalog's database, under a name of this probe's own).
func (cat *Catalog) detectMode(up *upstream.Conn) error {
	res, err := exec.Drive(exec.OnConn{Up: up}, admin.TimeseriesProbe(rules.CatalogDB, admin.ProbeName(cat.cfg.Now(), NewNonce())))
	if err != nil {
		return fmt.Errorf("tsproxy: probing time-series collections: %w", err)
	}
	native, err := admin.Native(res.Reply)
	switch {
	case errors.Is(err, admin.ErrProbeUnauthorized):
		// The catalog could not be written either: creates pass
		// through, as without a catalog.
		cat.cfg.Log.Warn("time-series creates pass through to the upstream: the proxy's upstream credentials may not create collections in " + rules.CatalogDB)
		native = true
	case err != nil:
		return err
	}
	cat.mode = rules.CreateTimeseriesProxy
	if native {
		cat.mode = rules.CreateTimeseriesUpstream
	}
	cat.cfg.Log.Info("time-series collections", "servedBy", cat.mode)
	return nil
}

// readAll reads every entry; a document it cannot read is logged and
// skipped (its namespace stays as it is upstream).
func (cat *Catalog) readAll(up *upstream.Conn) (map[string]admin.CatalogEntry, error) {
	entries := map[string]admin.CatalogEntry{}
	cmd := admin.CatalogFind()
	for {
		reply, err := exec.Run(up, cmd)
		if err != nil {
			return nil, fmt.Errorf("tsproxy: reading the time-series catalog: %w", err)
		}
		if r := upstream.RefusalOf(reply); r != nil && r.Code == mongoerr.Unauthorized {
			return nil, errCatalogUnauthorized
		}
		batch, id, bad, err := admin.ParseCatalogBatch(reply)
		if err != nil {
			return nil, fmt.Errorf("tsproxy: %w", err)
		}
		for _, b := range bad {
			cat.warn("entry "+b.Error(), "catalog: skipped an entry", b)
		}
		for _, e := range batch {
			entries[e.Namespace()] = e
		}
		if id == 0 {
			return entries, nil
		}
		cmd = admin.CatalogGetMore(id)
	}
}

// abortStuck deletes the "creating" entries that have not changed for
// catalogStuckAfter: their proxy died before it answered the create. It
// notes when each create or drop in progress was first seen (stuck).
func (cat *Catalog) abortStuck(up *upstream.Conn, entries map[string]admin.CatalogEntry, now time.Time) {
	for ns, st := range cat.stuck {
		if e, ok := entries[ns]; !ok || e.Nonce != st.nonce || e.State == admin.StateReady {
			delete(cat.stuck, ns)
		}
	}
	for ns, e := range entries {
		if e.State == admin.StateReady {
			continue
		}
		st, ok := cat.stuck[ns]
		if !ok {
			cat.stuck[ns] = stuckEntry{nonce: e.Nonce, since: now}
			continue
		}
		if now.Sub(st.since) < catalogStuckAfter || e.State != admin.StateCreating {
			continue
		}
		if n, err := catalogWrite(up, admin.CatalogDelete(ns, e.Nonce)); err == nil && n == 1 {
			cat.cfg.Log.Warn("catalog: deleted a create that never finished (its proxy stopped?)", "ns", ns)
			delete(entries, ns)
		}
		delete(cat.stuck, ns)
	}
}

// StuckDrop reports whether the drop of e has shown no progress for
// catalogStuckAfter: its proxy stopped, and a drop run again finishes it.
func (cat *Catalog) StuckDrop(e admin.CatalogEntry) bool {
	cat.mu.Lock()
	defer cat.mu.Unlock()
	st, ok := cat.stuck[e.Namespace()]
	return ok && e.State == admin.StateDropping && st.nonce == e.Nonce && cat.cfg.Now().Sub(st.since) >= catalogStuckAfter
}

// Write runs one catalog write and returns its n (cat.mu not held).
func (cat *Catalog) Write(cmd []byte) (int64, error) {
	cat.mu.Lock()
	defer cat.mu.Unlock()
	up, err := cat.up()
	if err != nil {
		return 0, err
	}
	n, err := catalogWrite(up, cmd)
	var refused *upstream.Refusal
	var writeErr *WriteError
	if err != nil && !errors.As(err, &refused) && !errors.As(err, &writeErr) {
		cat.closeConn()
	}
	return n, err
}

// catalogWrite runs an insert, update or delete of the catalog: its n,
// or the upstream's refusal (a duplicate key among them).
func catalogWrite(up *upstream.Conn, cmd []byte) (int64, error) {
	reply, err := exec.Run(up, cmd)
	if err != nil {
		return 0, err
	}
	if r := upstream.RefusalOf(reply); r != nil {
		return 0, r
	}
	if arr, ok := reply.Lookup("writeErrors").ArrayOK(); ok {
		vals, _ := arr.Values()
		if len(vals) > 0 {
			d, _ := vals[0].DocumentOK()
			code, _ := d.Lookup("code").AsInt64OK()
			msg, _ := d.Lookup("errmsg").StringValueOK()
			return 0, &WriteError{Code: code, msg: msg}
		}
	}
	n, _ := reply.Lookup("n").AsInt64OK()
	return n, nil
}

// WriteError is a write error of a catalog write.
type WriteError struct {
	Code int64
	msg  string
}

func (e *WriteError) Error() string {
	return fmt.Sprintf("catalog write: %s (code %d)", e.msg, e.Code)
}

// sameReady reports whether a and b have the same ready entries.
func sameReady(a, b map[string]admin.CatalogEntry) bool {
	count := 0
	for ns, e := range b {
		if e.State != admin.StateReady {
			continue
		}
		count++
		if p, ok := a[ns]; !ok || p.State != admin.StateReady || p.Nonce != e.Nonce {
			return false
		}
	}
	for _, e := range a {
		if e.State == admin.StateReady {
			count--
		}
	}
	return count == 0
}

// readyRules are the rules of the ready entries.
func readyRules(entries map[string]admin.CatalogEntry) []rules.Rule {
	var rs []rules.Rule
	for _, e := range entries {
		if e.State == admin.StateReady {
			rs = append(rs, rules.NewCreatedRule(e.Created))
		}
	}
	return rs
}

// NewNonce is a fresh catalog nonce.
func NewNonce() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Load is the latest snapshot, as it is.
func (cat *Catalog) Load() *Snap { return cat.snap.Load() }
