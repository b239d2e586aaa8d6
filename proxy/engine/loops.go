package engine

import (
	"github.com/tsproxy/tsproxy/proxy/loops"
	"github.com/tsproxy/tsproxy/rules"
)

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

// NoteServed records that the proxy serves commands on rule's namespace.
func (s *Engine) NoteServed(rule *rules.Rule) {
	if rule.Declared != nil {
		if _, ok := s.served.Load(rule.Namespace); !ok {
			s.served.Store(rule.Namespace, struct{}{})
		}
	}
}

// newLoops is the background loops of the engine's rules.
func (s *Engine) newLoops() *loops.Loops {
	return loops.New(
		// Every rule that stages on some upstream (Staged(true): those
		// whose updates rewrite whole documents, FerretDB) has a merger;
		// its rounds skip a rule that does not stage on this one. The
		// counter and slots layouts had none: their staged events waited
		// for a read or a flush, and past maxStaged their inserts waited
		// for good (TestLayoutBackgroundMerge).
		loops.Kind{Name: "merge", For: func(r *rules.Rule) bool { return r.Staged(true) }, Run: s.tier.MergeLoop,
			// A rule gone (a created collection dropped): its figures go,
			// or every name a client ever created kept its series.
			Gone: s.Merges.ForgetFigures},
		loops.Kind{Name: "retain", For: (*rules.Rule).Expires, Run: s.retention.Run},
	)
}

// syncLoops makes the running loops those of set's rules.
func (s *Engine) syncLoops(set *rules.Set) { s.loops.Sync(set) }
