package rules

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"time"
)

// Ingest modes of a rule (its "ingest" key). A staged rule's small groups
// of events are inserted into staging collections and merged into complete
// buckets later (rewrite/stage); a direct rule's join the open bucket with
// an update. The upstreams this proxy is tested on rewrite a whole document
// on every update, which makes the direct path cost grow with the bucket;
// MongoDB updates in place. IngestAuto picks per upstream.
const (
	IngestAuto   = "auto"
	IngestStaged = "staged"
	IngestDirect = "direct"
)

// Staging defaults and bounds.
const (
	// DefaultIngest is the ingest mode of a rule that sets none.
	DefaultIngest = IngestAuto
	// DefaultMergeAfter is how long a staging collection must have taken
	// no new event before the proxy merges it by itself. A window that
	// is written to all along is merged once it closes (nothing lands in
	// it any more) and this long has passed.
	DefaultMergeAfter = 30 * time.Second
	// MinMergeAfter keeps the merger from turning every few events into
	// a bucket of their own.
	MinMergeAfter = 100 * time.Millisecond
	// DefaultMaxStaged bounds the events one proxy holds staged for a
	// rule, not yet frozen for a merge: past it the rule's staged inserts
	// on that proxy wait for the merge (backpressure), so a merge that
	// falls behind, or fails, slows the inserts instead of letting
	// staging grow without bound.
	DefaultMaxStaged = 200_000
	// MinMaxStaged keeps maxStaged above a useful merge batch.
	MinMaxStaged = 1_000
	// StagePrefix begins the name of every staging collection.
	StagePrefix = "tsproxy_stage_"
)

// Staged says whether rule's events are staged on an upstream whose
// updates rewrite whole documents (costlyUpdates): always for
// IngestStaged, on such upstreams for IngestAuto. An events rule that is
// partitioned writes directly. The counter and slots layouts stage only
// on such upstreams (FerretDB), with IngestAuto or IngestStaged: their
// merge counts on the writer lease those upstreams have, and elsewhere
// (MongoDB) their upserts are atomic and cost no more than an insert.
func (r *Rule) Staged(costlyUpdates bool) bool {
	switch {
	case r.SlotLayout():
		return costlyUpdates && r.Ingest != IngestDirect
	case r.Layout != LayoutEvents || r.Partitioned():
		return false
	}
	switch r.Ingest {
	case IngestStaged:
		return true
	case IngestDirect:
		return false
	}
	return costlyUpdates
}

// StagePeriod is the stretch of event time one staging collection
// holds: a day, or the rule's span when that is longer. Fewer, larger
// staging collections than one per window: creating and dropping a
// collection costs FerretDB a table, and a backfill touches many windows.
func (r *Rule) StagePeriod() time.Duration { return max(r.Span, 24*time.Hour) }

// StageCollection is the staging collection of the events whose window
// starts at windowStart (ms since the epoch): StagePrefix(), then the
// start of its staging period.
func (r *Rule) StageCollection(windowStart int64) string {
	return r.StagePrefix() + strconv.FormatInt(FloorMillis(windowStart, r.StagePeriod().Milliseconds()), 10)
}

// StagePrefix begins the names of the rule's staging collections:
// tsproxy_stage_<12 hex digits of the bucket collection's SHA-256>_.
// The names hold no dot because FerretDB renames (which a merge does,
// rewrite/stage) only collections whose names have none.
func (r *Rule) StagePrefix() string {
	if r.stagePrefixOf == r.BucketCollection && r.stagePrefix != "" {
		return r.stagePrefix
	}
	return stagePrefixOf(r.BucketCollection)
}

func stagePrefixOf(bucketCollection string) string {
	sum := sha256.Sum256([]byte(bucketCollection))
	return StagePrefix + hex.EncodeToString(sum[:6]) + "_"
}

// IDIndexCollection holds the rule's event-id index (rewrite/bucket's
// IDIndexEntry): in the staging tier's names, so it is hidden and
// dropped with them.
func (r *Rule) IDIndexCollection() string { return r.StagePrefix() + "ids" }

// UpdateJournalCollection holds the rule's update journal (rewrite/updates):
// in the staging tier's names, so it is hidden and dropped with them.
func (r *Rule) UpdateJournalCollection() string { return r.StagePrefix() + "journal" }

// ingest decodes ingest, mergeAfter and maxStaged of the rule at path p.
func (d *decoder) ingest(p string, m map[string]any, r *Rule) {
	k := func(name string) string { return p + "." + name }
	r.Ingest = DefaultIngest
	r.MergeAfter = DefaultMergeAfter
	r.MaxStaged = DefaultMaxStaged
	if v := field(m, "maxStaged"); v != nil {
		if n := d.intIn(k("maxStaged"), v, MinMaxStaged, 1<<31-1); n > 0 {
			r.MaxStaged = n
		}
	}
	if v := field(m, "ingest"); v != nil {
		s, _ := v.(string)
		switch s {
		case IngestAuto, IngestStaged, IngestDirect:
			r.Ingest = s
		default:
			d.fail(k("ingest"), "%s is not an ingest mode; use %s, %s or %s", show(v), IngestAuto, IngestStaged, IngestDirect)
		}
		if s == IngestStaged && r.Layout != LayoutEvents {
			// The layouts stage where it pays (FerretDB) with auto, and
			// update in place elsewhere: forcing staging has no use.
			d.fail(k("ingest"), "%s applies only to layout %s, not %s (layout %s stages on FerretDB with %s, the default)", IngestStaged, LayoutEvents, r.Layout, r.Layout, IngestAuto)
		}
		if s == IngestStaged && field(m, "partitionBy") != nil {
			d.fail(k("ingest"), "%s cannot be combined with partitionBy yet", IngestStaged)
		}
	}
	if v := field(m, "mergeAfter"); v != nil {
		dur := d.lifecycleDuration(k("mergeAfter"), v)
		switch {
		case !d.ok(k("mergeAfter")):
		case dur < MinMergeAfter:
			d.fail(k("mergeAfter"), "%s is less than %s", show(v), MinMergeAfter)
		default:
			r.MergeAfter = dur
		}
	}
}
