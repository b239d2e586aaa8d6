package rules

import (
	"testing"
	"time"
)

// TestPartitionExpiredEdge: docs/how-it-works.md says a bucket
// expires when start + window < now - expireAfter and a partition is
// dropped "once its last window ended before now - expireAfter". At the
// instant the last window ended exactly expireAfter ago, the sweep keeps a
// bucket of that window (start < cutoff is false) but the partition holding
// it is dropped.
func TestPartitionExpiredEdge(t *testing.T) {
	r := &Rule{Span: time.Hour, ExpireAfter: 24 * time.Hour, PartitionBy: PartitionDay}
	day := time.Date(2026, 1, 5, 0, 0, 0, 0, time.UTC)
	lastStart := day.Add(23 * time.Hour) // last window of the day
	now := lastStart.Add(r.Span + r.ExpireAfter)
	cutoff := now.Add(-r.ExpireAfter - r.Span) // rollup.Expiry.Cutoff for the buckets
	bucketExpired := lastStart.Before(cutoff)
	if got := r.PartitionExpired(day.UnixMilli(), now); got != bucketExpired {
		t.Fatalf("partition dropped %v, but its last bucket expired %v", got, bucketExpired)
	}
}
