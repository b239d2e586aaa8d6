package merge_test

import (
	"testing"
	"time"

	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rewrite/stage/merge"
)

// TestMergeRecordCache: the holder's merges read the records of merged
// retryable writes once and keep them (stage.RecordCache), where each
// merge read them all; a retry merged earlier is still left out, expired
// records leave what is kept too, and another records collection is
// read again.
func TestMergeRecordCache(t *testing.T) {
	// As the proxy keeps them (proxy/directory.go): by the records
	// collection's uuid; a collection that did not exist is the one the
	// merge that kept them created.
	var keptColl string
	var kept *stage.RecordSet
	cache := &stage.RecordCache{
		Get: func(coll string) *stage.RecordSet {
			if kept == nil || keptColl != coll && keptColl != "" {
				return nil
			}
			keptColl = coll
			return kept
		},
		Put: func(coll string, s *stage.RecordSet) { keptColl, kept = coll, s },
	}
	const hour = int64(3_600_000)
	m := newMem(t)
	txns := stage.TxnsCollection(rwtest.InsertRule())
	round := func(name string, now int64, wantReads, wantRetries int) merge.Stats {
		t.Helper()
		st := runMerge(t, m, merge.MergeOptions{All: true, Records: cache, Now: time.UnixMilli(now)})
		if st.RecordReads != wantReads || st.Retries != wantRetries {
			t.Fatalf("%s: stats %+v, want %d reads of the records and %d retries left out", name, st, wantReads, wantRetries)
		}
		return st
	}

	stagedInsert(t, m, events("a", 0, 2), retryArgs(1)...)
	round("first merge", 1_000_000, 1, 0)
	stagedInsert(t, m, events("a", 0, 2), retryArgs(1)...) // txn 1's late retry
	stagedInsert(t, m, events("a", 2, 2), retryArgs(2)...)
	round("the late retry", 1_000_100, 0, 1)
	stagedInsert(t, m, events("a", 2, 2), retryArgs(2)...) // txn 2's late retry
	round("the late retry of a write the kept records learned", 1_000_200, 0, 1)
	onceEachStored(t, m, 4)
	if kept.Len() != 2 {
		t.Fatalf("%d ids kept, want txn 1's and 2's", kept.Len())
	}

	// Past the horizon (an hour here), the records expire upstream and
	// in what is kept.
	stagedInsert(t, m, events("b", 10, 1))
	round("past the horizon", 1_000_000+2*hour, 0, 0)
	if kept.Len() != 0 || len(m.colls[txns]) != 0 {
		t.Fatalf("%d ids kept, %d records upstream after they expired, want none", kept.Len(), len(m.colls[txns]))
	}

	// Another records collection (dropped, made again): read again.
	stagedInsert(t, m, events("c", 20, 2), retryArgs(3)...)
	round("records again", 1_000_000+2*hour+100, 0, 0)
	delete(m.colls, txns)
	delete(m.uuids, txns)
	stagedInsert(t, m, events("c", 22, 2), retryArgs(4)...)
	round("after the drop", 1_000_000+2*hour+200, 1, 0)
	stagedInsert(t, m, events("c", 22, 2), retryArgs(4)...)
	round("a retry after the drop", 1_000_000+2*hour+300, 0, 1)
	onceEachStored(t, m, 9)
}
