package retention

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/tsproxy/tsproxy/proxy/exec"
	"github.com/tsproxy/tsproxy/proxy/tier/lease"
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/fanout"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/rollup"
	"github.com/tsproxy/tsproxy/rewrite/source"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/upstream"
)

// Host is what retention needs of the proxy it runs in.
type Host interface {
	// Background is an upstream connection of the proxy's own for one
	// loop, closed when ctx ends.
	Background(ctx context.Context) *exec.Background
	// TakeLease takes or renews the lease name of db; a
	// *lease.HeldError when another proxy holds it.
	TakeLease(up *upstream.Conn, db, name string) error
	// Routes says whether the proxy still routes by rule (a created
	// collection being dropped is not: its TTL index would create it
	// again).
	Routes(rule *rules.Rule) bool
	// BucketsDeleted tells the proxy that buckets of rule before cutoff
	// were deleted: what it knows of them is stale.
	BucketsDeleted(up *upstream.Conn, rule *rules.Rule, cutoff time.Time)
	// NamespaceDropped tells the proxy that a partition was dropped.
	NamespaceDropped(ns string)
	// LogDue says whether a warning keyed key is due, once every every.
	LogDue(key string, every time.Duration) bool
}

// Retainer runs the retention of rules, one loop per rule (Run).
type Retainer struct {
	host Host
	log  *slog.Logger
}

// New is a Retainer of the proxy host.
func New(host Host, log *slog.Logger) *Retainer { return &Retainer{host: host, log: log} }

// retention mode of one collection.
type retentionMode int

const (
	modeUnknown retentionMode = iota
	modeTTL                   // the upstream's TTL index expires documents
	modeSweep                 // the proxy deletes them
)

// Run keeps one rule's retention until ctx ends: right away, then every
// SweepInterval.
func (r *Retainer) Run(ctx context.Context, rule *rules.Rule) {
	interval := rule.SweepInterval
	if interval <= 0 {
		interval = rules.DefaultSweepInterval
	}
	modes := map[string]retentionMode{}
	conn := r.host.Background(ctx)
	defer conn.Close()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if up, err := conn.Get(); err != nil {
			if ctx.Err() == nil {
				r.log.Warn("retention: upstream unreachable; will retry", "rule", rule.Namespace, "err", err.Error())
			}
		} else if r.ownsRetention(up, rule) {
			err := r.retainOnce(up, rule, modes, time.Now())
			conn.EndRound(err)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				r.log.Error("retention: sweep failed; will retry", "rule", rule.Namespace, "err", err.Error())
			}
		} else {
			conn.Close()
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
func (r *Retainer) ownsRetention(up *upstream.Conn, rule *rules.Rule) bool {
	err := r.host.TakeLease(up, rule.DB, retentionLease(rule))
	var held *lease.HeldError
	switch {
	case err == nil:
		return true
	case errors.As(err, &held):
		return false
	}
	r.log.Warn("retention: lease not taken; will retry", "rule", rule.Namespace, "err", err.Error())
	return false
}

// retainOnce ensures the TTL index of each collection of the rule whose
// mode is not known yet, and sweeps the collections in modeSweep. The
// rule's buckets are retained wherever its source says they are
// (retainBuckets).
func (r *Retainer) retainOnce(up *upstream.Conn, rule *rules.Rule, modes map[string]retentionMode, now time.Time) error {
	if !r.host.Routes(rule) {
		return nil // a created collection being dropped: its TTL index would create it again
	}
	for _, e := range rollup.Expiries(rule) {
		if e.Collection == rule.BucketCollection {
			if err := r.retainBuckets(up, rule, e, modes, now); err != nil {
				return err
			}
			continue
		}
		if err := r.retainCollection(up, rule, e, modes, now); err != nil {
			return err
		}
	}
	return nil
}

// retainCollection is retainOnce for one collection.
func (r *Retainer) retainCollection(up *upstream.Conn, rule *rules.Rule, e rollup.Expiry, modes map[string]retentionMode, now time.Time) error {
	if modes[e.Collection] == modeUnknown {
		mode, why, err := ensureTTL(up, rule, e)
		if err != nil {
			return err
		}
		modes[e.Collection] = mode
		if mode == modeTTL {
			r.log.Info("retention: TTL index ensured", "rule", rule.Namespace, "collection", e.Collection, "expireAfter", rule.ExpireAfter.String())
		} else {
			r.log.Info("retention: the upstream has no TTL indexes; the proxy sweeps expired documents", "rule", rule.Namespace,
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
			r.host.BucketsDeleted(up, rule, e.Cutoff(rule, now))
		}
		r.log.Info("retention: expired documents deleted", "rule", rule.Namespace, "collection", e.Collection, "deleted", n)
	}
	return nil
}

// ensureTTL creates the TTL index of e. An upstream that refuses it
// (FerretDB v1.24: NotImplemented; MongoDB: an index on start with other
// options, or no privilege) gets swept instead, which removes exactly the
// same documents; why is returned for the log.
func ensureTTL(up *upstream.Conn, rule *rules.Rule, e rollup.Expiry) (mode retentionMode, why string, err error) {
	reply, err := exec.RunDoc(up, rollup.TTLIndexCommand(rule, e))
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
	reply, err := exec.RunDoc(up, rollup.SweepCommand(rule, e, e.Cutoff(rule, now)))
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
func (r *Retainer) retainBuckets(up *upstream.Conn, rule *rules.Rule, e rollup.Expiry, modes map[string]retentionMode, now time.Time) error {
	l := source.List(rule)
	if _, err := exec.Drive(exec.OnConn{Up: up}, l); err != nil {
		return err
	}
	for _, c := range l.Collections() {
		if !rule.Partitioned() {
			if err := r.retainCollection(up, rule, e, modes, now); err != nil {
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
				r.logLostPartition(rule, c.Name, res.Reply)
				delete(modes, c.Name)
				continue
			}
			if err == nil && !mongoerr.IsOK(res.Reply) && mongoerr.FromReply(res.Reply, "").Code != mongoerr.NamespaceNotFound {
				err = mongoerr.FromReply(res.Reply, "drop refused")
			}
			r.host.NamespaceDropped(rule.DB + "." + c.Name)
			if err != nil {
				return fmt.Errorf("tsproxy rule %s: drop partition %s: %w", rule.Namespace, c.Name, err)
			}
			delete(modes, c.Name)
			r.log.Info("retention: expired partition dropped", "rule", rule.Namespace, "collection", c.Name)
			continue
		}
		if modes[c.Name] == modeSweep && c.Start+rule.SpanMillis() > now.Add(-rule.ExpireAfter).UnixMilli() {
			continue // no bucket of it has expired yet: no delete to send
		}
		if err := r.retainCollection(up, fanout.Rule(rule, c.Name), rollup.Expiry{Collection: c.Name, Window: rule.Span}, modes, now); err != nil {
			return err
		}
	}
	return nil
}

// logLostPartition logs, once an hour per partition, an expired partition
// whose table FerretDB on PostgreSQL lost (killed while dropping it).
func (r *Retainer) logLostPartition(rule *rules.Rule, coll string, reply []byte) {
	if !r.host.LogDue(rule.DB+"."+coll, time.Hour) {
		return
	}
	r.log.Warn("retention: an expired partition cannot be dropped: its table is gone but FerretDB's catalog still lists it (FerretDB on PostgreSQL killed while dropping it); reads that reach it fail until its entry is deleted from PostgreSQL's _ferretdb_database_metadata",
		"rule", rule.Namespace, "collection", coll, "err", mongoerr.ReplyError(reply).Error())
}
