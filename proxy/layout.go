package proxy

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/tsproxy/tsproxy/rewrite/admin"
	"github.com/tsproxy/tsproxy/rewrite/insert"
	"github.com/tsproxy/tsproxy/rewrite/layout"

	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/cursor"

	"github.com/tsproxy/tsproxy/rewrite/bucket"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/wire"
)

// handleLayout serves a command on a namespace whose rule has layout
// counter or slots (see rewrite/counter*.go and rewrite/slots.go).
func (c *conn) handleLayout(req *request, rule *rules.Rule) error {
	switch req.name {
	case "insert":
		return c.answerRefusal(req, c.layoutInsert(req, rule))
	case "find", "aggregate", "count":
		return c.servePlan(req, rule, routeRewrite, layout.ReadPlan(req.msg.Body, rule, newCursorID))
	case "getMore":
		return c.rewriteGetMore(req, rule)
	case "killCursors":
		return c.rewriteKillCursors(req, rule)
	case "drop":
		return c.servePlan(req, rule, routeRewrite, admin.Drop(req.msg.Body, rule))
	}
	if req.msg.Flags&wire.MoreToCome != 0 {
		return nil
	}
	return c.replyError(req, mongoerr.NotImplemented,
		fmt.Sprintf("tsproxy rule %s: command %q is not supported on a namespace with layout %s", rule.Namespace, req.name, rule.Layout))
}

// layoutInsert counts (counter) or stores (slots) the events of an
// insert. Slots writes read the buckets they touch first, under the
// proxy's lock of their keys, to keep num_samples exact when a slot is
// written again.
func (c *conn) layoutInsert(req *request, rule *rules.Rule) error {
	unacked := req.msg.Flags&wire.MoreToCome != 0
	caps, err := c.startWrite(rule)
	if err != nil {
		return err
	}
	c.ensureBucketIndex(rule)
	cmd := commandOf(req)
	refuse := func(err error) error { return c.refuseBeforeWrite(req, rule, err, c.replyRewriteError) }
	span := c.s.tel.startCommand(req, routeRewrite)
	t0 := time.Now()
	var plan *layout.LayoutWrite
	// The keys are locked for counters too: on an upstream whose updates
	// are not isolated (FerretDB), two $inc upserts of one bucket at once
	// lose an increment, or both try to create it and one fails on its
	// _id.
	keys, err := insert.InsertKeys(cmd, rule)
	if err != nil {
		span.end(req, time.Since(t0), nil)
		return refuse(err)
	}
	locked := c.s.state.bucketCache().lock(rule.BucketNamespace(), keys)
	defer locked.unlock()
	if rule.Layout == rules.LayoutCounter {
		var upErr error
		if plan, err, upErr = c.counterPlan(cmd, rule, caps); upErr != nil {
			span.end(req, time.Since(t0), upErr)
			return upErr
		}
	} else {
		var before map[string]bson.Raw
		if before, err = c.slotsBefore(rule, keys); err != nil {
			span.end(req, time.Since(t0), err)
			return refuse(err)
		}
		plan, err = layout.SlotsInsert(cmd, rule, layout.SlotsOptions{Caps: caps,
			Before: func(k bucket.Key) []byte { return before[k.String()] }})
	}
	if err != nil {
		span.end(req, time.Since(t0), nil)
		return refuse(err)
	}
	replies := make([][]byte, 0, len(plan.Commands))
	for i, cmd := range plan.Commands {
		body, err := c.roundTripInSlot(c.commandFrame(cmd), caps.MaxUpdateStatements > 0)
		if err != nil {
			span.end(req, time.Since(t0), err)
			return err
		}
		replies = append(replies, body)
		if !plan.Continue(i, body) {
			break
		}
	}
	span.end(req, time.Since(t0), nil)
	if !unacked {
		if err := c.replyBody(req, plan.Reply(replies)); err != nil {
			return err
		}
	}
	if rule.LayoutOptions.Preallocate {
		c.preallocate(rule, keys)
	}
	return nil
}

// slotsBefore reads the buckets of keys as stored, by point lookups.
func (c *conn) slotsBefore(rule *rules.Rule, keys []bucket.Key) (map[string]bson.Raw, error) {
	out := make(map[string]bson.Raw, len(keys))
	for i, q := range layout.SlotsFetch(rule, keys) {
		reply, err := c.upCommand(q)
		if err != nil {
			return nil, err
		}
		doc, err := cursor.First(reply)
		if err != nil {
			return nil, fmt.Errorf("tsproxy rule %s: reading a bucket before writing it: %w", rule.Namespace, err)
		}
		if doc != nil {
			out[keys[i].String()] = bson.Raw(doc)
		}
	}
	return out, nil
}

// shellMemory remembers the (bucket namespace, series, window) shells a
// proxy inserted, so that each is tried once. It is bounded: past
// maxPreallocated it starts over (a shell tried again only meets a
// duplicate key).
type shellMemory struct {
	mu   sync.Mutex
	seen map[string]bool
}

const maxPreallocated = 100_000

func newShellMemory() *shellMemory { return &shellMemory{seen: map[string]bool{}} }

// claim returns the keys of keys not tried yet, and marks them tried.
func (m *shellMemory) claim(ns string, keys []bucket.Key) []bucket.Key {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.seen) > maxPreallocated {
		m.seen = map[string]bool{}
	}
	var out []bucket.Key
	for _, k := range keys {
		name := ns + "\x00" + k.String()
		if !m.seen[name] {
			m.seen[name] = true
			out = append(out, k)
		}
	}
	return out
}

// forget forgets the shells of a dropped bucket collection, so the windows
// written after the drop get theirs again.
func (m *shellMemory) forget(ns string) {
	prefix := ns + "\x00"
	m.mu.Lock()
	defer m.mu.Unlock()
	for k := range m.seen {
		if strings.HasPrefix(k, prefix) {
			delete(m.seen, k)
		}
	}
}

// preallocate inserts the zero-filled buckets of the window after each
// written one, once the client has its reply, on the client's connection
// and so with its privileges. A shell that exists already (the window was
// written first) fails with a duplicate key and is left alone: an insert
// never overwrites. Failures are logged; the writes stay correct without
// shells.
func (c *conn) preallocate(rule *rules.Rule, keys []bucket.Key) {
	win := rule.LayoutOptions.Window.Milliseconds()
	next := make([]bucket.Key, len(keys))
	for i, k := range keys {
		next[i] = bucket.Key{Meta: k.Meta, Start: k.Start + win}
	}
	var shells []any
	for _, k := range c.s.shells.claim(rule.BucketNamespace(), next) {
		shells = append(shells, bson.Raw(layout.SlotsShellOf(rule, k)))
	}
	if len(shells) == 0 {
		return
	}
	reply, err := c.up.Command(bson.D{
		{Key: "insert", Value: rule.BucketCollection},
		{Key: "documents", Value: shells},
		{Key: "ordered", Value: false},
		{Key: "$db", Value: rule.DB},
	})
	if err != nil {
		c.log.Warn("preallocating slots buckets failed", "rule", rule.Namespace, "err", err.Error())
		return
	}
	n, _ := reply.Lookup("n").AsInt64OK()
	c.log.Debug("slots buckets preallocated", "rule", rule.Namespace, "inserted", n, "tried", len(shells))
}

// writeIDs remembers the write ids of the retryable counter inserts this
// proxy saw (see rewrite/layout/counter_retry.go), to recognise a
// driver's retry: a write id seen before is checked against its buckets'
// marks. Until checkAllUntil (the proxy's start, or forgetting ids under
// load) an unseen id may be a retry of a write sent to a proxy that is
// gone, so every write is checked.
type writeIDs struct {
	mu            sync.Mutex
	seen          map[string]time.Time
	checkAllUntil time.Time
}

func newWriteIDs(start time.Time) *writeIDs {
	return &writeIDs{seen: map[string]time.Time{}, checkAllUntil: start.Add(layout.MarkerLife)}
}

// maxCounterWrites bounds that memory; past it, ids older than
// layout.MarkerLife are forgotten, then all if need be.
const maxCounterWrites = 200_000

// attempt says whether a write id must be checked for an earlier attempt,
// or is a retry too late to be checked (its marks may be gone).
func (w *writeIDs) attempt(id string, now time.Time) (check bool, late time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if first, ok := w.seen[id]; ok {
		// Some margin: the mark's period was picked when the first
		// attempt was planned, and it reached the upstream later.
		if age := now.Sub(first); age > layout.MarkerLife-time.Second {
			return false, age
		}
		return true, 0
	}
	if len(w.seen) >= maxCounterWrites {
		for k, t := range w.seen {
			if now.Sub(t) > layout.MarkerLife {
				delete(w.seen, k)
			}
		}
		if len(w.seen) >= maxCounterWrites {
			w.seen = map[string]time.Time{}
			w.checkAllUntil = now.Add(layout.MarkerLife)
		}
	}
	w.seen[id] = now
	return now.Before(w.checkAllUntil), 0
}

// counterPlan plans a counter insert; a retryable one the upstream cannot
// recognise as a retry carries its write id's mark, and is checked
// against its buckets' marks when it may be a retry. err is answered to
// the client; upErr (the upstream failed) closes the connection.
func (c *conn) counterPlan(cmd rewrite.Command, rule *rules.Rule, caps caps.Upstream) (plan *layout.LayoutWrite, err, upErr error) {
	now := time.Now()
	opts := layout.CounterOptions{Caps: caps, WriteID: layout.CounterWriteID(cmd, caps), Now: now.UnixMilli()}
	if opts.WriteID == "" {
		plan, err = layout.CounterInsertWith(cmd, rule, opts)
		return plan, err, nil
	}
	check, late := c.s.writes.attempt(opts.WriteID, now)
	if late > 0 {
		return nil, layout.CounterRetryTooLate(rule.Namespace, late), nil
	}
	plan, err = layout.CounterInsertWith(cmd, rule, opts)
	if err != nil || !check {
		return plan, err, nil
	}
	applied := map[[12]byte]bool{}
	for _, id := range plan.Buckets {
		reply, err := c.upCommand(layout.CounterMarkFetch(rule.BucketCollection, rule.DB, id))
		if err != nil {
			return nil, nil, err
		}
		doc, err := cursor.First(reply)
		if err != nil {
			return nil, fmt.Errorf("tsproxy rule %s: reading a bucket's marks for a retried insert: %w", rule.Namespace, err), nil
		}
		if doc != nil && layout.CounterHasMark(doc, opts.WriteID) {
			applied[id] = true
		}
	}
	if len(applied) == 0 {
		return plan, nil, nil
	}
	c.log.Info("retried counter insert: statements applied by its first attempt left out", "rule", rule.Namespace, "applied", len(applied), "of", len(plan.Buckets))
	opts.Applied = func(id [12]byte) bool { return applied[id] }
	plan, err = layout.CounterInsertWith(cmd, rule, opts)
	return plan, err, nil
}
