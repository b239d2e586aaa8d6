package layout

import (
	"math"
	"testing"
	"time"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// MongoDB: find({}, {_id: 1}) is an inclusion projection of _id alone.
func TestLayoutProjectionIDOnly(t *testing.T) {
	rule := layoutRule(rules.LayoutCounter, time.Minute, time.Second)
	ns := rule.BucketNamespace()
	b0 := bson.D{{Key: "_id", Value: bucket.IDOf(ns, rawOf("/a"), 0, 0)}, {Key: "meta", Value: "/a"}, {Key: "start", Value: rwtest.DT(0)}, {Key: "total", Value: int64(2)},
		{Key: "slots", Value: bson.D{{Key: "3", Value: int64(2)}}}}
	for _, cmd := range []bson.D{
		{{Key: "find", Value: "readings"}, {Key: "projection", Value: bson.D{{Key: "_id", Value: 1}}}, {Key: "$db", Value: "iot"}},
		{{Key: "aggregate", Value: "readings"}, {Key: "pipeline", Value: bson.A{bson.D{{Key: "$project", Value: bson.D{{Key: "_id", Value: 1}}}}}}, {Key: "cursor", Value: bson.D{}}, {Key: "$db", Value: "iot"}},
	} {
		_, _, out := runLayoutRead(t, rule, cmd, b0)
		arr, _ := bson.Raw(out).Lookup("cursor", "firstBatch").Array().Values()
		if len(arr) != 1 {
			t.Fatalf("%s", bson.Raw(out))
		}
		if es, _ := arr[0].Document().Elements(); len(es) != 1 {
			t.Errorf("%s with {_id: 1}: got %s, want only _id", cmd[0].Key, arr[0].Document())
		}
	}
}

// TestLayoutReadAtTheEndsOfTheDates: a range at the top of the dates
// plans (its point lookups' loop wrapped past the largest date and never
// ended), and one from the smallest date finds the events after it (its
// first window wrapped to a date far in the future, and the read found
// nothing).
func TestLayoutReadAtTheEndsOfTheDates(t *testing.T) {
	rule := layoutRule(rules.LayoutCounter, time.Minute, time.Second)
	done := make(chan error, 1)
	go func() {
		_, err := PlanRead(rwtest.Doc(t, bson.D{{Key: "find", Value: "readings"},
			{Key: "filter", Value: bson.D{{Key: "page", Value: "/a"}, {Key: "ts", Value: bson.D{
				{Key: "$gte", Value: bson.DateTime(math.MaxInt64 - 1000)}, {Key: "$lte", Value: bson.DateTime(math.MaxInt64)}}}}},
			{Key: "$db", Value: "iot"}}), rule)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("PlanRead of a range at the top of the dates did not return")
	}
	ns := rule.BucketNamespace()
	b0 := bson.D{{Key: "_id", Value: bucket.IDOf(ns, rawOf("/a"), 0, 0)}, {Key: "meta", Value: "/a"}, {Key: "start", Value: rwtest.DT(0)}, {Key: "total", Value: int64(2)},
		{Key: "slots", Value: bson.D{{Key: "3", Value: int64(2)}}}}
	for _, lo := range []int64{math.MinInt64, math.MinInt64 + 1} {
		for _, hi := range []int64{3_000, math.MaxInt64} {
			_, _, out := runLayoutRead(t, rule, bson.D{{Key: "find", Value: "readings"},
				{Key: "filter", Value: bson.D{{Key: "page", Value: "/a"}, {Key: "ts", Value: bson.D{{Key: "$gte", Value: bson.DateTime(lo)}, {Key: "$lte", Value: bson.DateTime(hi)}}}}},
				{Key: "$db", Value: "iot"}}, b0)
			if arr, _ := bson.Raw(out).Lookup("cursor", "firstBatch").Array().Values(); len(arr) != 1 {
				t.Fatalf("ts in [%d, %d]: %s, want the slot at 3 s", lo, hi, bson.Raw(out))
			}
		}
	}
}

// The preallocated shell of the window after one at the top of the date
// range wraps around to the bottom of it (start + window overflows).
func TestLayoutNoShellPastTheLastWindow(t *testing.T) {
	rule := slotsTestRule(time.Hour, false, true)
	win := rule.LayoutOptions.Window.Milliseconds()
	start := rules.FloorMillis(math.MaxInt64, win)
	meta := bsoncore.Value{Type: bsoncore.TypeString, Data: bsoncore.AppendString(nil, "/a")}
	cmd, keys := ShellsAfter(rule, []bucket.Key{bucket.KeyOf(meta, start)}, func(k []bucket.Key) []bucket.Key { return k }, false)
	for _, k := range keys {
		if k.Start < start {
			t.Errorf("shell of the window after %d starts at %d (wrapped); insert %d bytes", start, k.Start, len(cmd))
		}
	}
}
