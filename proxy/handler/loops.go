package handler

import (
	"context"
	"fmt"
	"strings"

	"github.com/tsproxy/tsproxy/rules"
)

// The background loops of the rules: a merger for each rule that may
// stage, a retention loop for each rule with expireAfter. The rule set
// changes when apps create, change or drop time-series collections, so the
// loops follow it: syncLoops starts the loops of new
// rules, and stops and restarts those whose rule changed.

// servedHere reports whether the proxy's merger of rule runs at full
// pace: a config rule always; a created time-series collection once this
// proxy has served a command on it.
func (s *Engine) servedHere(rule *rules.Rule) bool {
	if rule.Declared == nil {
		return true
	}
	_, ok := s.served.Load(rule.Namespace)
	return ok
}

// noteServed records that the proxy serves commands on rule's namespace.
func (s *Engine) noteServed(rule *rules.Rule) {
	if rule.Declared != nil {
		if _, ok := s.served.Load(rule.Namespace); !ok {
			s.served.Store(rule.Namespace, struct{}{})
		}
	}
}

// ruleLoop is one running loop.
type ruleLoop struct {
	fingerprint string
	cancel      context.CancelFunc
}

// loopFingerprint is what, changed, restarts a rule's loops.
func loopFingerprint(r *rules.Rule) string {
	return fmt.Sprintf("%s|%s|%s|%d|%d|%t|%d|%d|%d|%s|%s", r.Namespace, r.BucketCollection, r.Layout, r.Span, r.ExpireAfter, r.ExpireAtWindowEnd, r.SweepInterval, r.MergeAfter, r.MaxStaged, r.Ingest, r.PartitionBy)
}

// syncLoops makes the running loops those of set's rules.
func (s *Engine) syncLoops(set *rules.Set) {
	s.mu.Lock()
	sw := s.sweep
	s.mu.Unlock()
	if sw == nil || sw.ctx == nil {
		return // not serving yet: startSweeper syncs
	}
	sw.mu.Lock()
	defer sw.mu.Unlock()
	if sw.stopped {
		return
	}
	want := map[string]func(ctx context.Context, rule *rules.Rule){}
	rulesByKey := map[string]rules.Rule{}
	for _, r := range set.All() {
		// Every rule that stages on some upstream (Staged(true): those
		// whose updates rewrite whole documents, FerretDB) has a merger;
		// mergeOnce skips a rule that does not stage on this one. The
		// counter and slots layouts had none: their staged events waited
		// for a read or a flush, and past maxStaged their inserts waited
		// for good (TestLayoutBackgroundMerge).
		if r.Staged(true) {
			want["merge "+r.Namespace] = s.tier.MergeLoop
			rulesByKey["merge "+r.Namespace] = r
		}
		if r.Expires() {
			want["retain "+r.Namespace] = s.retention.Run
			rulesByKey["retain "+r.Namespace] = r
		}
	}
	for key, l := range sw.running {
		r, ok := rulesByKey[key]
		if !ok || loopFingerprint(&r) != l.fingerprint {
			l.cancel()
			delete(sw.running, key)
		}
		if ns, merge := strings.CutPrefix(key, "merge "); merge && !ok {
			// A rule gone (a created collection dropped): its figures
			// go, or every name a client ever created kept its series.
			s.merges.ForgetFigures(ns)
		}
	}
	for key, run := range want {
		if _, ok := sw.running[key]; ok {
			continue
		}
		rule := rulesByKey[key]
		ctx, cancel := context.WithCancel(sw.ctx)
		sw.running[key] = ruleLoop{fingerprint: loopFingerprint(&rule), cancel: cancel}
		sw.wg.Add(1)
		go func() {
			defer sw.wg.Done()
			run(ctx, &rule)
		}()
	}
}
