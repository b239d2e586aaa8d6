package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"
)

// -prefill: each case is timed on a rule with history, as a long-running
// one is, not on an empty one (a merge whose cost grows with what the
// rule holds shows only there).

// prefillRun writes -prefill's events into db's plain collection and
// through the proxy into its rule, and flushes: the history the timed run
// finds.
func prefillRun(ctx context.Context, directC, proxyC *mongo.Client, db string) error {
	n := ingestArgs.prefill
	if n <= 0 {
		return nil
	}
	batches := prefillBatches(n)
	if _, _, err := ingest(ctx, directC.Database(db).Collection(plainColl), batches, 1); err != nil {
		return fmt.Errorf("prefill %s.%s: %w", db, plainColl, err)
	}
	t0 := time.Now()
	if _, _, err := ingest(ctx, proxyC.Database(db).Collection(ingestColl), batches, 1); err != nil {
		return fmt.Errorf("prefill %s.%s through the proxy: %w", db, ingestColl, err)
	}
	if _, _, err := tsproxyFlush(ctx, proxyC); err != nil {
		return fmt.Errorf("prefill %s: tsproxyFlush: %w", db, err)
	}
	fmt.Fprintf(os.Stderr, "  prefilled %s with %d events (%.1f s through the proxy)\n", db, n, time.Since(t0).Seconds())
	return nil
}

// prefillBatches are -prefill's events: the same series, in the time
// before ingestBatches' (ending at its first second).
func prefillBatches(n int) [][]any {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(-time.Duration((n+ingestSeries-1)/ingestSeries) * time.Second)
	return ingestBatchesFrom(start, n, 1000)
}
