package rules

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Partitioning (a rule's partitionBy): the buckets of a rule are written
// into one collection per calendar period (UTC) instead of one bucket
// collection, so that retention drops whole collections. The partition of
// a bucket is the period holding its window start; its collection is the
// rule's bucket collection plus the period's suffix:
//
//	month: <bucketCollection>_2026_11
//	day:   <bucketCollection>_2026_11_22
//
// The rule's BucketCollection itself is then never written.

// Partition periods a rule may choose.
const (
	PartitionMonth = "month"
	PartitionDay   = "day"
)

// partitionSuffixMax is the longest suffix of any period ("_YYYY_MM_DD"),
// for the namespace length check at config time.
const partitionSuffixMax = len("_2006_01_02")

// Partitioned reports whether the rule writes one collection per period.
func (r *Rule) Partitioned() bool { return r.PartitionBy != "" }

// PartitionStart is the start of the period (UTC) holding ms, in ms since
// the Unix epoch.
func PartitionStart(by string, ms int64) int64 {
	t := time.UnixMilli(ms).UTC()
	if by == PartitionDay {
		return time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC).UnixMilli()
	}
	return time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC).UnixMilli()
}

// PartitionEnd is the start of the period after the one starting at start.
func PartitionEnd(by string, start int64) int64 {
	t := time.UnixMilli(start).UTC()
	if by == PartitionDay {
		return t.AddDate(0, 0, 1).UnixMilli()
	}
	return t.AddDate(0, 1, 0).UnixMilli()
}

// PartitionCollection is the collection holding the buckets whose window
// starts at windowStart (ms).
func (r *Rule) PartitionCollection(windowStart int64) string {
	t := time.UnixMilli(PartitionStart(r.PartitionBy, windowStart)).UTC()
	if r.PartitionBy == PartitionDay {
		return fmt.Sprintf("%s_%04d_%02d_%02d", r.BucketCollection, t.Year(), int(t.Month()), t.Day())
	}
	return fmt.Sprintf("%s_%04d_%02d", r.BucketCollection, t.Year(), int(t.Month()))
}

// ParsePartition reads a collection name of the rule's partitions back to
// its period start (ms); ok is false for any other name.
func (r *Rule) ParsePartition(coll string) (start int64, ok bool) {
	rest, found := strings.CutPrefix(coll, r.BucketCollection+"_")
	if !found || r.PartitionBy == "" {
		return 0, false
	}
	parts := strings.Split(rest, "_")
	want := 2
	if r.PartitionBy == PartitionDay {
		want = 3
	}
	if len(parts) != want {
		return 0, false
	}
	nums := make([]int, 3)
	nums[2] = 1
	widths := []int{4, 2, 2}
	for i, p := range parts {
		if len(p) != widths[i] {
			return 0, false
		}
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return 0, false
		}
		nums[i] = n
	}
	t := time.Date(nums[0], time.Month(nums[1]), nums[2], 0, 0, 0, 0, time.UTC)
	// Reject names that do not round-trip (month 13, day 31 of April).
	if t.Year() != nums[0] || int(t.Month()) != nums[1] || t.Day() != nums[2] {
		return 0, false
	}
	start = t.UnixMilli()
	return start, r.PartitionCollection(start) == coll
}

// PartitionsOverlapping lists the period starts overlapping [from, to)
// (ms), in time order; none when to <= from. A read of a time range uses
// it with the window-floored lower bound.
func PartitionsOverlapping(by string, from, to int64) []int64 {
	var out []int64
	if to <= from {
		return nil
	}
	for p := PartitionStart(by, from); p < to; p = PartitionEnd(by, p) {
		out = append(out, p)
	}
	return out
}

// PartitionExpired reports whether every bucket a partition can hold has
// aged out at now: the last window starting in the period ended before
// now - expireAfter, as a bucket of an unpartitioned rule expires
// (rollup.Expiry.Cutoff). A span that does not divide the period gives
// that window an end past the period's.
func (r *Rule) PartitionExpired(start int64, now time.Time) bool {
	if !r.Expires() {
		return false
	}
	last := r.WindowStartMillis(PartitionEnd(r.PartitionBy, start) - 1)
	return last+r.SpanMillis() < now.Add(-r.ExpireAfter).UnixMilli()
}

// partitionBy decodes partitionBy of the rule at key.
func (d *decoder) partitionBy(key string, v any, r *Rule) {
	s, ok := v.(string)
	if !ok || (s != PartitionMonth && s != PartitionDay) {
		d.fail(key, "%s is not a partition period; use %s or %s", show(v), PartitionMonth, PartitionDay)
		return
	}
	switch {
	case r.Layout != LayoutEvents:
		d.fail(key, "applies only to layout %s, not %s", LayoutEvents, r.Layout)
		return
	case r.ShardKey:
		d.fail(key, "cannot be combined with shardKey: the proxy shards only the rule's one bucket collection")
		return
	}
	r.PartitionBy = s
	if r.Collection != "" && r.BucketCollection != "" {
		if n := len(r.BucketNamespace()) + partitionSuffixMax; n > MaxNamespaceBytes {
			d.fail(key, "partition namespaces such as %q are longer than %d bytes", r.PartitionCollection(0), MaxNamespaceBytes)
		}
	}
}
