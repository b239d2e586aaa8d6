package tier

import (
	"time"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/read"
	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rewrite/stage/merge"
	"github.com/tsproxy/tsproxy/rules"
)

// mergeHost is the merge.Host of one merge of rule: what the tier keeps,
// asked between the merge's steps. It does no I/O; the spares a merge
// made are cleaned by the tier after the merge (cleanRenamed).
type mergeHost struct {
	t    *Tier
	rule *rules.Rule
	// due says which staging collections are due (State.Due); nil: none.
	due func(stage.Collection) bool
	// lookups is how the merge reads buckets by _id; unset: not measured
	// (a guest's merge).
	lookups    read.IDLookupCost
	hasLookups bool
	// kept: the merge takes what the proxy kept of its inserts; locks:
	// it locks keys and claims shells as the rule's deletes do.
	kept, locks bool
	// recycle: the merge keeps the collections it merged as spares.
	recycle bool
	// renamed collects the spares the merge made, for cleanRenamed
	// (shared by copies of the host).
	renamed *[]spareMade
}

// spareMade is a spare a merge renamed a collection to, to be cleaned.
type spareMade struct{ name, marker string }

// hostOf is opts' merge host, made for rule when the caller gave none.
func (t *Tier) hostOf(opts *merge.MergeOptions, rule *rules.Rule) *mergeHost {
	if h, ok := opts.Host.(*mergeHost); ok {
		return h
	}
	h := &mergeHost{t: t, rule: rule, renamed: new([]spareMade)}
	if opts.Host == nil {
		opts.Host = h
	}
	return h
}

// withoutDue is h with no staging collection due.
func (h *mergeHost) withoutDue() *mergeHost {
	c := *h
	c.due = nil
	return &c
}

func (h *mergeHost) Due(c stage.Collection) bool { return h.due != nil && h.due(c) }

func (h *mergeHost) LockBuckets(keys []bucket.Key) func() {
	if !h.locks {
		return func() {}
	}
	return h.t.host.LockBuckets(h.rule.BucketNamespace(), keys)
}

func (h *mergeHost) OneScanBeats(n int) (beats, known bool) {
	return h.hasLookups && h.lookups.OneScanBeats(n), h.hasLookups
}

func (h *mergeHost) ClaimShells(keys []bucket.Key) []bucket.Key {
	if !h.locks {
		return nil
	}
	return h.t.host.ClaimShells(h.rule.BucketNamespace(), keys)
}

func (h *mergeHost) TakeKept(r stage.Collection) ([][]byte, string, bool) {
	if !h.kept || h.t.kept == nil {
		return nil, "", false
	}
	return h.t.kept.take(h.rule.DB + "." + r.OpenName())
}

func (h *mergeHost) ReserveSpare(stage.Collection) (string, bool) {
	if !h.recycle || h.t.kept == nil {
		return "", false
	}
	return h.t.spares.reserve(h.rule, h.t.StagerTag(), time.Now())
}

func (h *mergeHost) SpareRenamed(name string, ok bool, marker string) {
	if h.t.spares.renamed(h.rule, name, ok, marker) {
		*h.renamed = append(*h.renamed, spareMade{name: name, marker: marker})
	}
}

// cleanRenamed cleans, off the caller's way, the spares h's merge made.
func (h *mergeHost) cleanRenamed() {
	for _, sp := range *h.renamed {
		go h.t.cleanSpare(h.rule, sp.name, sp.marker)
	}
	*h.renamed = nil
}

var _ merge.Host = (*mergeHost)(nil)
