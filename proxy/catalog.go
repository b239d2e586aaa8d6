package proxy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite/admin"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/upstream"
)

// The catalog of time-series collections apps created (rewrite/admin
// keeps its documents). Every proxy on one upstream reads it, and the rules it
// holds join the config's.
//
// The promise: no event inserted through any proxy after a create was
// acknowledged is stored unbucketed, and none inserted after a drop was
// acknowledged lands in the dropped buckets. How:
//
//  1. A proxy routes a command on a namespace by a catalog snapshot read
//     less than CatalogLease ago (the lease counts from when the read was
//     sent). A staler snapshot is read again before the command goes on.
//  2. A create writes its entry as "creating", then waits CatalogLease
//     plus a margin: every snapshot read before the entry was written has
//     expired by then, so every proxy has seen "creating", and commands
//     on the namespace wait while it is. Only then does it check that no
//     plain collection of the name appeared meanwhile, create the bucket
//     collection, mark the entry "ready" and answer ok.
//  3. A drop marks the entry "dropping" and waits the same way before it
//     drops the collections and deletes the entry.
//
// The bound this leaves: a command a proxy sent upstream before its lease
// ran out, that reaches the upstream more than the margin later. The
// margin is CatalogLease (at least 1s); the check in step 2 catches such
// a late insert when it lands before the check.
//
// Each change of an entry is a compare-and-set on its nonce. An entry
// left "creating" by a proxy that died is deleted by the next proxy that
// sees it unchanged for catalogStuckAfter (its create was never
// acknowledged); one left "dropping" waits for the app to drop again.

// DefaultCatalogLease is Options.CatalogLease's default.
const DefaultCatalogLease = time.Second

// catalogStuckAfter: a "creating" entry this old (as seen by one proxy)
// belongs to a proxy that died mid-create.
const catalogStuckAfter = 30 * time.Second

var errCatalogUnauthorized = errors.New("tsproxy: the catalog may not be read with the proxy's upstream credentials")

// catalogSnap is one read of the catalog and the rules it makes.
type catalogSnap struct {
	rules   *rules.Set                    // config rules, then the ready entries'
	entries map[string]admin.CatalogEntry // every entry, by namespace
	readAt  time.Time                     // when the read was sent
	static  bool                          // no catalog: valid for ever
}

// pending is the create or drop in progress on ns, if any.
func (s *catalogSnap) pending(ns string) (admin.CatalogEntry, bool) {
	e, ok := s.entries[ns]
	return e, ok && e.State != admin.StateReady
}

// catalog keeps the snapshot fresh.
type catalog struct {
	s       *Server
	lease   time.Duration
	timeout time.Duration // bounds one use of the connection
	snap    atomic.Pointer[catalogSnap]
	bg      atomic.Bool // a background refresh is running

	mu      sync.Mutex // one read or write at a time; guards the fields below
	conn    *backgroundConn
	idle    *time.Timer // closes conn once unused for catalogIdleClose
	lastUse time.Time
	mode    string // rules.CreateTimeseriesProxy or ...Upstream once known
	stuck   map[string]stuckEntry

	warnMu sync.Mutex
	warned map[string]warning // by kind: what was last logged, and when

	ctx    context.Context // ends at Shutdown: closes conn
	cancel context.CancelFunc
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

func newCatalog(s *Server, lease time.Duration, mode string) *catalog {
	if lease <= 0 {
		lease = DefaultCatalogLease
	}
	cat := &catalog{s: s, lease: lease, stuck: map[string]stuckEntry{}, warned: map[string]warning{}}
	cat.ctx, cat.cancel = context.WithCancel(context.Background())
	if mode == rules.CreateTimeseriesUpstream {
		cat.mode = mode
	} else if mode == rules.CreateTimeseriesProxy {
		cat.mode = mode
	}
	cat.snap.Store(&catalogSnap{rules: s.opts.Rules, static: cat.mode == rules.CreateTimeseriesUpstream})
	return cat
}

// waitOut waits until every snapshot read before now has expired on every
// proxy, plus a margin for a command routed by such a snapshot just
// before it expired, on its way to the upstream.
func (cat *catalog) waitOut() {
	time.Sleep(cat.lease + max(cat.lease, time.Second))
}

// rules is the latest rule set (maybe stale: for background work, which
// re-reads it every round).
func (s *Server) rules() *rules.Set { return s.cat.snap.Load().rules }

// routesRule reports whether the proxy still routes rule's namespace by a
// rule (true when the catalog cannot be read: nothing says otherwise).
func (s *Server) routesRule(rule *rules.Rule) bool {
	if rule.Declared == nil {
		return true // config rules change with the config file only
	}
	snap, err := s.cat.fresh()
	if err != nil {
		return true
	}
	return snap.rules.Lookup(rule.DB, rule.Collection) != nil
}

// fresh returns a snapshot no older than the lease, reading the catalog
// when needed; half-way through the lease it is read in the background,
// so a steady stream of commands rarely waits for it.
func (cat *catalog) fresh() (*catalogSnap, error) {
	snap := cat.snap.Load()
	if snap.static {
		return snap, nil
	}
	age := time.Since(snap.readAt)
	if age < cat.lease/2 {
		return snap, nil
	}
	if age < cat.lease {
		if cat.bg.CompareAndSwap(false, true) {
			go func() {
				defer cat.bg.Store(false)
				if _, err := cat.refresh(snap); err != nil {
					cat.warn("read", "catalog: background read failed", err)
				}
			}()
		}
		return snap, nil
	}
	return cat.refresh(snap)
}

// refresh reads the catalog, unless someone did since old was current.
// With old nil it always reads.
func (cat *catalog) refresh(old *catalogSnap) (*catalogSnap, error) {
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

// reread reads the catalog after this proxy changed it, so that its own
// next commands route by the change; a failure is logged (the next
// command reads again, as the snapshot is stale by then).
func (cat *catalog) reread(after string) {
	if _, err := cat.refresh(nil); err != nil {
		cat.warn("reread", "catalog: read after "+after+" failed", err)
	}
}

// up is the catalog's upstream connection, dialled when needed (cat.mu
// held); each use restarts its idle timer.
func (cat *catalog) up() (*upstream.Conn, error) {
	if cat.conn == nil {
		cat.conn = newBackgroundConn(cat.ctx, cat.s)
	}
	cat.lastUse = time.Now()
	if cat.idle == nil {
		cat.idle = time.AfterFunc(catalogIdleClose, cat.closeIdle)
	} else {
		cat.idle.Reset(catalogIdleClose)
	}
	up, err := cat.conn.get()
	if err == nil {
		// Every use of it is under cat.mu, which every client's command
		// may wait on: an upstream that stopped answering mid-reply held
		// every command of every client, and Shutdown, for good. A read
		// or write that times out closes the connection (closeConn).
		_ = up.SetDeadline(time.Now().Add(cat.timeout))
	}
	return up, err
}

// DefaultCatalogTimeout bounds one use of the catalog's connection.
const DefaultCatalogTimeout = 10 * time.Second

// closeIdle closes the connection if it was not used since the timer was
// set.
func (cat *catalog) closeIdle() {
	cat.mu.Lock()
	defer cat.mu.Unlock()
	if time.Since(cat.lastUse) >= catalogIdleClose {
		cat.closeConn()
	}
}

// closeConn closes the connection, if any (cat.mu held).
func (cat *catalog) closeConn() {
	if cat.conn != nil {
		cat.conn.close()
	}
}

// close ends the catalog's upstream connection for good (Shutdown).
func (cat *catalog) close() {
	cat.cancel()
	cat.mu.Lock()
	defer cat.mu.Unlock()
	cat.closeConn()
	if cat.idle != nil {
		cat.idle.Stop()
	}
}

// warn logs a catalog problem of a kind, unless the same was logged less
// than warnEvery ago.
func (cat *catalog) warn(kind, msg string, err error) {
	cat.warnMu.Lock()
	last := cat.warned[kind]
	text := msg + ": " + err.Error()
	if last.msg == text && time.Since(last.at) < warnEvery {
		cat.warnMu.Unlock()
		return
	}
	cat.warned[kind] = warning{msg: text, at: time.Now()}
	cat.warnMu.Unlock()
	cat.s.log.Warn(msg, "err", err.Error())
}

// read is one read of the catalog (cat.mu held).
func (cat *catalog) read() (*catalogSnap, error) {
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
		return &catalogSnap{rules: cat.s.opts.Rules, static: true}, nil
	}
	sent := time.Now()
	entries, err := cat.readAll(up)
	if errors.Is(err, errCatalogUnauthorized) {
		// Without the right to read it, this proxy's credentials cannot
		// write it either: creates pass through, as on a proxy that has
		// no catalog.
		cat.s.log.Warn("time-series creates pass through to the upstream: the proxy's upstream credentials may not read " + rules.CatalogDB + "." + rules.CatalogCollection)
		cat.mode = rules.CreateTimeseriesUpstream
		return &catalogSnap{rules: cat.s.opts.Rules, static: true}, nil
	}
	if err != nil {
		return nil, err
	}
	cat.abortStuck(up, entries, sent)
	snap := &catalogSnap{entries: entries, readAt: sent, rules: prev.rules}
	if !sameReady(prev.entries, entries) || prev.rules == nil {
		snap.rules = cat.s.opts.Rules.WithRules(readyRules(entries))
		cat.s.syncLoops(snap.rules)
	}
	return snap, nil
}

// detectMode resolves rules.CreateTimeseriesAuto: the upstream's own
// time-series collections where it has them.
func (cat *catalog) detectMode(up *upstream.Conn) error {
	reply, err := up.Command(bson.D{{Key: "buildInfo", Value: 1}, {Key: "$db", Value: "admin"}})
	if err != nil {
		return fmt.Errorf("tsproxy: reading the time-series catalog: buildInfo: %w", err)
	}
	if r := upstream.RefusalOf(reply); r != nil {
		return fmt.Errorf("tsproxy: reading the time-series catalog: buildInfo: %w", r)
	}
	cat.mode = rules.CreateTimeseriesProxy
	if caps.Detect(reply).NativeTimeseries {
		cat.mode = rules.CreateTimeseriesUpstream
	}
	cat.s.log.Info("time-series collections", "servedBy", cat.mode)
	return nil
}

// readAll reads every entry; a document it cannot read is logged and
// skipped (its namespace stays as it is upstream).
func (cat *catalog) readAll(up *upstream.Conn) (map[string]admin.CatalogEntry, error) {
	entries := map[string]admin.CatalogEntry{}
	cmd := admin.CatalogFind()
	for {
		reply, err := up.Command(bson.Raw(cmd))
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
func (cat *catalog) abortStuck(up *upstream.Conn, entries map[string]admin.CatalogEntry, now time.Time) {
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
			cat.s.log.Warn("catalog: deleted a create that never finished (its proxy stopped?)", "ns", ns)
			delete(entries, ns)
		}
		delete(cat.stuck, ns)
	}
}

// stuckDrop reports whether the drop of e has shown no progress for
// catalogStuckAfter: its proxy stopped, and a drop run again finishes it.
func (cat *catalog) stuckDrop(e admin.CatalogEntry) bool {
	cat.mu.Lock()
	defer cat.mu.Unlock()
	st, ok := cat.stuck[e.Namespace()]
	return ok && e.State == admin.StateDropping && st.nonce == e.Nonce && time.Since(st.since) >= catalogStuckAfter
}

// write runs one catalog write and returns its n (cat.mu not held).
func (cat *catalog) write(cmd []byte) (int64, error) {
	cat.mu.Lock()
	defer cat.mu.Unlock()
	up, err := cat.up()
	if err != nil {
		return 0, err
	}
	n, err := catalogWrite(up, cmd)
	var refused *upstream.Refusal
	var writeErr *catalogWriteError
	if err != nil && !errors.As(err, &refused) && !errors.As(err, &writeErr) {
		cat.closeConn()
	}
	return n, err
}

// catalogWrite runs an insert, update or delete of the catalog: its n,
// or the upstream's refusal (a duplicate key among them).
func catalogWrite(up *upstream.Conn, cmd []byte) (int64, error) {
	reply, err := up.Command(bson.Raw(cmd))
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
			return 0, &catalogWriteError{code: code, msg: msg}
		}
	}
	n, _ := reply.Lookup("n").AsInt64OK()
	return n, nil
}

// catalogWriteError is a write error of a catalog write.
type catalogWriteError struct {
	code int64
	msg  string
}

func (e *catalogWriteError) Error() string {
	return fmt.Sprintf("catalog write: %s (code %d)", e.msg, e.code)
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

// newNonce is a fresh catalog nonce.
func newNonce() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
