package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// TestBucketedListCollectionsAndDrop: listCollections shows the app's
// namespace, not its bucket collection; drop through the proxy drops the
// buckets, and writing again starts from an empty collection (the proxy
// forgot the fills it knew).
func TestBucketedListCollectionsAndDrop(t *testing.T) {
	t.Parallel()
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: readingsRule(db, 1000)})
	ctx := ctxFor(t)
	cl := connect(t, p.URI())
	coll := cl.Database(db).Collection("readings")
	write := func(seed uint64) []sentEvent {
		sent := genEvents(50, 2, 1, seed)
		docs := []any{}
		for _, e := range sent {
			docs = append(docs, e.doc())
		}
		if _, err := coll.InsertMany(ctx, docs); err != nil {
			t.Fatal(err)
		}
		return sent
	}
	write(10)
	if _, err := cl.Database(db).Collection("other").InsertOne(ctx, bson.D{{Key: "x", Value: 1}}); err != nil {
		t.Fatal(err)
	}
	names, err := cl.Database(db).ListCollectionNames(ctx, bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"other", "readings"}) {
		t.Fatalf("listCollections through the proxy: %v, want [other readings]", names)
	}
	if n, err := coll.CountDocuments(ctx, bson.D{}); err != nil || n != 50 {
		t.Fatalf("countDocuments: %d, %v", n, err)
	}

	if err := coll.Drop(ctx); err != nil {
		t.Fatal(err)
	}
	directNames, err := direct(t).Database(db).ListCollectionNames(ctx, bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(directNames, "readings.buckets") {
		t.Fatalf("bucket collection still there after drop: %v", directNames)
	}
	again := write(11)
	buckets := readBuckets(t, ctx, db)
	checkStored(t, buckets, again, 1000)
	if n, err := coll.CountDocuments(ctx, bson.D{}); err != nil || n != 50 {
		t.Fatalf("countDocuments after drop and rewrite: %d, %v", n, err)
	}
}

// TestCollStatsStage: an aggregate beginning with $collStats (what
// mongosh's stats(), dataSize() and totalIndexSize() send) is answered
// from the bucket collection with the app's namespace and the number of
// events, as the collStats command is; a later stage that would compute
// from the bucket collection's count is refused, naming the rule.
func TestCollStatsStage(t *testing.T) {
	t.Parallel()
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: readingsRule(db, 100)})
	ctx := ctxFor(t)
	coll := connect(t, p.URI()).Database(db).Collection("readings")
	const n = 730
	if _, err := coll.InsertMany(ctx, docsOf(seriesEvents(n, "s1", time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)))); err != nil {
		t.Fatal(err)
	}
	cur, err := coll.Aggregate(ctx, bson.A{bson.D{{Key: "$collStats", Value: bson.D{{Key: "storageStats", Value: bson.D{}}, {Key: "count", Value: bson.D{}}}}}})
	if err != nil {
		t.Fatal(err)
	}
	var stats []struct {
		NS           string `bson:"ns"`
		Count        int64  `bson:"count"`
		StorageStats struct {
			Count int64 `bson:"count"`
			Size  int64 `bson:"size"`
		} `bson:"storageStats"`
	}
	if err := cur.All(ctx, &stats); err != nil {
		t.Fatal(err)
	}
	if len(stats) != 1 || stats[0].NS != db+".readings" || stats[0].Count != n || stats[0].StorageStats.Count != n || stats[0].StorageStats.Size <= 0 {
		t.Fatalf("$collStats: %+v, want one document of ns %s.readings counting %d events", stats, db, n)
	}

	// Sizes are the stored buckets' and may be summed after $collStats.
	cur, err = coll.Aggregate(ctx, bson.A{
		bson.D{{Key: "$collStats", Value: bson.D{{Key: "storageStats", Value: bson.D{}}}}},
		bson.D{{Key: "$group", Value: bson.D{{Key: "_id", Value: nil}, {Key: "v", Value: bson.D{{Key: "$sum", Value: "$storageStats.size"}}}}}}})
	if err != nil {
		t.Fatal(err)
	}
	var sums []bson.M
	if err := cur.All(ctx, &sums); err != nil || len(sums) != 1 {
		t.Fatalf("$collStats then $group of the size: %v, %v", sums, err)
	}
	// The count after $collStats would be the buckets': refused.
	_, err = coll.Aggregate(ctx, bson.A{
		bson.D{{Key: "$collStats", Value: bson.D{{Key: "storageStats", Value: bson.D{}}}}},
		bson.D{{Key: "$project", Value: bson.D{{Key: "n", Value: "$storageStats.count"}}}}})
	if err == nil || !strings.Contains(err.Error(), "tsproxy rule "+db+".readings") || !strings.Contains(err.Error(), "after $collStats") {
		t.Fatalf("$collStats then a stage reading count: got %v, want an error naming the rule", err)
	}

	out := runMongosh(t, p.URI(), fmt.Sprintf(`const c = connect(process.env.TSPROXY_URI + %q).readings;
const s = c.stats();
print(JSON.stringify([s.ns, Number(s.count), Number(c.totalIndexSize()) > 0, Number(c.dataSize()) > 0]));
`, db))
	line := strings.TrimSpace(out[strings.LastIndex(strings.TrimSpace(out), "\n")+1:])
	if want := fmt.Sprintf(`["%s.readings",%d,true,true]`, db, n); line != want {
		t.Fatalf("mongosh stats(): %s, want %s", out, want)
	}
}
