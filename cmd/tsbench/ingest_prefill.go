package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rules"
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
	start := ingestStart.Add(-time.Duration((n+ingestSeries-1)/ingestSeries) * time.Second)
	return ingestBatchesFrom(start, n, 1000)
}

// -records: each case's rule holds the records of merged retryable
// writes that 10 minutes of retryable inserts leave (every derived id
// merged within the retry horizon), which every merge read back before
// the holder kept them.

// recordsPerDoc is how many derived ids one record holds: a merge of
// 1,000 staged documents (proxy mergeBatch).
const recordsPerDoc = 1000

// prefillRecords writes -records' derived ids into db's rule's records,
// as merges made within the last minute write them.
func prefillRecords(ctx context.Context, directC *mongo.Client, db string) error {
	n := ingestArgs.records
	if n <= 0 {
		return nil
	}
	rule := &rules.Rule{BucketCollection: ingestColl + ".buckets"}
	coll := directC.Database(db).Collection(stage.TxnsCollection(rule))
	now := time.Now()
	var docs []any
	for token := int64(1); n > 0; token++ {
		ids := make([]bson.ObjectID, min(n, recordsPerDoc))
		for i := range ids {
			ids[i] = bson.NewObjectID()
		}
		n -= len(ids)
		docs = append(docs, bson.Raw(stage.RecordDoc(strconv.FormatInt(token, 10), ids, now)))
		if len(docs) == 100 || n == 0 {
			if _, err := coll.InsertMany(ctx, docs); err != nil {
				return fmt.Errorf("records of %s: %w", db, err)
			}
			docs = docs[:0]
		}
	}
	return nil
}
