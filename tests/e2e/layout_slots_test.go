package e2e

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
)

func slotsRule(db, extra string) string {
	return fmt.Sprintf(`rules:
  - namespace: %s.cpu
    timeField: ts
    metaField: host
    layout: slots
    valueField: cpu
    aggregates: [cpu]
    window: hour
    slot: second
%s`, db, extra)
}

var slotsBase = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)

type sampleKey struct {
	host string
	sec  int64
}

type slotsBucket struct {
	Meta         string        `bson:"meta"`
	Start        bson.DateTime `bson:"start"`
	NumSamples   int64         `bson:"num_samples"`
	TotalSamples float64       `bson:"total_samples"`
	Values       bson.RawValue `bson:"values"` // a document, or packed (binary)
}

func readSlotsBuckets(t *testing.T, db string) []slotsBucket {
	t.Helper()
	ctx := ctxFor(t)
	cur, err := direct(t).Database(db).Collection("cpu.buckets").Find(ctx, bson.D{}, options.Find().SetSort(bson.D{{Key: "start", Value: 1}, {Key: "meta", Value: 1}}))
	if err != nil {
		t.Fatal(err)
	}
	var out []slotsBucket
	if err := cur.All(ctx, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// checkSlotsSamples checks each 1-hour slots bucket's num_samples and
// total_samples against the samples want holds for its host and hour, and
// returns the samples the buckets hold.
func checkSlotsSamples(t *testing.T, buckets []slotsBucket, want map[sampleKey]float64, when string) int64 {
	t.Helper()
	var samples int64
	for _, b := range buckets {
		var n int64
		var total float64
		for k, v := range want {
			if k.host == b.Meta && k.sec >= b.Start.Time().Unix() && k.sec < b.Start.Time().Unix()+3600 {
				n++
				total += v
			}
		}
		if b.NumSamples != n || b.TotalSamples != total {
			t.Fatalf("bucket %s %v %s: num_samples %d total_samples %v, want %d %v", b.Meta, b.Start.Time(), when, b.NumSamples, b.TotalSamples, n, total)
		}
		samples += b.NumSamples
	}
	return samples
}

func TestLayoutSlotsGoDriver(t *testing.T) {
	t.Parallel()
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: slotsRule(db, "")})
	ctx := ctxFor(t)
	coll := connect(t, p.URI()).Database(db).Collection("cpu")

	// Three hosts sampled every 10 s for two hours, then a rewrite of 100
	// samples with new values (same times): last write wins.
	hosts := []string{"web-1", "web-2", "db-1"}
	want := map[sampleKey]float64{}
	var docs []any
	for i := 0; i < 720; i++ {
		for h, host := range hosts {
			ts := slotsBase.Add(time.Duration(i) * 10 * time.Second)
			var v any = int32((i * (h + 3)) % 100)
			if i%4 == 0 {
				v = float64(i%100) + 0.25
			}
			docs = append(docs, bson.D{{Key: "host", Value: host}, {Key: "ts", Value: bson.NewDateTimeFromTime(ts)}, {Key: "cpu", Value: v}})
			want[sampleKey{host, ts.Unix()}] = num(v)
		}
	}
	for lo := 0; lo < len(docs); lo += 540 {
		if _, err := coll.InsertMany(ctx, docs[lo:min(len(docs), lo+540)]); err != nil {
			t.Fatal(err)
		}
	}
	var again []any
	for i := 0; i < 100; i++ {
		ts := slotsBase.Add(time.Duration(i*7) * 10 * time.Second)
		again = append(again, bson.D{{Key: "host", Value: "web-2"}, {Key: "ts", Value: bson.NewDateTimeFromTime(ts)}, {Key: "cpu", Value: int64(1000 + i)}})
		want[sampleKey{"web-2", ts.Unix()}] = float64(1000 + i)
	}
	if _, err := coll.InsertMany(ctx, again); err != nil {
		t.Fatal(err)
	}

	// Stored: one bucket per (host, hour); num_samples and total_samples
	// count each slot once, with its last value.
	buckets := readSlotsBuckets(t, db)
	if len(buckets) != 6 {
		t.Fatalf("%d buckets, want 6 (3 hosts x 2 hours)", len(buckets))
	}
	samples := checkSlotsSamples(t, buckets, want, "")
	if samples != int64(len(want)) {
		t.Fatalf("%d samples stored, want %d", samples, len(want))
	}

	// find: one document per written slot, values as last written.
	checkSlotsFind(t, coll, want)
	var high int64
	for k, v := range want {
		if k.host == "web-1" && v > 50 {
			high++
		}
	}
	if c, err := coll.CountDocuments(ctx, bson.D{{Key: "host", Value: "web-1"}, {Key: "cpu", Value: bson.D{{Key: "$gt", Value: 50}}}}); err != nil || c != high {
		t.Fatalf("countDocuments(web-1, cpu > 50) = %d, %v; want %d", c, err, high)
	}
	if c, err := coll.EstimatedDocumentCount(ctx); err != nil || c != int64(len(want)) {
		t.Fatalf("estimatedDocumentCount = %d, %v; want %d", c, err, len(want))
	}

	// Bad values: a string when cpu is aggregated, a missing value.
	t1 := bson.NewDateTimeFromTime(slotsBase.Add(5 * time.Hour))
	_, err := coll.InsertMany(ctx, []any{
		bson.D{{Key: "host", Value: "web-9"}, {Key: "ts", Value: t1}, {Key: "cpu", Value: "high"}},
		bson.D{{Key: "host", Value: "web-9"}, {Key: "ts", Value: t1}},
		bson.D{{Key: "host", Value: "web-9"}, {Key: "ts", Value: t1}, {Key: "cpu", Value: 7}},
	}, options.InsertMany().SetOrdered(false))
	checkWriteErrors(t, err, []int{0, 1}, `valueField "cpu" must be a number`)
	if c, err := coll.CountDocuments(ctx, bson.D{{Key: "host", Value: "web-9"}}); err != nil || c != 1 {
		t.Fatalf("countDocuments(web-9) = %d, %v; want 1", c, err)
	}
}

// checkSlotsFind reads every document of coll and checks they are
// want's samples, once each, with their values.
func checkSlotsFind(t *testing.T, coll *mongo.Collection, want map[sampleKey]float64) {
	t.Helper()
	ctx := ctxFor(t)
	cur, err := coll.Find(ctx, bson.D{}, options.Find().SetBatchSize(1000))
	if err != nil {
		t.Fatal(err)
	}
	var all []bson.M
	if err := cur.All(ctx, &all); err != nil {
		t.Fatal(err)
	}
	if len(all) != len(want) {
		t.Fatalf("find: %d documents, want %d", len(all), len(want))
	}
	for _, d := range all {
		k := sampleKey{d["host"].(string), d["ts"].(bson.DateTime).Time().Unix()}
		if w, ok := want[k]; !ok || num(d["cpu"]) != w {
			t.Fatalf("find: %v, want cpu %v", d, w)
		}
	}
}

func num(v any) float64 {
	switch x := v.(type) {
	case int32:
		return float64(x)
	case int64:
		return float64(x)
	case float64:
		return x
	}
	return -1e308
}

func TestLayoutSlotsPreallocate(t *testing.T) {
	t.Parallel()
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: slotsRule(db, "    preallocate: true\n")})
	ctx := ctxFor(t)
	coll := connect(t, p.URI()).Database(db).Collection("cpu")

	// Written zeros and non-zeros in hour 0; hour 1 is preallocated.
	var docs []any
	for i := 0; i < 30; i++ {
		docs = append(docs, bson.D{{Key: "host", Value: "h"}, {Key: "ts", Value: bson.NewDateTimeFromTime(slotsBase.Add(time.Duration(i) * time.Minute))}, {Key: "cpu", Value: int32(i % 3)}})
	}
	if _, err := coll.InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	var buckets []slotsBucket
	for {
		buckets = readSlotsBuckets(t, db)
		if len(buckets) == 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(buckets) != 2 || !buckets[1].Start.Time().Equal(slotsBase.Add(time.Hour)) || buckets[1].NumSamples != 0 {
		t.Fatalf("buckets %+v, want the written hour and a zero-filled shell for the next", buckets)
	}
	if buckets[0].NumSamples != 30 || buckets[0].TotalSamples != 30 {
		t.Fatalf("written bucket: num_samples %d total_samples %v, want 30 and 30", buckets[0].NumSamples, buckets[0].TotalSamples)
	}
	// Reads tell the 10 written zeros from the 3570 preallocated ones.
	if c, err := coll.CountDocuments(ctx, bson.D{{Key: "cpu", Value: 0}}); err != nil || c != 10 {
		t.Fatalf("countDocuments(cpu: 0) = %d, %v; want 10", c, err)
	}
	// A write into the preallocated hour fills it in place.
	if _, err := coll.InsertOne(ctx, bson.D{{Key: "host", Value: "h"}, {Key: "ts", Value: bson.NewDateTimeFromTime(slotsBase.Add(90 * time.Minute))}, {Key: "cpu", Value: 0}}); err != nil {
		t.Fatal(err)
	}
	if c, err := coll.CountDocuments(ctx, bson.D{}); err != nil || c != 31 {
		t.Fatalf("countDocuments = %d, %v; want 31", c, err)
	}
}

func TestLayoutSlotsMongosh(t *testing.T) {
	t.Parallel()
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: slotsRule(db, "")})
	script := fmt.Sprintf(`
const d = connect(process.env.TSPROXY_URI + %q);
const base = ISODate("2026-03-01T00:00:00Z").getTime();
const docs = [];
for (let i = 0; i < 600; i++) docs.push({host: "a", ts: new Date(base + i * 6000), cpu: i %% 10});
d.cpu.insertMany(docs);
d.cpu.insertOne({host: "a", ts: new Date(base), cpu: 50});
let err = "";
try { d.cpu.insertOne({host: "a", ts: new Date(base), cpu: "x"}); } catch (e) { err = e.message; }
const first = d.cpu.find({host: "a"}).sort({ts: 1}).limit(1).toArray()[0];
print(JSON.stringify({n: d.cpu.countDocuments(), high: d.cpu.countDocuments({cpu: {$gte: 9}}), first: first.cpu, err: err}));
`, db)
	out := runMongosh(t, p.URI(), script)
	line := out[strings.LastIndex(strings.TrimSpace(out), "\n")+1:]
	want := `{"n":600,"high":61,"first":50,"err":`
	if !strings.HasPrefix(line, want) || !strings.Contains(line, "must be a number") {
		t.Fatalf("mongosh output:\n%s\nwant a line starting %s", out, want)
	}
}

// TestLayoutSlotsPackedOverOlderBuckets: a bucket written before packed
// slots (a field per slot, as older proxies and `packed: false` write
// it) is read as it is, and written into: on FerretDB the merge (staged)
// or the insert (ingest: direct) packs it, keeping every slot it held,
// the last write of a slot winning.
func TestLayoutSlotsPackedOverOlderBuckets(t *testing.T) {
	t.Parallel()
	t.Run("staged", func(t *testing.T) { t.Parallel(); slotsOverOlderBucket(t, "") })
	t.Run("direct", func(t *testing.T) { t.Parallel(); slotsOverOlderBucket(t, "    ingest: direct\n") })
}

func slotsOverOlderBucket(t *testing.T, extra string) {
	db := uniqueDB(t)
	ctx := ctxFor(t)
	want := map[sampleKey]float64{}
	// Host "old", hour 0: every tenth second, the document form.
	var vals bson.D
	var total float64
	for g := 0; g < 60; g++ {
		var sub bson.D
		for s := 0; s < 60; s += 10 {
			v := float64(g*60 + s)
			sub = append(sub, bson.E{Key: strconv.Itoa(s), Value: v})
			want[sampleKey{"old", slotsBase.Unix() + int64(g*60+s)}] = v
			total += v
		}
		vals = append(vals, bson.E{Key: strconv.Itoa(g), Value: sub})
	}
	typ, data, err := bson.MarshalValue("old")
	if err != nil {
		t.Fatal(err)
	}
	older := bson.D{{Key: "_id", Value: bucket.IDOf(db+".cpu.buckets", bson.RawValue{Type: typ, Value: data}, slotsBase.UnixMilli(), 0)},
		{Key: "meta", Value: "old"}, {Key: "start", Value: bson.NewDateTimeFromTime(slotsBase)},
		{Key: "num_samples", Value: int64(len(want))}, {Key: "total_samples", Value: total}, {Key: "values", Value: vals}}
	if _, err := direct(t).Database(db).Collection("cpu.buckets").InsertOne(ctx, older); err != nil {
		t.Fatal(err)
	}

	p := startProxy(t, proxyOptions{yaml: slotsRule(db, extra)})
	coll := connect(t, p.URI()).Database(db).Collection("cpu")
	if n, err := coll.CountDocuments(ctx, bson.D{}); err != nil || n != int64(len(want)) {
		t.Fatalf("count of the older bucket = %d, %v; want %d", n, err, len(want))
	}
	// New slots of "old" (second 5 of each minute), slot 0 of each minute
	// written again, and a new host: one at a time, as apps send them.
	for m := 0; m < 60; m++ {
		for _, e := range []struct {
			host string
			sec  int
			v    float64
		}{{"old", m*60 + 5, 0.5 + float64(m)}, {"old", m * 60, -float64(m)}, {"new", m * 60, float64(m)}} {
			ts := slotsBase.Add(time.Duration(e.sec) * time.Second)
			if _, err := coll.InsertOne(ctx, bson.D{{Key: "host", Value: e.host}, {Key: "ts", Value: ts}, {Key: "cpu", Value: e.v}}); err != nil {
				t.Fatal(err)
			}
			want[sampleKey{e.host, ts.Unix()}] = e.v
		}
	}

	// Read back whole, through the proxy (which merges first).
	checkSlotsFind(t, coll, want)
	buckets := readSlotsBuckets(t, db)
	if len(buckets) != 2 {
		t.Fatalf("%d buckets, want 2 (2 hosts, one hour)", len(buckets))
	}
	if n := checkSlotsSamples(t, buckets, want, "after the merge"); n != int64(len(want)) {
		t.Fatalf("%d samples stored, want %d", n, len(want))
	}
	// On the suite's FerretDB both are packed now. An external upstream
	// may be MongoDB, where the slots are upserted in place.
	for _, b := range buckets {
		if b.Values.Type != bson.TypeBinary && !env.external {
			t.Fatalf("bucket of %s: values of type %s, want packed (binary)", b.Meta, b.Values.Type)
		}
	}
}
