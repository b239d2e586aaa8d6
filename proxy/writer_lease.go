package proxy

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/tsproxy/tsproxy/rewrite/caps"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/upstream"
)

// On an upstream whose updates are not isolated from each other
// (caps.Upstream.SingleWriter: FerretDB v1.24 reads a document, changes it
// in Go and writes it back by _id), two proxies updating the same bucket
// at once lose one of the updates: measured, two proxies writing one
// series lost 81 of 2,400 acknowledged events. One proxy's own writers
// are serialized by its series locks; across proxies nothing is. So on
// such an upstream a proxy writes a bucketed namespace only while it holds
// that namespace's writer lease, and a second proxy's writes get a clear
// error instead of a silent loss.
//
// The lease lives in the upstream, in <db>.tsproxy_leases, one document
// per term: {_id: "<coll>#<term>", ns: <coll>, term, owner, expires}.
// Taking the lease inserts the next term (an insert of a taken _id fails
// on every upstream, so two takers cannot both win); only the holder
// updates its own term's expiry. The holder renews when half the lease is
// used, on the write path, so an idle proxy lets its lease lapse and
// another may take over. A holder counts its lease valid for ttl − ttl/6
// from the start of the renewal, and a taker waits until ttl/6 past the
// stored expiry: clocks of proxies must agree within ttl/6 (5 s by
// default). A write that starts with at least half the lease left is
// assumed to end before the lease can be taken.
//
// A proxy's identity is its host and listen address: two live processes
// cannot listen on both, so a proxy restarted after a crash on the same
// address takes its lease back at once instead of waiting for it to lapse.

// DefaultWriterLease is how long a writer lease lasts without renewal.
const DefaultWriterLease = 30 * time.Second

const leaseCollection = rules.LeaseCollection

// leaseRecheck is how long a proxy that found the lease held by another
// answers from what it found before asking the upstream again.
const leaseRecheck = time.Second

// writerLeases are the leases of one proxy, by rule namespace.
type writerLeases struct {
	ttl time.Duration

	mu     sync.Mutex
	id     string // identity; set when the proxy starts listening
	byRule map[string]*writerLease
}

// writerLease is this proxy's view of one namespace's lease. mu
// serializes taking and renewing it; the fast path reads validUntil under
// it too (uncontended but for the rare renewal round trip).
type writerLease struct {
	db, coll string // the rule's namespace

	mu         sync.Mutex
	term       int64     // held term; 0 when not held
	validUntil time.Time // local clock: the lease is ours until then
	// When another proxy holds it: who, until when (its stored expiry),
	// and when to ask again.
	other        string
	otherExpires time.Time
	recheckAt    time.Time
}

func newWriterLeases(ttl time.Duration, id string) *writerLeases {
	if ttl <= 0 {
		ttl = DefaultWriterLease
	}
	if id == "" {
		host, _ := os.Hostname()
		id = host + "/tsproxy" // until Serve knows the listen address
	}
	return &writerLeases{ttl: ttl, id: id, byRule: map[string]*writerLease{}}
}

// setIdentity names this proxy by host and listen address, unless the
// options named it.
func (w *writerLeases) setIdentity(listen string) {
	host, _ := os.Hostname()
	w.mu.Lock()
	w.id = host + "/" + listen
	w.mu.Unlock()
}

func (w *writerLeases) identity() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.id
}

func (w *writerLeases) lease(rule *rules.Rule) *writerLease {
	w.mu.Lock()
	defer w.mu.Unlock()
	l := w.byRule[rule.Namespace]
	if l == nil {
		l = &writerLease{db: rule.DB, coll: rule.Collection}
		w.byRule[rule.Namespace] = l
	}
	return l
}

// LeaseHeldError says another proxy holds a namespace's writer lease.
type LeaseHeldError struct {
	Rule    string
	Owner   string
	Expires time.Time
}

func (e *LeaseHeldError) Error() string {
	return fmt.Sprintf("tsproxy rule %s: another tsproxy (%s) is writing this namespace (its writer lease runs until %s unless renewed); "+
		"this upstream's updates are not isolated, so only one proxy at a time may write a bucketed namespace: send these writes to that proxy, or stop it and retry",
		e.Rule, e.Owner, e.Expires.UTC().Format(time.RFC3339))
}

// errLeaseLost: the holder found a later term when renewing.
var errLeaseLost = errors.New("writer lease taken by another proxy")

// ensureWriter returns nil when this proxy may write rule's buckets now:
// always on upstreams with isolated updates, and otherwise while it holds
// the rule's writer lease with at least half of it left (taking or
// renewing it on c's upstream connection, with the client's privileges).
func (c *conn) ensureWriter(rule *rules.Rule, caps caps.Upstream) error {
	if !caps.SingleWriter {
		return nil
	}
	w := c.s.leases
	l := w.lease(rule)
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if l.term > 0 && now.Before(l.validUntil.Add(-w.ttl/2)) {
		return nil
	}
	if l.term == 0 && l.other != "" && now.Before(l.recheckAt) {
		return &LeaseHeldError{Rule: rule.Namespace, Owner: l.other, Expires: l.otherExpires}
	}
	lc := leaseClient{up: c.up, db: rule.DB, ns: rule.Collection, owner: w.identity(), ttl: w.ttl}
	if l.term > 0 {
		err := lc.renew(l.term, now)
		if err == nil {
			l.validUntil = now.Add(w.ttl - w.ttl/6)
			return nil
		}
		if !errors.Is(err, errLeaseLost) {
			return fmt.Errorf("tsproxy rule %s: renew the writer lease: %w", rule.Namespace, err)
		}
		c.log.Warn("writer lease lost to another proxy", "rule", rule.Namespace, "term", l.term)
		l.term = 0
	}
	term, held, err := lc.take(now)
	if err != nil {
		return fmt.Errorf("tsproxy rule %s: take the writer lease: %w", rule.Namespace, err)
	}
	if held != nil {
		l.other, l.otherExpires, l.recheckAt = held.Owner, held.Expires, now.Add(leaseRecheck)
		held.Rule = rule.Namespace
		return held
	}
	l.term, l.validUntil, l.other = term, now.Add(w.ttl-w.ttl/6), ""
	c.log.Info("writer lease taken", "rule", rule.Namespace, "term", term, "owner", lc.owner)
	return nil
}

// leaseClient runs the lease commands of one namespace on one upstream
// connection.
type leaseClient struct {
	up    *upstream.Conn
	db    string
	ns    string // the rule's collection
	owner string
	ttl   time.Duration
}

type leaseDoc struct {
	ID      string    `bson:"_id"`
	NS      string    `bson:"ns"`
	Term    int64     `bson:"term"`
	Owner   string    `bson:"owner"`
	Expires time.Time `bson:"expires"`
}

func (lc leaseClient) id(term int64) string { return fmt.Sprintf("%s#%d", lc.ns, term) }

// latest reads the namespace's lease document of the highest term.
func (lc leaseClient) latest() (*leaseDoc, error) {
	reply, err := lc.run(bson.D{
		{Key: "find", Value: leaseCollection},
		{Key: "filter", Value: bson.D{{Key: "ns", Value: lc.ns}}},
		{Key: "singleBatch", Value: true},
		{Key: "batchSize", Value: 1000},
	})
	if err != nil {
		return nil, err
	}
	var r struct {
		Cursor struct {
			FirstBatch []leaseDoc `bson:"firstBatch"`
		} `bson:"cursor"`
	}
	if err := bson.Unmarshal(reply, &r); err != nil {
		return nil, fmt.Errorf("read leases: %w", err)
	}
	var top *leaseDoc
	for i := range r.Cursor.FirstBatch {
		if d := &r.Cursor.FirstBatch[i]; top == nil || d.Term > top.Term {
			top = d
		}
	}
	return top, nil
}

// take inserts the next term when the lease is free, lapsed or already
// this proxy's; otherwise it returns who holds it.
func (lc leaseClient) take(now time.Time) (int64, *LeaseHeldError, error) {
	top, err := lc.latest()
	if err != nil {
		return 0, nil, err
	}
	next := int64(1)
	if top != nil {
		if top.Owner != lc.owner && now.Before(top.Expires.Add(lc.ttl/6)) {
			return 0, &LeaseHeldError{Owner: top.Owner, Expires: top.Expires}, nil
		}
		next = top.Term + 1
	}
	reply, err := lc.up.Command(bson.D{
		{Key: "insert", Value: leaseCollection},
		{Key: "documents", Value: bson.A{leaseDoc{ID: lc.id(next), NS: lc.ns, Term: next, Owner: lc.owner, Expires: now.Add(lc.ttl)}}},
		{Key: "$db", Value: lc.db},
	})
	if err != nil {
		return 0, nil, err
	}
	if r := refusalOf(reply); r != nil {
		return 0, nil, r
	}
	if code, msg, failed := firstWriteError(reply); failed {
		if code != mongoerr.DuplicateKey {
			return 0, nil, fmt.Errorf("insert lease %s: %s (code %d)", lc.id(next), msg, code)
		}
		// Another proxy inserted this term first: it holds the lease.
		if top, err = lc.latest(); err != nil {
			return 0, nil, err
		}
		if top == nil {
			return 0, nil, errors.New("lease insert refused and no lease found")
		}
		return 0, &LeaseHeldError{Owner: top.Owner, Expires: top.Expires}, nil
	}
	// Earlier terms are history; a failure to remove them costs nothing.
	_, _ = lc.run(bson.D{
		{Key: "delete", Value: leaseCollection},
		{Key: "deletes", Value: bson.A{bson.D{
			{Key: "q", Value: bson.D{{Key: "ns", Value: lc.ns}, {Key: "term", Value: bson.D{{Key: "$lt", Value: next}}}}},
			{Key: "limit", Value: 0},
		}}},
	})
	return next, nil, nil
}

// firstWriteError returns the code and message of a reply's first write
// error.
func firstWriteError(reply bson.Raw) (mongoerr.Code, string, bool) {
	arr, ok := reply.Lookup("writeErrors").ArrayOK()
	if !ok {
		return 0, "", false
	}
	vals, err := arr.Values()
	if err != nil || len(vals) == 0 {
		return 0, "", false
	}
	d, _ := vals[0].DocumentOK()
	code, _ := d.Lookup("code").AsInt64OK()
	msg, _ := d.Lookup("errmsg").StringValueOK()
	return mongoerr.Code(code), msg, true
}

// renew moves the expiry of the held term on and checks that no later
// term exists.
func (lc leaseClient) renew(term int64, now time.Time) error {
	reply, err := lc.run(bson.D{
		{Key: "update", Value: leaseCollection},
		{Key: "updates", Value: bson.A{bson.D{
			{Key: "q", Value: bson.D{{Key: "_id", Value: lc.id(term)}}},
			{Key: "u", Value: bson.D{{Key: "$set", Value: bson.D{{Key: "expires", Value: now.Add(lc.ttl)}}}}},
		}}},
	})
	if err != nil {
		return err
	}
	if n, _ := reply.Lookup("n").AsInt64OK(); n != 1 {
		return errLeaseLost
	}
	top, err := lc.latest()
	if err != nil {
		return err
	}
	if top == nil || top.Term != term {
		return errLeaseLost
	}
	return nil
}

// release ends the held term now, so another proxy may take over at once.
func (lc leaseClient) release(term int64) error {
	_, err := lc.run(bson.D{
		{Key: "update", Value: leaseCollection},
		{Key: "updates", Value: bson.A{bson.D{
			{Key: "q", Value: bson.D{{Key: "_id", Value: lc.id(term)}, {Key: "owner", Value: lc.owner}}},
			{Key: "u", Value: bson.D{{Key: "$set", Value: bson.D{{Key: "expires", Value: time.Unix(0, 0)}}}}},
		}}},
	})
	return err
}

// run sends cmd to the lease database and returns the reply, or the
// upstream's refusal as an error.
func (lc leaseClient) run(cmd bson.D) (bson.Raw, error) {
	reply, err := lc.up.Command(append(cmd, bson.E{Key: "$db", Value: lc.db}))
	if err != nil {
		return nil, err
	}
	if r := refusalOf(reply); r != nil {
		return nil, r
	}
	return reply, nil
}

// releaseLeases gives up every lease this proxy holds, on a connection of
// its own (at shutdown, after the clients are gone). An upstream that
// needs credentials the proxy lacks refuses: the leases then lapse by
// themselves.
func (s *Server) releaseLeases(ctx context.Context) {
	type held struct {
		db, coll string
		term     int64
	}
	var hs []held
	s.leases.mu.Lock()
	for _, l := range s.leases.byRule {
		l.mu.Lock()
		if l.term > 0 {
			hs = append(hs, held{l.db, l.coll, l.term})
			l.term = 0
		}
		l.mu.Unlock()
	}
	s.leases.mu.Unlock()
	if len(hs) == 0 {
		return
	}
	up, err := s.opts.Dialer.Dial(ctx)
	if err != nil {
		s.log.Warn("writer leases not released; they lapse by themselves", "err", err.Error())
		return
	}
	defer up.Close()
	for _, h := range hs {
		lc := leaseClient{up: up, db: h.db, ns: h.coll, owner: s.leases.identity(), ttl: s.leases.ttl}
		if err := lc.release(h.term); err != nil {
			s.log.Warn("writer lease not released; it lapses by itself", "rule", h.db+"."+h.coll, "err", err.Error())
		}
	}
}
