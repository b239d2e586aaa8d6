package proxy

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tsproxy/tsproxy/proxy/exec"
	"github.com/tsproxy/tsproxy/proxy/lease"
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/fanout"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/rollup"
	"github.com/tsproxy/tsproxy/rewrite/source"

	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/upstream"
)

// Retention (a rule's expireAfter). Each collection that ages out (the
// bucket collection and the rollup collections, see rollup.Expiries) is
// first given a TTL index on start with expireAfterSeconds = expireAfter +
// the document's window, so MongoDB removes expired documents itself. An
// upstream that refuses TTL indexes (FerretDB v1.24 answers NotImplemented)
// is swept by the proxy instead: every sweepInterval, a delete of
// {start: {$lt: now - expireAfter - window}}. Either way no end field is
// stored: start plus the window is the end.
//
// The sweeper runs on connections of its own, dialled like the clients'
// (so with the credentials of the upstream URI, if any), one goroutine per
// rule with expireAfter; in a fleet, only the proxy holding the rule's
// retention lease sweeps (ownsRetention).

// sweeper runs the background loops of every rule: retention
// where it has expireAfter, merges where it stages.
type sweeper struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	running map[string]ruleLoop // by loop kind and namespace
	stopped bool
}

// startSweeper starts the background loops once; Shutdown stops them.
func (s *Server) startSweeper() {
	s.mu.Lock()
	if s.sweep != nil || s.closing.Load() {
		s.mu.Unlock()
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.sweep = &sweeper{ctx: ctx, cancel: cancel, running: map[string]ruleLoop{}}
	s.mu.Unlock()
	s.syncLoops(s.rules())
}

// stopSweeper stops the background loops and waits for them (a sweep in
// progress ends with its connection).
func (s *Server) stopSweeper() {
	s.mu.Lock()
	sw := s.sweep
	if sw == nil {
		s.sweep = &sweeper{stopped: true, cancel: func() {}} // a later startSweeper does nothing
	}
	s.mu.Unlock()
	if sw != nil {
		sw.mu.Lock()
		sw.stopped = true
		sw.mu.Unlock()
		sw.cancel()
		sw.wg.Wait()
	}
}

// retention mode of one collection.
type retentionMode int

const (
	modeUnknown retentionMode = iota
	modeTTL                   // the upstream's TTL index expires documents
	modeSweep                 // the proxy deletes them
)

// retain keeps one rule's retention until ctx ends: right away, then every
// SweepInterval.
func (s *Server) retain(ctx context.Context, rule *rules.Rule) {
	interval := rule.SweepInterval
	if interval <= 0 {
		interval = rules.DefaultSweepInterval
	}
	modes := map[string]retentionMode{}
	conn := newBackgroundConn(ctx, s)
	defer conn.close()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if up, err := conn.get(); err != nil {
			if ctx.Err() == nil {
				s.log.Warn("retention: upstream unreachable; will retry", "rule", rule.Namespace, "err", err.Error())
			}
		} else if s.ownsRetention(up, rule) {
			err := s.retainOnce(up, rule, modes, time.Now())
			conn.endRound(err)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				s.log.Error("retention: sweep failed; will retry", "rule", rule.Namespace, "err", err.Error())
			}
		} else {
			conn.close()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// retentionLease names the lease of a rule's retention ("$" is in no
// collection name, so it names no rule's writer lease).
func retentionLease(rule *rules.Rule) string { return rule.Collection + "$retention" }

// ownsRetention says whether this proxy runs rule's retention now: the
// one holding the rule's retention lease, taken or renewed here. The
// proxies of a fleet all run the loop; one of them sweeps (or drops
// expired partitions) at a time, and when it dies its lease lapses and
// the next proxy's loop takes it (within a lease lifetime plus one
// interval). Not the writer lease: that one is the merger's, and a sweep
// must not keep a direct writer on another proxy waiting.
func (s *Server) ownsRetention(up *upstream.Conn, rule *rules.Rule) bool {
	err := s.leases.Ensure(up, rule.DB, retentionLease(rule), s.log)
	var held *lease.HeldError
	switch {
	case err == nil:
		return true
	case errors.As(err, &held):
		return false
	}
	s.log.Warn("retention: lease not taken; will retry", "rule", rule.Namespace, "err", err.Error())
	return false
}

// retainOnce ensures the TTL index of each collection of the rule whose
// mode is not known yet, and sweeps the collections in modeSweep. The
// rule's buckets are retained wherever its source says they are
// (retainBuckets).
func (s *Server) retainOnce(up *upstream.Conn, rule *rules.Rule, modes map[string]retentionMode, now time.Time) error {
	if !s.routesRule(rule) {
		return nil // a created collection being dropped: its TTL index would create it again
	}
	for _, e := range rollup.Expiries(rule) {
		if e.Collection == rule.BucketCollection {
			if err := s.retainBuckets(up, rule, e, modes, now); err != nil {
				return err
			}
			continue
		}
		if err := s.retainCollection(up, rule, e, modes, now); err != nil {
			return err
		}
	}
	return nil
}

// retainCollection is retainOnce for one collection.
func (s *Server) retainCollection(up *upstream.Conn, rule *rules.Rule, e rollup.Expiry, modes map[string]retentionMode, now time.Time) error {
	if modes[e.Collection] == modeUnknown {
		mode, why, err := ensureTTL(up, rule, e)
		if err != nil {
			return err
		}
		modes[e.Collection] = mode
		if mode == modeTTL {
			s.log.Info("retention: TTL index ensured", "rule", rule.Namespace, "collection", e.Collection, "expireAfter", rule.ExpireAfter.String())
		} else {
			s.log.Info("retention: the upstream has no TTL indexes; the proxy sweeps expired documents", "rule", rule.Namespace,
				"collection", e.Collection, "expireAfter", rule.ExpireAfter.String(), "interval", rule.SweepInterval.String(), "ttl", why)
		}
	}
	if modes[e.Collection] != modeSweep {
		return nil
	}
	n, err := sweepOnce(up, rule, e, now)
	if err != nil {
		return err
	}
	if n > 0 {
		if e.Collection == rule.BucketCollection {
			// The fills of the swept (series, window) keys are stale;
			// the next insert of any key loads its fill again.
			s.state.forgetBuckets(rule.BucketNamespace())
			s.dirs.Wrote(rule.BucketNamespace())
			s.sweepIDIndex(up, rule, e.Cutoff(rule, now))
		}
		s.log.Info("retention: expired documents deleted", "rule", rule.Namespace, "collection", e.Collection, "deleted", n)
	}
	return nil
}

// ensureTTL creates the TTL index of e. An upstream that refuses it
// (FerretDB v1.24: NotImplemented; MongoDB: an index on start with other
// options, or no privilege) gets swept instead, which removes exactly the
// same documents; why is returned for the log.
func ensureTTL(up *upstream.Conn, rule *rules.Rule, e rollup.Expiry) (mode retentionMode, why string, err error) {
	reply, err := up.Command(rollup.TTLIndexCommand(rule, e))
	if err != nil {
		return modeUnknown, "", fmt.Errorf("create TTL index on %s.%s: %w", rule.DB, e.Collection, err)
	}
	if err := upstream.CommandError(reply); err != nil {
		return modeSweep, err.Error(), nil
	}
	return modeTTL, "", nil
}

// sweepOnce deletes e's expired documents and returns how many.
func sweepOnce(up *upstream.Conn, rule *rules.Rule, e rollup.Expiry, now time.Time) (int64, error) {
	reply, err := up.Command(rollup.SweepCommand(rule, e, e.Cutoff(rule, now)))
	if err != nil {
		return 0, fmt.Errorf("sweep %s.%s: %w", rule.DB, e.Collection, err)
	}
	if err := upstream.CommandError(reply); err != nil {
		return 0, fmt.Errorf("sweep %s.%s: %w", rule.DB, e.Collection, err)
	}
	n, _ := reply.Lookup("n").AsInt64OK()
	return n, nil
}

// retainBuckets retains every collection of the rule's buckets
// (rewrite/source): a partition whose every bucket has expired is dropped
// whole; the others (and an unpartitioned rule's bucket collection) get
// their TTL index or are swept, so that the expired buckets of the partly
// expired period go too.
func (s *Server) retainBuckets(up *upstream.Conn, rule *rules.Rule, e rollup.Expiry, modes map[string]retentionMode, now time.Time) error {
	l := source.List(rule)
	if _, err := exec.Drive(exec.OnConn{Up: up}, l); err != nil {
		return err
	}
	for _, c := range l.Collections() {
		if !rule.Partitioned() {
			if err := s.retainCollection(up, rule, e, modes, now); err != nil {
				return err
			}
			continue
		}
		if rule.PartitionExpired(c.Start, now) {
			res, err := exec.Drive(exec.OnConn{Up: up}, rewrite.Passthrough(source.DropCommand(rule.DB, c.Name), nil))
			if err == nil && mongoerr.DroppedUnderQueryReply(res.Reply) {
				// A drop of it cut between its two statements on
				// FerretDB over PostgreSQL left a catalog entry without
				// a table, which FerretDB can never drop: retention goes
				// on with the next partitions.
				s.logLostPartition(rule, c.Name, res.Reply)
				delete(modes, c.Name)
				continue
			}
			if err == nil && !mongoerr.IsOK(res.Reply) && mongoerr.FromReply(res.Reply, "").Code != mongoerr.NamespaceNotFound {
				err = mongoerr.FromReply(res.Reply, "drop refused")
			}
			s.forgetNamespace(rule.DB + "." + c.Name)
			if err != nil {
				return fmt.Errorf("tsproxy rule %s: drop partition %s: %w", rule.Namespace, c.Name, err)
			}
			delete(modes, c.Name)
			s.log.Info("retention: expired partition dropped", "rule", rule.Namespace, "collection", c.Name)
			continue
		}
		if modes[c.Name] == modeSweep && c.Start+rule.SpanMillis() > now.Add(-rule.ExpireAfter).UnixMilli() {
			continue // no bucket of it has expired yet: no delete to send
		}
		if err := s.retainCollection(up, fanout.Rule(rule, c.Name), rollup.Expiry{Collection: c.Name, Window: rule.Span}, modes, now); err != nil {
			return err
		}
	}
	return nil
}

// logLostPartition logs, once an hour per partition, an expired partition
// whose table FerretDB on PostgreSQL lost (killed while dropping it).
func (s *Server) logLostPartition(rule *rules.Rule, coll string, reply []byte) {
	if !s.orphanLogDue(rule.DB+"."+coll, time.Hour) {
		return
	}
	s.log.Warn("retention: an expired partition cannot be dropped: its table is gone but FerretDB's catalog still lists it (FerretDB on PostgreSQL killed while dropping it); reads that reach it fail until its entry is deleted from PostgreSQL's _ferretdb_database_metadata",
		"rule", rule.Namespace, "collection", coll, "err", mongoerr.ReplyError(reply).Error())
}
