package e2e

import (
	"errors"
	"fmt"
	"math/rand"
	"sort"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
)

func counterRule(db string) string {
	return fmt.Sprintf(`rules:
  - namespace: %s.hits
    timeField: ts
    metaField: page
    layout: counter
    window: minute
    slot: second
`, db)
}

var counterBase = time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)

// slotKey is one (page, second) of the expected counters.
type slotKey struct {
	page string
	sec  int64 // unix seconds
}

// genHits makes n page hits over ten minutes, at random milliseconds, and
// the number expected in each (page, second).
func genHits(n int, seed int64) ([]any, map[slotKey]int) {
	rng := rand.New(rand.NewSource(seed))
	pages := []string{"/", "/index.htm", "/about", "/shop", "/cart"}
	docs := make([]any, n)
	want := map[slotKey]int{}
	for i := range docs {
		p := pages[rng.Intn(len(pages))]
		t := counterBase.Add(time.Duration(rng.Int63n(int64(10 * time.Minute))))
		docs[i] = bson.D{{Key: "page", Value: p}, {Key: "ts", Value: bson.NewDateTimeFromTime(t)}}
		want[slotKey{p, t.Unix()}]++
	}
	return docs, want
}

type counterDoc struct {
	ID    string        `bson:"_id"`
	Page  *string       `bson:"page"`
	TS    bson.DateTime `bson:"ts"`
	Count int64         `bson:"count"`
}

func TestLayoutCounterGoDriver(t *testing.T) {
	t.Parallel()
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: counterRule(db)})
	ctx := ctxFor(t)
	coll := connect(t, p.URI()).Database(db).Collection("hits")

	const n = 3000
	docs, want := genHits(n, 7)
	for lo := 0; lo < n; lo += 500 {
		res, err := coll.InsertMany(ctx, docs[lo:lo+500])
		if err != nil {
			t.Fatal(err)
		}
		if len(res.InsertedIDs) != 500 {
			t.Fatalf("inserted %d", len(res.InsertedIDs))
		}
	}

	// Stored: one bucket per (page, minute), totals and slots exact.
	buckets := readCounterBuckets(t, ctx, db)
	windows := map[string]bool{}
	for k := range want {
		windows[fmt.Sprint(k.page, k.sec/60)] = true
	}
	if len(buckets) != len(windows) {
		t.Fatalf("%d buckets, want one per (page, minute): %d", len(buckets), len(windows))
	}
	var total int64
	for _, b := range buckets {
		var inSlots int64
		for s, c := range b.Slots {
			var i int64
			fmt.Sscan(s, &i)
			if c != int64(want[slotKey{b.Meta, b.Start.Time().Unix() + i}]) {
				t.Fatalf("bucket %s %v slot %s = %d, want %d", b.Meta, b.Start.Time(), s, c, want[slotKey{b.Meta, b.Start.Time().Unix() + i}])
			}
			inSlots += c
		}
		if inSlots != b.Total {
			t.Fatalf("bucket total %d, slots sum to %d", b.Total, inSlots)
		}
		total += b.Total
	}
	if total != n {
		t.Fatalf("buckets count %d events, want %d", total, n)
	}

	// find: one document per non-empty slot; the counts sum to n.
	var all []counterDoc
	cur, err := coll.Find(ctx, bson.D{}, options.Find().SetBatchSize(50))
	if err != nil {
		t.Fatal(err)
	}
	if err := cur.All(ctx, &all); err != nil {
		t.Fatal(err)
	}
	if len(all) != len(want) {
		t.Fatalf("find: %d slot documents, want %d", len(all), len(want))
	}
	var sum int64
	ids := map[string]bool{}
	for _, d := range all {
		if d.Page == nil || int64(want[slotKey{*d.Page, d.TS.Time().Unix()}]) != d.Count {
			t.Fatalf("find: %+v does not match the events sent", d)
		}
		sum += d.Count
		ids[d.ID] = true
	}
	if sum != n || len(ids) != len(all) {
		t.Fatalf("find: counts sum to %d (want %d), %d distinct ids of %d", sum, n, len(ids), len(all))
	}

	// A filtered, sorted, skipped and limited find, in small batches.
	lo, hi := counterBase.Add(2*time.Minute), counterBase.Add(5*time.Minute+30*time.Second)
	var exp []slotKey
	for k := range want {
		if k.page == "/shop" && k.sec >= lo.Unix() && k.sec < hi.Unix() && want[k] >= 1 {
			exp = append(exp, k)
		}
	}
	sort.Slice(exp, func(i, j int) bool { return exp[i].sec > exp[j].sec })
	exp = exp[3:min(len(exp), 3+40)]
	filter := bson.D{{Key: "page", Value: "/shop"}, {Key: "ts", Value: bson.D{{Key: "$gte", Value: lo}, {Key: "$lt", Value: hi}}}}
	cur, err = coll.Find(ctx, filter, options.Find().SetSort(bson.D{{Key: "ts", Value: -1}}).SetSkip(3).SetLimit(40).SetBatchSize(7))
	if err != nil {
		t.Fatal(err)
	}
	var got []counterDoc
	if err := cur.All(ctx, &got); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(exp) {
		t.Fatalf("filtered find: %d documents, want %d", len(got), len(exp))
	}
	for i, d := range got {
		if d.TS.Time().Unix() != exp[i].sec || d.Count != int64(want[exp[i]]) {
			t.Fatalf("filtered find [%d] = %v %d, want %v %d", i, d.TS.Time(), d.Count, time.Unix(exp[i].sec, 0), want[exp[i]])
		}
	}

	// Filters on count, projection.
	var busy int
	var busyEvents int64
	for _, c := range want {
		if c >= 3 {
			busy++
			busyEvents += int64(c)
		}
	}
	cur, err = coll.Find(ctx, bson.D{{Key: "count", Value: bson.D{{Key: "$gte", Value: 3}}}}, options.Find().SetProjection(bson.D{{Key: "_id", Value: 0}, {Key: "count", Value: 1}}))
	if err != nil {
		t.Fatal(err)
	}
	var projected []bson.D
	if err := cur.All(ctx, &projected); err != nil {
		t.Fatal(err)
	}
	if len(projected) != busy || (busy > 0 && (len(projected[0]) != 1 || projected[0][0].Key != "count")) {
		t.Fatalf("count filter: %d documents (want %d), first %v", len(projected), busy, projected[:min(1, len(projected))])
	}

	// Counts are events: countDocuments, estimatedDocumentCount, $count.
	if c, err := coll.CountDocuments(ctx, bson.D{}); err != nil || c != n {
		t.Fatalf("countDocuments = %d, %v; want %d", c, err, n)
	}
	if c, err := coll.EstimatedDocumentCount(ctx); err != nil || c != n {
		t.Fatalf("estimatedDocumentCount = %d, %v; want %d", c, err, n)
	}
	if c, err := coll.CountDocuments(ctx, bson.D{{Key: "count", Value: bson.D{{Key: "$gte", Value: 3}}}}); err != nil || c != busyEvents {
		t.Fatalf("countDocuments(count >= 3) = %d, %v; want %d", c, err, busyEvents)
	}
	var shop int64
	for k, c := range want {
		if k.page == "/shop" {
			shop += int64(c)
		}
	}
	agg, err := coll.Aggregate(ctx, mongo.Pipeline{{{Key: "$match", Value: bson.D{{Key: "page", Value: "/shop"}}}}, {{Key: "$count", Value: "events"}}})
	if err != nil {
		t.Fatal(err)
	}
	var counted []struct {
		Events int64 `bson:"events"`
	}
	if err := agg.All(ctx, &counted); err != nil || len(counted) != 1 || counted[0].Events != shop {
		t.Fatalf("$count of /shop = %+v, %v; want %d", counted, err, shop)
	}

	// Bad events: writeErrors with the app's indexes; the good ones count.
	t1 := bson.NewDateTimeFromTime(counterBase.Add(30 * time.Minute))
	bad := []any{
		bson.D{{Key: "page", Value: "/x"}, {Key: "ts", Value: t1}},
		bson.D{{Key: "page", Value: "/x"}},
		bson.D{{Key: "page", Value: "/x"}, {Key: "ts", Value: "yesterday"}},
		bson.D{{Key: "page", Value: "/x"}, {Key: "ts", Value: t1}},
	}
	_, err = coll.InsertMany(ctx, bad, options.InsertMany().SetOrdered(false))
	checkWriteErrors(t, err, []int{1, 2}, "'ts' must be present")
	_, err = coll.InsertMany(ctx, bad) // ordered: stops at index 1
	checkWriteErrors(t, err, []int{1}, "'ts' must be present and contain a valid BSON UTC datetime value (got none)")
	if c, err := coll.CountDocuments(ctx, bson.D{{Key: "page", Value: "/x"}}); err != nil || c != 3 {
		t.Fatalf("countDocuments(/x) = %d, %v; want 3 (2 unordered + 1 ordered)", c, err)
	}

	// Unsupported filters are refused by name.
	_, err = coll.Find(ctx, bson.D{{Key: "$where", Value: "true"}})
	if err == nil || !strings.Contains(err.Error(), "$where") || !strings.Contains(err.Error(), "not supported") {
		t.Fatalf("$where: %v", err)
	}
	// The proxy's filter has MongoDB's semantics: a regex, on the
	// documents the counter read makes.
	if c, err := coll.CountDocuments(ctx, bson.D{{Key: "page", Value: bson.D{{Key: "$regex", Value: "^/X$"}, {Key: "$options", Value: "i"}}}}); err != nil || c != 3 {
		t.Fatalf("countDocuments(page ~ /^\\/X$/i) = %d, %v; want 3", c, err)
	}
	err = coll.Distinct(ctx, "page", bson.D{}).Err()
	if err == nil || !strings.Contains(err.Error(), "not supported on a namespace with layout counter") {
		t.Fatalf("distinct: %v", err)
	}

	// drop empties the namespace.
	if err := coll.Drop(ctx); err != nil {
		t.Fatal(err)
	}
	if c, err := coll.CountDocuments(ctx, bson.D{}); err != nil || c != 0 {
		t.Fatalf("countDocuments after drop = %d, %v", c, err)
	}
}

// checkWriteErrors checks an insert failed for exactly the events at idx.
func checkWriteErrors(t *testing.T, err error, idx []int, msg string) {
	t.Helper()
	var bwe mongo.BulkWriteException
	if !errors.As(err, &bwe) {
		t.Fatalf("want write errors at %v, got %v", idx, err)
	}
	var got []int
	for _, we := range bwe.WriteErrors {
		got = append(got, we.Index)
		if !strings.Contains(we.Message, "tsproxy rule") {
			t.Errorf("write error %d: %q does not name the rule", we.Index, we.Message)
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(idx) || !strings.Contains(bwe.WriteErrors[0].Message, msg) {
		t.Fatalf("write errors at %v (%v), want %v with %q", got, bwe.WriteErrors, idx, msg)
	}
}

func TestLayoutCounterMongosh(t *testing.T) {
	t.Parallel()
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: counterRule(db)})
	script := fmt.Sprintf(`
const d = connect(process.env.TSPROXY_URI + %q);
const base = ISODate("2026-03-01T10:00:00Z").getTime();
let sent = 0;
for (let b = 0; b < 4; b++) {
  const docs = [];
  for (let i = 0; i < 250; i++) {
    const k = b * 250 + i;
    docs.push({page: k %% 3 == 0 ? "/index.htm" : "/about", ts: new Date(base + k * 1700)});
  }
  d.hits.insertMany(docs);
  sent += docs.length;
}
d.hits.insertOne({page: "/index.htm", ts: new Date(base)});
sent++;
let err = "";
try { d.hits.insertOne({page: "/index.htm"}); } catch (e) { err = e.message; }
const docs = d.hits.find({page: "/index.htm"}).sort({ts: 1}).toArray();
let sum = 0;
docs.forEach(x => { sum += x.count; });
print(JSON.stringify({sent: sent, total: d.hits.countDocuments(), index: d.hits.countDocuments({page: "/index.htm"}),
  sum: sum, first: docs[0].count, est: d.hits.estimatedDocumentCount(), err: err}));
`, db)
	out := runMongosh(t, p.URI(), script)
	line := out[strings.LastIndex(strings.TrimSpace(out), "\n")+1:]
	// 1000 events in batches, every third on /index.htm (334), plus one more.
	want := `{"sent":1001,"total":1001,"index":335,"sum":335,"first":2,"est":1001,"err":`
	if !strings.HasPrefix(line, want) || !strings.Contains(line, "must be present and contain a valid BSON UTC datetime value") {
		t.Fatalf("mongosh output:\n%s\nwant a line starting %s", out, want)
	}
}

// TestLayoutCounterPackedOverOlderBuckets: a counter bucket written
// before packed maps (a field per slot, as older proxies and `packed:
// false` write it, with an older write's mark) is counted into by a merge
// (staged) or an insert (ingest: direct): every hit counted once, the
// totals exact, and on FerretDB the bucket packed afterwards.
func TestLayoutCounterPackedOverOlderBuckets(t *testing.T) {
	t.Parallel()
	for _, ingest := range []string{"staged", "direct"} {
		t.Run(ingest, func(t *testing.T) {
			t.Parallel()
			db := uniqueDB(t)
			ctx := ctxFor(t)
			typ, data, err := bson.MarshalValue("/old")
			if err != nil {
				t.Fatal(err)
			}
			older := bson.D{{Key: "_id", Value: bucket.IDOf(db+".hits.buckets", bson.RawValue{Type: typ, Value: data}, counterBase.UnixMilli(), 0)},
				{Key: "meta", Value: "/old"}, {Key: "start", Value: bson.NewDateTimeFromTime(counterBase)},
				{Key: "total", Value: int64(5)}, {Key: "slots", Value: bson.D{{Key: "0", Value: int64(3)}, {Key: "10", Value: int32(2)}}},
				{Key: "applied", Value: bson.D{{Key: "g0", Value: bson.D{{Key: "0123456789abcdef01234567", Value: true}}}}}}
			if _, err := direct(t).Database(db).Collection("hits.buckets").InsertOne(ctx, older); err != nil {
				t.Fatal(err)
			}
			yaml := counterRule(db)
			if ingest == "direct" {
				yaml += "    ingest: direct\n"
			}
			p := startProxy(t, proxyOptions{yaml: yaml})
			coll := connect(t, p.URI()).Database(db).Collection("hits")
			want := map[slotKey]int{{"/old", counterBase.Unix()}: 3, {"/old", counterBase.Unix() + 10}: 2}
			for i := range 30 {
				for _, page := range []string{"/old", "/new"} {
					sec := int64(i % 12)
					ts := counterBase.Add(time.Duration(sec)*time.Second + time.Duration(i)*time.Millisecond)
					if _, err := coll.InsertOne(ctx, bson.D{{Key: "page", Value: page}, {Key: "ts", Value: ts}}); err != nil {
						t.Fatal(err)
					}
					want[slotKey{page, counterBase.Unix() + sec}]++
				}
			}
			if n, err := coll.CountDocuments(ctx, bson.D{}); err != nil || n != 65 {
				t.Fatalf("countDocuments = %d, %v; want 65 hits", n, err)
			}
			got, total := counterBuckets(t, ctx, db)
			if total != 65 || len(got) != len(want) {
				t.Fatalf("stored: %d hits in %d slots, want 65 in %d", total, len(got), len(want))
			}
			for k, c := range want {
				if got[k] != c {
					t.Fatalf("%v: %d hits stored, want %d", k, got[k], c)
				}
			}
			var raw []bson.Raw
			cur, err := direct(t).Database(db).Collection("hits.buckets").Find(ctx, bson.D{})
			if err != nil {
				t.Fatal(err)
			}
			if err := cur.All(ctx, &raw); err != nil {
				t.Fatal(err)
			}
			for _, b := range raw {
				if typ := b.Lookup("slots").Type; typ != bson.TypeBinary && !env.external {
					t.Fatalf("bucket %s: slots of type %s, want packed (binary)", b.Lookup("meta"), typ)
				}
			}
		})
	}
}
