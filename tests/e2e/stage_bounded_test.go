package e2e

import (
	"slices"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// A read bounded in time before every staged period (yesterday's report
// while today's events are staged) sees every event it can match without
// a merge: today's staging collection is still there after it. A read
// that may match a staged event (a bound reaching today's first instant,
// a late event of yesterday staged) merges first, as every read did.
func TestStageReadBeforeStagedPeriods(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: stagedRule(db, 100, "10m")})
	c := connect(t, p.URI())
	coll := c.Database(db).Collection("readings")
	today := time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC)
	yesterday := today.Add(-24 * time.Hour)
	old := append(seriesEvents(120, "a", yesterday.Add(10*time.Hour)), seriesEvents(60, "b", yesterday.Add(23*time.Hour+58*time.Minute))...)
	if _, err := coll.InsertMany(ctx, docsOf(old)); err != nil {
		t.Fatal(err)
	}
	flush(t, ctx, c, 1)
	now := append(seriesEvents(30, "a", today.Add(time.Hour)), seriesEvents(30, "c", today.Add(2*time.Hour))...)
	for _, e := range now {
		if _, err := coll.InsertOne(ctx, e.doc()); err != nil {
			t.Fatal(err)
		}
	}
	staged := stagingNames(t, ctx, db)
	if len(staged) == 0 {
		t.Fatal("no staging collection after today's inserts: the rule did not stage")
	}

	// Yesterday, every read path: the stored events, nothing merged.
	yday := bson.D{{Key: "ts", Value: bson.D{{Key: "$gte", Value: yesterday}, {Key: "$lt", Value: today}}}}
	checkIDs(t, "find of yesterday", findIDs(t, coll, yday), old)
	if n, err := coll.CountDocuments(ctx, yday); err != nil || n != int64(len(old)) {
		t.Errorf("countDocuments of yesterday: %d (%v), want %d", n, err, len(old))
	}
	var series []string
	if err := coll.Distinct(ctx, "sensorId", yday).Decode(&series); err != nil || !slices.Equal(series, []string{"a", "b"}) {
		t.Errorf("distinct of yesterday: %v (%v), want [a b]", series, err)
	}
	cur, err := coll.Aggregate(ctx, mongo.Pipeline{{{Key: "$match", Value: yday}}, {{Key: "$group", Value: bson.D{{Key: "_id", Value: "$sensorId"}, {Key: "n", Value: bson.D{{Key: "$sum", Value: 1}}}}}}})
	if err != nil {
		t.Fatal(err)
	}
	var groups []bson.M
	if err := cur.All(ctx, &groups); err != nil || len(groups) != 2 {
		t.Errorf("aggregate of yesterday: %v (%v), want 2 groups", groups, err)
	}
	if left := stagingNames(t, ctx, db); !slices.Equal(left, staged) {
		t.Fatalf("staging after reads of yesterday: %v, want %v untouched (no merge)", left, staged)
	}

	// A bound that reaches today's first instant may match a staged event.
	upToMidnight := bson.D{{Key: "ts", Value: bson.D{{Key: "$lte", Value: today}}}}
	if n, err := coll.CountDocuments(ctx, upToMidnight); err != nil || n != int64(len(old)) {
		t.Errorf("countDocuments up to midnight: %d (%v), want %d", n, err, len(old))
	}
	if left := stagingNames(t, ctx, db); len(left) != 0 {
		t.Fatalf("staging after a read reaching today: %v, want merged", left)
	}

	// A late event of yesterday is staged in yesterday's period: a read
	// of yesterday merges it first and finds it.
	late := seriesEvents(1, "b", yesterday.Add(12*time.Hour))
	more := seriesEvents(10, "c", today.Add(3*time.Hour))
	if _, err := coll.InsertMany(ctx, docsOf(append(late, more...))); err != nil {
		t.Fatal(err)
	}
	checkIDs(t, "find of yesterday after a late event", findIDs(t, coll, yday), append(slices.Clone(old), late...))
	if left := stagingNames(t, ctx, db); len(left) != 0 {
		t.Fatalf("staging after a read of yesterday with a late event staged: %v, want merged", left)
	}

	// Every event sent, stored once.
	all := slices.Concat(old, now, late, more)
	flush(t, ctx, c, 1)
	stored := storedIDsIn(t, ctx, connect(t, env.upstreamURI), db)
	for _, e := range all {
		if stored[e.id] != 1 {
			t.Errorf("event %s of %s stored %d times, want once", e.id.Hex(), e.sensor, stored[e.id])
		}
	}
	if len(stored) != len(all) {
		t.Errorf("%d events stored, want %d", len(stored), len(all))
	}
}

// findIDs are the _ids a find of filter returns, with their counts.
func findIDs(t *testing.T, coll *mongo.Collection, filter bson.D) map[bson.ObjectID]int {
	t.Helper()
	cur, err := coll.Find(ctxFor(t), filter)
	if err != nil {
		t.Fatal(err)
	}
	var docs []struct {
		ID bson.ObjectID `bson:"_id"`
	}
	if err := cur.All(ctxFor(t), &docs); err != nil {
		t.Fatal(err)
	}
	got := map[bson.ObjectID]int{}
	for _, d := range docs {
		got[d.ID]++
	}
	return got
}

// checkIDs asserts that got holds each of want once, and nothing else.
func checkIDs(t *testing.T, what string, got map[bson.ObjectID]int, want []sentEvent) {
	t.Helper()
	for _, e := range want {
		if got[e.id] != 1 {
			t.Errorf("%s: event %s of %s returned %d times, want once", what, e.id.Hex(), e.sensor, got[e.id])
		}
	}
	if len(got) != len(want) {
		t.Errorf("%s: %d events, want %d", what, len(got), len(want))
	}
}
