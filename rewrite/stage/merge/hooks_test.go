package merge_test

import (
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rewrite/stage/merge"
)

// hooks is a merge.Host of a test's choosing: a nil func answers as
// merge.NoHost does.
type hooks struct {
	merge.NoHost
	due          func(stage.Collection) bool
	lock         func([]bucket.Key) func()
	oneScanBeats func(int) bool
	kept         func(stage.Collection) ([][]byte, string, bool)
	reserve      func(stage.Collection) (string, bool)
	renamed      func(name string, ok bool, marker string)
}

func (h *hooks) Due(c stage.Collection) bool { return h.due != nil && h.due(c) }

func (h *hooks) LockBuckets(keys []bucket.Key) func() {
	if h.lock == nil {
		return func() {}
	}
	return h.lock(keys)
}

func (h *hooks) OneScanBeats(n int) (beats, known bool) {
	if h.oneScanBeats == nil {
		return false, false
	}
	return h.oneScanBeats(n), true
}

func (h *hooks) TakeKept(r stage.Collection) ([][]byte, string, bool) {
	if h.kept == nil {
		return nil, "", false
	}
	return h.kept(r)
}

func (h *hooks) ReserveSpare(r stage.Collection) (string, bool) {
	if h.reserve == nil {
		return "", false
	}
	return h.reserve(r)
}

func (h *hooks) SpareRenamed(name string, ok bool, marker string) {
	if h.renamed != nil {
		h.renamed(name, ok, marker)
	}
}
