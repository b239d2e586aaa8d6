package merge_test

import (
	"slices"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
	"github.com/tsproxy/tsproxy/rewrite/stage/merge"
)

// TestTopUpSweptBetweenRuns: a merge plans to top up a key's last
// bucket (recorded in its plan) and is cut before the rewrite; the
// retention sweep (another proxy's, under the retention lease, not the
// writer lease, and without settling staging) then deletes that bucket,
// its window now past expireAfter. Every later merge repeats the cut one
// first, and its conditional rewrite finds no bucket: "buckets to top up
// are not there", for good, and every read of the rule (which merges
// first) fails with it.
func TestTopUpSweptBetweenRuns(t *testing.T) {
	m := newMem(t)
	rule := rwtest.InsertRule()
	rule.ExpireAfter = 24 * time.Hour
	window := time.UnixMilli(36_000_000) // the events' window (an hour)
	cutoffPassed := window.Add(rule.ExpireAfter + rule.Span + time.Minute)
	opts := func(now time.Time) merge.MergeOptions {
		return merge.MergeOptions{All: true, TopUp: true, Now: now, RetryHorizon: time.Hour}
	}
	stagedInsert(t, m, events("a", 0, 4)) // a: seq 0 (3 events), seq 1 (1 event)
	mergeRule(t, m, rule, opts(window.Add(time.Hour)))

	// Late data for the window, just before its cutoff: the merge plans
	// to top up seq 1 and is cut before its rewrite.
	stagedInsert(t, m, events("a", 4, 1))
	m.fail["update"] = true
	m.run(merge.NewMerge(rule, opts(cutoffPassed.Add(-2*time.Minute))))
	m.fail["update"] = false

	// The sweep: {start: {$lt: now - expireAfter - window}} on the buckets.
	m.colls["readings.buckets"] = slices.DeleteFunc(m.colls["readings.buckets"], func(d bsoncore.Document) bool {
		return d.Lookup("start").DateTime() < cutoffPassed.Add(-rule.ExpireAfter-rule.Span).UnixMilli()
	})

	var failed []string
	for i := range 3 {
		res := m.run(merge.NewMerge(rule, opts(cutoffPassed.Add(time.Duration(i)*time.Minute))))
		if ok, _ := bson.Raw(res.Reply).Lookup("ok").AsFloat64OK(); ok != 1 {
			msg, _ := bson.Raw(res.Reply).Lookup("errmsg").StringValueOK()
			failed = append(failed, msg)
		}
	}
	if len(failed) > 0 {
		t.Fatalf("%d of 3 merges after the sweep failed, the last with: %s", len(failed), failed[len(failed)-1])
	}
}

// TestTopUpSweptDuringFirstRun: the same with no cut merge: the
// sweep deletes the bucket between the first run's read of it and its
// rewrite (a rewrite by _id alone, which then matches nothing).
func TestTopUpSweptDuringFirstRun(t *testing.T) {
	m := newMem(t)
	rule := rwtest.InsertRule()
	rule.ExpireAfter = 24 * time.Hour
	window := time.UnixMilli(36_000_000)
	cutoff := window.Add(rule.ExpireAfter + rule.Span)
	opts := func(now time.Time) merge.MergeOptions {
		return merge.MergeOptions{All: true, TopUp: true, Now: now, RetryHorizon: time.Hour}
	}
	stagedInsert(t, m, events("a", 0, 4))
	mergeRule(t, m, rule, opts(window.Add(time.Hour)))
	stagedInsert(t, m, events("a", 4, 1))
	m.hook = func(name, coll string) bool {
		if name == "update" && coll == "readings.buckets" { // the sweep runs first
			m.colls[coll] = slices.DeleteFunc(m.colls[coll], func(d bsoncore.Document) bool {
				return d.Lookup("start").DateTime() < window.Add(time.Minute).UnixMilli()
			})
		}
		return false
	}
	var failed []string
	for i := range 3 {
		res := m.run(merge.NewMerge(rule, opts(cutoff.Add(time.Duration(i)*time.Second))))
		if ok, _ := bson.Raw(res.Reply).Lookup("ok").AsFloat64OK(); ok != 1 {
			msg, _ := bson.Raw(res.Reply).Lookup("errmsg").StringValueOK()
			failed = append(failed, msg)
		}
	}
	if len(failed) > 0 {
		t.Fatalf("%d of 3 merges failed, the last with: %s", len(failed), failed[len(failed)-1])
	}
}
