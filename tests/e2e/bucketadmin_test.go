package e2e

import (
	"slices"
	"testing"

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
