package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// TestUnpack: `tsproxy unpack` turns the buckets a proxy on FerretDB
// packed back into the forms MongoDB reads (events into arrays, a
// counter's slots into a document), for users who move their buckets to
// MongoDB. Every event and count is kept, reads through the proxy answer
// the same after it, a dry run changes nothing, and a second run has
// nothing to do. On a real MongoDB (TSPROXY_E2E_UPSTREAM), where the proxy
// never packs, a packed bucket copied in makes an event read fail, naming
// tsproxy unpack, instead of answering without its events.
func TestUnpack(t *testing.T) {
	if env.external {
		testUnpackOnMongoDB(t)
		return
	}
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	yaml := readingsRule(db, 1000) + strings.TrimPrefix(counterRule(db), "rules:\n")
	p := startProxy(t, proxyOptions{yaml: yaml})
	c := connect(t, p.URI()).Database(db)
	sent := genEvents(6000, 6, 1, 3)
	for lo := 0; lo < len(sent); lo += 1000 {
		var docs []any
		for _, e := range sent[lo:min(lo+1000, len(sent))] {
			docs = append(docs, e.doc())
		}
		if _, err := c.Collection("readings").InsertMany(ctx, docs); err != nil {
			t.Fatal(err)
		}
	}
	hits, want := genHits(2000, 5)
	for lo := 0; lo < len(hits); lo += 500 {
		if _, err := c.Collection("hits").InsertMany(ctx, hits[lo:lo+500]); err != nil {
			t.Fatal(err)
		}
	}
	if err := flushAt(p.addr); err != nil {
		t.Fatal(err)
	}
	packedEvents := packedCount(t, ctx, db, "readings.buckets", "packed")
	if packedEvents == 0 || packedCount(t, ctx, db, "hits.buckets", "slots") == 0 {
		t.Fatal("no packed buckets to unpack: the merges on FerretDB write them packed")
	}

	bin := tsproxyBinary(t)
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("upstream:\n  uri: %q\ntelemetry:\n  metricsListen: \"\"\n", env.upstreamURI)+yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	unpack := func(args ...string) string {
		t.Helper()
		out, err := exec.CommandContext(ctx, bin, append([]string{"unpack", "--config", cfg}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("tsproxy unpack %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	if out := unpack("--rule", db+".readings", "--dry-run"); !strings.Contains(out, fmt.Sprintf("%s.readings.buckets: %d buckets packed (dry run", db, packedEvents)) {
		t.Fatalf("dry run: %s", out)
	}
	if n := packedCount(t, ctx, db, "readings.buckets", "packed"); n != packedEvents {
		t.Fatalf("the dry run changed %d buckets", packedEvents-n)
	}
	if out := unpack("--rule", db+".readings"); !strings.Contains(out, fmt.Sprintf("%s.readings.buckets: %d buckets unpacked", db, packedEvents)) {
		t.Fatalf("unpack: %s", out)
	}
	if n := packedCount(t, ctx, db, "readings.buckets", "packed"); n != 0 {
		t.Fatalf("%d buckets still packed", n)
	}
	// Every event once, in arrays only, summaries as they were.
	buckets := readBuckets(t, ctx, db)
	checkStored(t, buckets, sent, 1000)
	var raw []bson.Raw
	cur, err := direct(t).Database(db).Collection("readings.buckets").Find(ctx, bson.D{})
	if err != nil || cur.All(ctx, &raw) != nil {
		t.Fatalf("read the buckets: %v", err)
	}
	for _, b := range raw {
		if _, err := b.LookupErr("packed"); err == nil || b.Lookup("events").Type != bson.TypeArray {
			t.Fatalf("bucket %v is not in the array form", b.Lookup("_id"))
		}
	}
	if out := unpack("--rule", db+".readings"); !strings.Contains(out, ": 0 buckets unpacked") {
		t.Fatalf("second run: %s", out)
	}
	// Reads through the proxy: every event, once.
	if n, err := c.Collection("readings").CountDocuments(ctx, bson.D{}); err != nil || n != int64(len(sent)) {
		t.Fatalf("count %d, %v; want %d", n, err, len(sent))
	}
	seen := readIDs(t, ctx, c.Collection("readings"))
	for _, e := range sent {
		if seen[e.id] != 1 {
			t.Fatalf("event %v read %d times", e.id, seen[e.id])
		}
	}

	// The counter: its slots become a document; the counts stay.
	if out := unpack("--rule", db+".hits"); !strings.Contains(out, "buckets unpacked") {
		t.Fatalf("unpack hits: %s", out)
	}
	if n := packedCount(t, ctx, db, "hits.buckets", "slots"); n != 0 {
		t.Fatalf("%d counter buckets still packed", n)
	}
	var all []counterDoc
	hc, err := c.Collection("hits").Find(ctx, bson.D{}, options.Find().SetBatchSize(100))
	if err != nil || hc.All(ctx, &all) != nil {
		t.Fatalf("find hits: %v", err)
	}
	var sum int64
	for _, d := range all {
		if d.Page == nil || int64(want[slotKey{*d.Page, d.TS.Time().Unix()}]) != d.Count {
			t.Fatalf("find: %+v does not match the hits sent", d)
		}
		sum += d.Count
	}
	if sum != int64(len(hits)) || len(all) != len(want) {
		t.Fatalf("counts sum to %d in %d documents, want %d in %d", sum, len(all), len(hits), len(want))
	}
	// Another hit counts into the unpacked bucket.
	if _, err := c.Collection("hits").InsertOne(ctx, hits[0]); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Collection("hits").CountDocuments(ctx, bson.D{}); err != nil || n != int64(len(hits))+1 {
		t.Fatalf("count after one more hit: %d, %v", n, err)
	}

	// A rule that is not in the config: the rules there are.
	out, err := exec.CommandContext(ctx, bin, "unpack", "--config", cfg, "--rule", db+".nope").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "unpack: no rule for namespace") {
		t.Fatalf("unknown rule: %v\n%s", err, out)
	}
}

// packedCount counts the documents of db.coll whose field is binary.
func packedCount(t *testing.T, ctx context.Context, db, coll, field string) int64 {
	t.Helper()
	var n int64
	cur, err := direct(t).Database(db).Collection(coll).Find(ctx, bson.D{}, options.Find().SetProjection(bson.D{{Key: field, Value: 1}}))
	if err != nil {
		t.Fatal(err)
	}
	defer cur.Close(ctx)
	for cur.Next(ctx) {
		if cur.Current.Lookup(field).Type == bson.TypeBinary {
			n++
		}
	}
	return n
}

// readIDs counts how often each event _id comes back from a find of all.
func readIDs(t *testing.T, ctx context.Context, coll *mongo.Collection) map[bson.ObjectID]int {
	t.Helper()
	cur, err := coll.Find(ctx, bson.D{}, options.Find().SetProjection(bson.D{{Key: "_id", Value: 1}}).SetBatchSize(1000))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[bson.ObjectID]int{}
	for cur.Next(ctx) {
		id, _ := cur.Current.Lookup("_id").ObjectIDOK()
		seen[id]++
	}
	if err := cur.Err(); err != nil {
		t.Fatal(err)
	}
	return seen
}

// testUnpackOnMongoDB copies a bucket in the packed form into a MongoDB,
// as a dump from a FerretDB restored there would: an aggregate of events
// through the proxy fails, naming tsproxy unpack, and answers in full
// after it.
func testUnpackOnMongoDB(t *testing.T) {
	ctx := ctxFor(t)
	db := uniqueDB(t)
	yaml := readingsRule(db, 1000)
	p := startProxy(t, proxyOptions{yaml: yaml})
	coll := connect(t, p.URI()).Database(db).Collection("readings")
	sent := genEvents(100, 1, 1, 9)
	var docs []any
	for _, e := range sent {
		docs = append(docs, e.doc())
	}
	if _, err := coll.InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}
	// Pack one bucket's events, as a proxy on FerretDB writes them.
	buckets := direct(t).Database(db).Collection("readings.buckets")
	var b bson.D
	if err := buckets.FindOne(ctx, bson.D{}).Decode(&b); err != nil {
		t.Fatal(err)
	}
	var id any
	var packed bson.D
	for _, e := range b {
		switch e.Key {
		case "_id":
			id = e.Value
			packed = append(packed, e)
		case "events":
			_, arr, err := bson.MarshalValue(e.Value)
			if err != nil {
				t.Fatal(err)
			}
			packed = append(packed, bson.E{Key: "packed", Value: bson.Binary{Subtype: 0, Data: arr}})
		default:
			packed = append(packed, e)
		}
	}
	if _, err := buckets.ReplaceOne(ctx, bson.D{{Key: "_id", Value: id}}, packed); err != nil {
		t.Fatal(err)
	}
	// An aggregate: a find the proxy scans itself (a staged rule's on
	// FerretDB 2.x) reads packed events as the proxy wrote them.
	cur, err := coll.Aggregate(ctx, bson.A{bson.D{{Key: "$match", Value: bson.D{{Key: "value", Value: bson.D{{Key: "$gte", Value: -1e9}}}}}}})
	if err == nil {
		var all []bson.Raw
		if err = cur.All(ctx, &all); err == nil {
			t.Fatalf("a read over a packed bucket answered %d of %d events without an error", len(all), len(sent))
		}
	}
	if !strings.Contains(err.Error(), "tsproxy unpack") {
		t.Fatalf("a read over a packed bucket: %v, want an error naming tsproxy unpack", err)
	}
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("upstream:\n  uri: %q\ntelemetry:\n  metricsListen: \"\"\n", env.upstreamURI)+yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, tsproxyBinary(t), "unpack", "--config", cfg, "--rule", db+".readings").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "1 buckets unpacked") {
		t.Fatalf("tsproxy unpack: %v\n%s", err, out)
	}
	seen := readIDs(t, ctx, coll)
	for _, e := range sent {
		if seen[e.id] != 1 {
			t.Fatalf("after unpack, event %v read %d times", e.id, seen[e.id])
		}
	}
}
