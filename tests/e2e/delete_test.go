package e2e

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// delBase is the first hour of the delete tests' events.
var delBase = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)

// delLoad writes the same events through the proxy into buckets
// (maxEvents 10, so a (series, hour) has several seqs) and directly into a
// plain collection "plain" of the same database.
func delLoad(t *testing.T, ctx context.Context) (db string, p *testProxy, buckets, plain *mongo.Collection, sent []sentEvent) {
	t.Helper()
	db = uniqueDB(t)
	p = startProxy(t, proxyOptions{yaml: readingsRule(db, 10)})
	buckets = connect(t, p.URI()).Database(db).Collection("readings")
	plain = direct(t).Database(db).Collection("plain")
	sent = genEvents(1200, 4, 1, 11)
	// A series of its own, in time order: seq 0, 1, 2 of one hour hold
	// minutes 0-9, 10-19 and 20-29.
	for i := range 30 {
		sent = append(sent, sentEvent{id: bson.NewObjectID(), sensor: "ordered", ts: delBase.Add(time.Duration(i) * time.Minute), value: float64(i)})
	}
	docs := make([]any, len(sent))
	for i, e := range sent {
		docs[i] = e.doc()
	}
	// Events without the metaField, and with an explicit null one.
	for i := range 20 {
		d := bson.D{{Key: "_id", Value: bson.NewObjectID()}, {Key: "ts", Value: delBase.Add(time.Duration(i*7) * time.Minute)}}
		if i%2 == 0 {
			d = append(d, bson.E{Key: "sensorId", Value: nil})
		}
		docs = append(docs, append(d, bson.E{Key: "value", Value: float64(i)}, bson.E{Key: "unit", Value: "C"}))
	}
	for i := 0; i < len(docs); i += 300 {
		batch := docs[i:min(i+300, len(docs))]
		if _, err := buckets.InsertMany(ctx, batch); err != nil {
			t.Fatalf("insert through the proxy: %v", err)
		}
		if _, err := plain.InsertMany(ctx, batch); err != nil {
			t.Fatalf("insert directly: %v", err)
		}
	}
	return db, p, buckets, plain, sent
}

// delCompare asserts that both collections hold the same events, document
// for document, and that every bucket's summaries match its events.
func delCompare(t *testing.T, ctx context.Context, db string, buckets, plain *mongo.Collection) int {
	t.Helper()
	sorted := options.Find().SetSort(bson.D{{Key: "_id", Value: 1}})
	read := func(c *mongo.Collection) []bson.D {
		cur, err := c.Find(ctx, bson.D{}, sorted)
		if err != nil {
			t.Fatalf("find on %s: %v", c.Name(), err)
		}
		var out []bson.D
		if err := cur.All(ctx, &out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	got, want := read(buckets), read(plain)
	if len(got) != len(want) {
		t.Fatalf("proxy holds %d events, plain collection %d", len(got), len(want))
	}
	for i := range got {
		if fmt.Sprint(got[i]) != fmt.Sprint(want[i]) {
			t.Fatalf("event %d: proxy %v, plain %v", i, got[i], want[i])
		}
	}
	n, err := buckets.CountDocuments(ctx, bson.D{})
	if err != nil || int(n) != len(want) {
		t.Fatalf("countDocuments through the proxy: %d, %v; want %d", n, err, len(want))
	}
	delCheckBuckets(t, ctx, db, len(want))
	return len(want)
}

// delCheckBuckets checks each stored bucket: count and bytes agree with
// its events, min/max/sum are those of its events, an empty bucket is a
// shell below a non-empty higher seq (never the last of its key).
func delCheckBuckets(t *testing.T, ctx context.Context, db string, events int) {
	t.Helper()
	cur, err := direct(t).Database(db).Collection("readings.buckets").Find(ctx, bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	var raw []bson.Raw
	if err := cur.All(ctx, &raw); err != nil {
		t.Fatal(err)
	}
	total := 0
	type key struct {
		meta  string
		start time.Time
	}
	perKey := map[key][]int64{}
	for _, r := range raw {
		var b bucketDoc
		if err := bson.Unmarshal(r, &b); err != nil {
			t.Fatal(err)
		}
		if int(b.Count) != len(b.Events) {
			t.Fatalf("bucket %v: count %d but %d events", b.ID, b.Count, len(b.Events))
		}
		var bytes int64
		for _, ev := range b.Events {
			d, _ := bson.Marshal(ev)
			bytes += int64(len(d))
		}
		if got := rawInt64(r.Lookup("bytes")); got != bytes {
			t.Fatalf("bucket %v: bytes %d, events are %d", b.ID, got, bytes)
		}
		k := key{fmt.Sprint(b.Meta), b.Start}
		perKey[k] = append(perKey[k], b.Count)
		total += len(b.Events)
		if len(b.Events) == 0 {
			continue
		}
		minT, maxT := time.Time{}, time.Time{}
		minV, maxV, sumV := math.Inf(1), math.Inf(-1), 0.0
		for _, ev := range b.Events {
			m := dmap(ev)
			ts := m["ts"].(bson.DateTime).Time()
			if minT.IsZero() || ts.Before(minT) {
				minT = ts
			}
			if ts.After(maxT) {
				maxT = ts
			}
			v := m["value"].(float64)
			minV, maxV, sumV = math.Min(minV, v), math.Max(maxV, v), sumV+v
		}
		if !b.Min["ts"].(bson.DateTime).Time().Equal(minT) || !b.Max["ts"].(bson.DateTime).Time().Equal(maxT) {
			t.Fatalf("bucket %v: min/max ts %v/%v, events say %v/%v", b.ID, b.Min["ts"], b.Max["ts"], minT, maxT)
		}
		if b.Min["value"] != minV || b.Max["value"] != maxV {
			t.Fatalf("bucket %v: min/max value %v/%v, events say %v/%v", b.ID, b.Min["value"], b.Max["value"], minV, maxV)
		}
		if got := b.Sum["value"].(float64); math.Abs(got-sumV) > 1e-6*math.Max(1, math.Abs(sumV)) {
			t.Fatalf("bucket %v: sum.value %v, events say %v", b.ID, got, sumV)
		}
	}
	if total != events {
		t.Fatalf("buckets hold %d events, want %d", total, events)
	}
	// The bucket ids of a key are its seqs: the count of buckets of a key
	// and the ids of seq 0..n-1 are checked by the read path; here, no key
	// may end with an empty bucket.
	for k, counts := range perKey {
		if slices.Max(counts) == 0 {
			t.Fatalf("key %v: only empty buckets %v remain", k, counts)
		}
	}
}

func rawInt64(v bson.RawValue) int64 {
	if n, ok := v.AsInt64OK(); ok {
		return n
	}
	return -1
}

// TestDeleteDifferential runs the same deletes through the proxy on
// buckets and directly on a plain collection, and compares n and the
// remaining events after each.
func TestDeleteDifferential(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db, _, buckets, plain, sent := delLoad(t, ctx)
	left := delCompare(t, ctx, db, buckets, plain)
	if left != len(sent)+20 {
		t.Fatalf("loaded %d events, sent %d", left, len(sent))
	}
	h := func(m int) bson.DateTime {
		return bson.NewDateTimeFromTime(delBase.Add(time.Duration(m) * time.Minute))
	}
	steps := []struct {
		name   string
		filter bson.D
		one    bool
	}{
		{"range across bucket edges", bson.D{{Key: "ts", Value: bson.D{{Key: "$gte", Value: h(150)}, {Key: "$lt", Value: h(315)}}}}, false},
		{"meta", bson.D{{Key: "sensorId", Value: "sensor-01"}}, false},
		{"meta $in and range", bson.D{{Key: "sensorId", Value: bson.D{{Key: "$in", Value: bson.A{"sensor-02", "sensor-03"}}}}, {Key: "ts", Value: bson.D{{Key: "$lt", Value: h(100)}}}}, false},
		{"residual field", bson.D{{Key: "value", Value: bson.D{{Key: "$gt", Value: 90.0}}}}, false},
		{"residual and meta", bson.D{{Key: "sensorId", Value: "sensor-00"}, {Key: "value", Value: bson.D{{Key: "$lt", Value: 10.0}}}}, false},
		{"one by _id", bson.D{{Key: "_id", Value: sent[700].id}}, true},
		{"$or of residuals", bson.D{{Key: "$or", Value: bson.A{bson.D{{Key: "value", Value: 50.5}}, bson.D{{Key: "unit", Value: "F"}}}}}, false},
		{"nothing", bson.D{{Key: "sensorId", Value: "nobody"}}, false},
		{"metaField absent", bson.D{{Key: "sensorId", Value: bson.D{{Key: "$exists", Value: false}}}, {Key: "value", Value: bson.D{{Key: "$lt", Value: 15.0}}}}, false},
		{"metaField null or absent", bson.D{{Key: "sensorId", Value: nil}}, false},
		{"middle seq becomes a shell", bson.D{{Key: "sensorId", Value: "ordered"}, {Key: "ts", Value: bson.D{{Key: "$gte", Value: h(10)}, {Key: "$lt", Value: h(20)}}}}, false},
	}
	for _, s := range steps {
		var got, want *mongo.DeleteResult
		var err1, err2 error
		if s.one {
			got, err1 = buckets.DeleteOne(ctx, s.filter)
			want, err2 = plain.DeleteOne(ctx, s.filter)
		} else {
			got, err1 = buckets.DeleteMany(ctx, s.filter)
			want, err2 = plain.DeleteMany(ctx, s.filter)
		}
		if err1 != nil || err2 != nil {
			t.Fatalf("%s: proxy %v, direct %v", s.name, err1, err2)
		}
		if got.DeletedCount != want.DeletedCount {
			t.Fatalf("%s: proxy deleted %d, plain collection %d", s.name, got.DeletedCount, want.DeletedCount)
		}
		left = delCompare(t, ctx, db, buckets, plain)
		t.Logf("%s: deleted %d, %d left", s.name, got.DeletedCount, left)
	}

	// The "ordered" series' hour has seq 0 (minutes 0-9), an empty shell
	// at seq 1 and seq 2 (20-29); reads still find seq 2 past the shell.
	ordered := bson.D{{Key: "sensorId", Value: "ordered"}}
	if n, err := buckets.CountDocuments(ctx, ordered); err != nil || n != 20 {
		t.Fatalf("ordered series after the shell: %d events, %v; want 20", n, err)
	}
	if n := delBucketsOf(t, ctx, db, "ordered"); n != 3 {
		t.Fatalf("ordered series: %d buckets, want 3 (one an empty shell)", n)
	}
	// Emptying seq 2 removes it and the shell below it.
	res, err := buckets.DeleteMany(ctx, bson.D{{Key: "sensorId", Value: "ordered"}, {Key: "ts", Value: bson.D{{Key: "$gte", Value: h(20)}}}})
	if err != nil || res.DeletedCount != 10 {
		t.Fatalf("delete seq 2: %v, %v", res, err)
	}
	if _, err := plain.DeleteMany(ctx, bson.D{{Key: "sensorId", Value: "ordered"}, {Key: "ts", Value: bson.D{{Key: "$gte", Value: h(20)}}}}); err != nil {
		t.Fatal(err)
	}
	if n := delBucketsOf(t, ctx, db, "ordered"); n != 1 {
		t.Fatalf("ordered series: %d buckets, want 1 (the shell went with the last seq)", n)
	}
	// New events of that hour join seq 0 again (the fill was forgotten).
	more := []any{
		sentEvent{id: bson.NewObjectID(), sensor: "ordered", ts: delBase.Add(40 * time.Minute), value: 1}.doc(),
		sentEvent{id: bson.NewObjectID(), sensor: "ordered", ts: delBase.Add(41 * time.Minute), value: 2}.doc(),
	}
	if _, err := buckets.InsertMany(ctx, more); err != nil {
		t.Fatal(err)
	}
	if _, err := plain.InsertMany(ctx, more); err != nil {
		t.Fatal(err)
	}
	left = delCompare(t, ctx, db, buckets, plain)

	// deleteOne of a filter many events match removes exactly one.
	res, err = buckets.DeleteOne(ctx, bson.D{{Key: "sensorId", Value: "sensor-02"}})
	if err != nil || res.DeletedCount != 1 {
		t.Fatalf("deleteOne: %v, %v", res, err)
	}
	if n, _ := buckets.CountDocuments(ctx, bson.D{}); int(n) != left-1 {
		t.Fatalf("after deleteOne: %d events, want %d", n, left-1)
	}
	delCheckBuckets(t, ctx, db, left-1)

	// Everything: the bucket collection ends empty.
	res, err = buckets.DeleteMany(ctx, bson.D{})
	if err != nil || int(res.DeletedCount) != left-1 {
		t.Fatalf("delete all: %v, %v; want %d", res, err, left-1)
	}
	if n, _ := direct(t).Database(db).Collection("readings.buckets").CountDocuments(ctx, bson.D{}); n != 0 {
		t.Fatalf("%d buckets left after deleting every event", n)
	}
	delAppCollectionUntouched(t, ctx, db)
}

func delBucketsOf(t *testing.T, ctx context.Context, db, sensor string) int64 {
	t.Helper()
	n, err := direct(t).Database(db).Collection("readings.buckets").CountDocuments(ctx, bson.D{{Key: "meta", Value: sensor}})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// delAppCollectionUntouched: nothing reached the upstream collection of
// the app's name.
func delAppCollectionUntouched(t *testing.T, ctx context.Context, db string) {
	t.Helper()
	names, err := direct(t).Database(db).ListCollectionNames(ctx, bson.D{{Key: "name", Value: "readings"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != 0 {
		t.Fatalf("the upstream collection %s.readings exists: a command reached it", db)
	}
}

// TestDeleteStatements: several statements in one command (a document
// sequence from the driver's bulkWrite), ordered and unordered, with a
// statement the proxy refuses reported at its index.
func TestDeleteStatements(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db, p, buckets, plain, _ := delLoad(t, ctx)
	bad := bson.D{{Key: "$where", Value: "true"}}
	models := []mongo.WriteModel{
		mongo.NewDeleteManyModel().SetFilter(bson.D{{Key: "sensorId", Value: "sensor-03"}}),
		mongo.NewDeleteManyModel().SetFilter(bad),
		mongo.NewDeleteOneModel().SetFilter(bson.D{{Key: "sensorId", Value: "ordered"}, {Key: "value", Value: 5.0}}),
	}
	// Unordered: statements 0 and 2 run, 1 fails with its index.
	res, err := buckets.BulkWrite(ctx, models, options.BulkWrite().SetOrdered(false))
	var bwe mongo.BulkWriteException
	if !asBulk(err, &bwe) || len(bwe.WriteErrors) != 1 || bwe.WriteErrors[0].Index != 1 || !strings.Contains(bwe.WriteErrors[0].Message, "$where") {
		t.Fatalf("unordered bulk: %v", err)
	}
	if res.DeletedCount == 0 {
		t.Fatalf("unordered bulk deleted nothing: %+v", res)
	}
	if _, err := plain.DeleteMany(ctx, bson.D{{Key: "sensorId", Value: "sensor-03"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := plain.DeleteOne(ctx, bson.D{{Key: "sensorId", Value: "ordered"}, {Key: "value", Value: 5.0}}); err != nil {
		t.Fatal(err)
	}
	delCompare(t, ctx, db, buckets, plain)

	// Ordered: the failed statement stops the rest.
	_, err = buckets.BulkWrite(ctx, []mongo.WriteModel{
		mongo.NewDeleteManyModel().SetFilter(bad),
		mongo.NewDeleteManyModel().SetFilter(bson.D{{Key: "sensorId", Value: "sensor-00"}}),
	}, options.BulkWrite().SetOrdered(true))
	if !asBulk(err, &bwe) || len(bwe.WriteErrors) != 1 || bwe.WriteErrors[0].Index != 0 {
		t.Fatalf("ordered bulk: %v", err)
	}
	delCompare(t, ctx, db, buckets, plain)

	// Unacknowledged (w:0, moreToCome): done all the same.
	w0 := connect(t, p.URI(), "w=0").Database(db).Collection("readings")
	if _, err := w0.DeleteMany(ctx, bson.D{{Key: "sensorId", Value: "sensor-02"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := plain.DeleteMany(ctx, bson.D{{Key: "sensorId", Value: "sensor-02"}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		n, _ := buckets.CountDocuments(ctx, bson.D{{Key: "sensorId", Value: "sensor-02"}})
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("w:0 delete: %d events of sensor-02 left", n)
		}
		time.Sleep(100 * time.Millisecond)
	}
	delCompare(t, ctx, db, buckets, plain)
	delAppCollectionUntouched(t, ctx, db)
}

func asBulk(err error, out *mongo.BulkWriteException) bool {
	e, ok := err.(mongo.BulkWriteException)
	if ok {
		*out = e
	}
	return ok
}

// TestDeleteConcurrentInserts: deletes of a series racing inserts into
// the same (series, window) lose no inserted event and leave consistent
// buckets.
func TestDeleteConcurrentInserts(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: readingsRule(db, 10)})
	coll := connect(t, p.URI()).Database(db).Collection("readings")
	done := make(chan []sentEvent)
	go func() {
		done <- insertConcurrently(t, ctx, p.URI(), db, "hot", 2, 150, 7, delBase)
	}()
	// Deletes of odd values race the inserts; afterwards one more removes
	// what the racing ones may have missed.
	odd := bson.D{{Key: "sensorId", Value: "hot"}, {Key: "value", Value: bson.D{{Key: "$mod", Value: bson.A{2, 1}}}}}
	var sent []sentEvent
	for sent == nil {
		if _, err := coll.DeleteMany(ctx, odd); err != nil {
			t.Fatalf("racing delete: %v", err)
		}
		select {
		case sent = <-done:
		default:
		}
	}
	if _, err := coll.DeleteMany(ctx, odd); err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, e := range sent {
		if int(e.value)%2 == 0 {
			want++
		}
	}
	n, err := coll.CountDocuments(ctx, bson.D{})
	if err != nil || int(n) != want {
		t.Fatalf("after racing deletes: %d events, %v; want %d (every even-valued event inserted)", n, err, want)
	}
	delCheckBuckets(t, ctx, db, want)
}

// TestDeleteMongosh: deleteMany and deleteOne from mongosh.
func TestDeleteMongosh(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db, p, buckets, plain, _ := delLoad(t, ctx)
	out := runMongosh(t, p.URI(), strings.ReplaceAll(`
const sdb = connect(process.env.TSPROXY_URI + "DBNAME");
const c = sdb.readings;
const a = c.deleteMany({sensorId: "sensor-01", ts: {$gte: ISODate("2026-03-01T05:30:00Z"), $lt: ISODate("2026-03-01T12:00:00Z")}});
const b = c.deleteOne({sensorId: "ordered", value: 3});
const d = c.deleteMany({value: {$lte: 20}});
print(JSON.stringify({a: a.deletedCount, b: b.deletedCount, d: d.deletedCount, left: c.countDocuments({})}));
c.createIndex({sensorId: 1, ts: -1});
print("INDEXES: " + JSON.stringify(c.getIndexes().map(i => i.key)));
`, "DBNAME", db))
	var want []int64
	for _, f := range []bson.D{
		{{Key: "sensorId", Value: "sensor-01"}, {Key: "ts", Value: bson.D{{Key: "$gte", Value: delBase.Add(330 * time.Minute)}, {Key: "$lt", Value: delBase.Add(12 * time.Hour)}}}},
		{{Key: "sensorId", Value: "ordered"}, {Key: "value", Value: 3}},
		{{Key: "value", Value: bson.D{{Key: "$lte", Value: 20}}}},
	} {
		r, err := plain.DeleteMany(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, r.DeletedCount)
	}
	left := delCompare(t, ctx, db, buckets, plain)
	exp := fmt.Sprintf(`{"a":%d,"b":%d,"d":%d,"left":%d}`, want[0], want[1], want[2], left)
	if !strings.Contains(out, exp) {
		t.Fatalf("mongosh printed %q, want %s", out, exp)
	}
	if !strings.Contains(out, `INDEXES: [{"sensorId":1,"ts":1},{"sensorId":1,"ts":-1}]`) {
		t.Fatalf("mongosh createIndex/getIndexes: %q", out)
	}
}

// TestDeleteWaitsForLease: on FerretDB a delete needs the rule's writer
// lease; through a proxy that does not hold it (another one merged last),
// the delete waits for it to lapse and then runs, instead of being
// refused: every proxy takes a staged rule's inserts, so its deletes may
// reach any of them too.
func TestDeleteWaitsForLease(t *testing.T) {
	if !leasedWrites(t) {
		t.Skip("writer leases are taken only on upstreams whose updates are not isolated or that keep no retryable writes")
	}
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	ca, cb := twoShortLeaseProxies(t, db)
	evs := seriesEvents(40, "s", time.Date(2026, 4, 2, 0, 0, 0, 0, time.UTC))
	if _, err := ca.Database(db).Collection("readings").InsertMany(ctx, docsOf(evs)); err != nil {
		t.Fatal(err)
	}
	flush(t, ctx, ca, db+".readings") // a merges: a holds the lease
	res, err := cb.Database(db).Collection("readings").DeleteMany(ctx, bson.D{{Key: "value", Value: bson.D{{Key: "$lt", Value: 10}}}})
	if err != nil {
		t.Fatalf("delete through the proxy without the lease: %v", err)
	}
	if res.DeletedCount != 10 {
		t.Fatalf("deleted %d, want 10", res.DeletedCount)
	}
	if n, err := ca.Database(db).Collection("readings").CountDocuments(ctx, bson.D{}); err != nil || n != 30 {
		t.Fatalf("%d events left (%v), want 30", n, err)
	}
}

// TestDeleteOnePastShells: deleteOne of a series whose first seqs a delete
// emptied (kept as shells, since a later seq holds events) removes one
// event each time, as MongoDB's deleteOne removes one matching document.
// It once took the first bucket of the series, a shell, and removed
// nothing (n: 0).
func TestDeleteOnePastShells(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: readingsRule(db, 10)})
	buckets := connect(t, p.URI()).Database(db).Collection("readings")
	var docs []any
	for i := range 30 { // seq 0, 1, 2 of one hour: minutes 0-9, 10-19, 20-29
		docs = append(docs, sentEvent{id: bson.NewObjectID(), sensor: "ordered", ts: delBase.Add(time.Duration(i) * time.Minute), value: float64(i)}.doc())
	}
	if _, err := buckets.InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}
	early := bson.D{{Key: "ts", Value: bson.D{{Key: "$lt", Value: bson.NewDateTimeFromTime(delBase.Add(20 * time.Minute))}}}}
	if res, err := buckets.DeleteMany(ctx, early); err != nil || res.DeletedCount != 20 {
		t.Fatalf("delete minutes 0-19: %v, %v", res, err)
	}
	if n := delBucketsOf(t, ctx, db, "ordered"); n != 3 {
		t.Fatalf("%d buckets, want 3 (seq 0 and 1 empty shells)", n)
	}
	series := bson.D{{Key: "sensorId", Value: "ordered"}}
	for left := 10; left > 0; left-- {
		res, err := buckets.DeleteOne(ctx, series)
		if err != nil || res.DeletedCount != 1 {
			t.Fatalf("deleteOne with %d events left: %v, %v; want 1 deleted", left, res, err)
		}
		if n, err := buckets.CountDocuments(ctx, series); err != nil || int(n) != left-1 {
			t.Fatalf("after deleteOne: %d events, %v; want %d", n, err, left-1)
		}
		delCheckBuckets(t, ctx, db, left-1)
	}
	if res, err := buckets.DeleteOne(ctx, series); err != nil || res.DeletedCount != 0 {
		t.Fatalf("deleteOne of an empty series: %v, %v; want 0 deleted", res, err)
	}
}
