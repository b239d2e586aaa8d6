package proxy

import (
	"context"
	"errors"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/proxy/lease"
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/source"
	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/upstream"
)

// mergeLoop merges rule's quiet staging collections until ctx ends.
func (s *Server) mergeLoop(ctx context.Context, rule *rules.Rule) {
	interval := min(max(rule.MergeAfter/4, 50*time.Millisecond), time.Second)
	conn := newBackgroundConn(ctx, s) // background.go
	defer conn.close()
	t := time.NewTicker(interval)
	defer t.Stop()
	var watched time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !s.servedHere(rule) { // loops.go
			if time.Since(watched) < untouchedMergeCheck {
				continue
			}
			watched = time.Now()
		}
		up, err := conn.get()
		if err != nil {
			continue
		}
		_, err = s.mergeOnce(up, rule)
		// A connection per round, not kept between rounds: an idle
		// background merger holds no upstream connection.
		conn.close()
		if err != nil && ctx.Err() == nil {
			var held *lease.HeldError
			if !errors.As(err, &held) { // another proxy merges this rule
				s.log.Warn("staging: background merge failed; will retry", "rule", rule.Namespace, "err", err.Error())
			}
		}
	}
}

// mergeOnce is one background round: merge the due staging collections.
func (s *Server) mergeOnce(up *upstream.Conn, rule *rules.Rule) (stage.Stats, error) {
	reply, err := up.Command(bson.D{{Key: "buildInfo", Value: 1}, {Key: "$db", Value: "admin"}})
	if err != nil {
		return stage.Stats{}, upstreamFailure{err: err}
	}
	upCaps := caps.Detect(reply)
	if !rule.Staged(upCaps.CostlyUpdates) {
		return stage.Stats{}, nil
	}
	list, err := up.Command(bson.Raw(source.ListCommand(rule.DB)))
	if err != nil {
		return stage.Stats{}, upstreamFailure{err: err}
	}
	if work, err := stage.HasWork(rule, list); err != nil || !work {
		return stage.Stats{}, err
	}
	if !s.routesRule(rule) {
		// A created collection being dropped: merging now would write
		// buckets the drop has removed, or is about to (the read of the
		// catalog this needed also stops this loop).
		return stage.Stats{}, nil
	}
	now := time.Now()
	if upCaps.SingleWriter {
		if err := s.leases.Ensure(up, rule.DB, rule.Collection, s.log); err != nil {
			return stage.Stats{}, err
		}
	}
	st, err := s.runMerge(upRunner{up: up}, rule, stage.MergeOptions{Due: s.merges.due(rule, now), Now: now, CheckLate: s.lateDocsPossible(rule, upCaps)}, true)
	if err != nil || len(st.Markers) == 0 {
		return st, err
	}
	// Flush requests of proxies that cannot merge: everything, then the
	// requests seen before this merge began are answered.
	if _, err := s.runMerge(upRunner{up: up}, rule, stage.MergeOptions{All: true, CheckLate: s.lateDocsPossible(rule, upCaps)}, false); err != nil {
		return st, err
	}
	for _, marker := range st.Markers {
		if _, err := drive(upRunner{up: up}, rewrite.Passthrough(source.DropCommand(rule.DB, marker), nil)); err != nil {
			return st, upstreamFailure{err: err}
		}
	}
	return st, nil
}
