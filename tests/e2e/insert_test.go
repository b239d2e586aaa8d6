package e2e

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/tsproxy/tsproxy/rewrite/bucket"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
)

// readingsRule is a rule for db.readings: sensorId series, 1-hour buckets.
func readingsRule(db string, maxEvents int) string {
	return fmt.Sprintf(`rules:
  - namespace: %s.readings
    timeField: ts
    metaField: sensorId
    bucket:
      span: 1h
      maxEvents: %d
    aggregates: [value]
`, db, maxEvents)
}

// zstdDecoder reads compressed packed events (DecodeAll only, which may
// run concurrently).
var zstdDecoder, _ = zstd.NewReader(nil)

// bucketDoc is a stored bucket as the tests read it back directly.
type bucketDoc struct {
	ID     bson.ObjectID `bson:"_id"`
	Meta   any           `bson:"meta"`
	Start  time.Time     `bson:"start"`
	Count  int64         `bson:"count"`
	Min    bson.M        `bson:"min"`
	Max    bson.M        `bson:"max"`
	Sum    bson.M        `bson:"sum"`
	Events []bson.D      `bson:"events"`
}

// UnmarshalBSON reads a bucket's events wherever they are stored: packed
// (one binary value, on FerretDB: the BSON of their array, as it is with
// subtype 0, one zstd frame of it with subtype 0x80) first, then the
// array (see bucket.EventValues and rewrite/bucket/pack.go).
func (b *bucketDoc) UnmarshalBSON(data []byte) error {
	type plain bucketDoc
	var d struct {
		Plain  plain        `bson:",inline"`
		Packed *bson.Binary `bson:"packed"`
	}
	err := bson.Unmarshal(data, &d)
	if err != nil {
		return err
	}
	*b = bucketDoc(d.Plain)
	if d.Packed == nil {
		return nil
	}
	arr := d.Packed.Data
	switch d.Packed.Subtype {
	case bucket.SubtypeArray:
	case bucket.SubtypeZstdArray:
		if arr, err = zstdDecoder.DecodeAll(arr, nil); err != nil {
			return fmt.Errorf("bucket %v: compressed events: %w", b.ID, err)
		}
	default:
		return fmt.Errorf("bucket %v: packed events of subtype %#x", b.ID, d.Packed.Subtype)
	}
	vals, err := bson.Raw(arr).Values()
	if err != nil {
		return fmt.Errorf("bucket %v: packed events: %w", b.ID, err)
	}
	packed := make([]bson.D, 0, len(vals)+len(b.Events))
	for _, v := range vals {
		var ev bson.D
		if err := v.Unmarshal(&ev); err != nil {
			return fmt.Errorf("bucket %v: packed event: %w", b.ID, err)
		}
		packed = append(packed, ev)
	}
	b.Events = append(packed, b.Events...)
	return nil
}

func readBuckets(t *testing.T, ctx context.Context, db string) []bucketDoc {
	t.Helper()
	return readBucketsIn(t, ctx, direct(t), db)
}

// readBucketsIn is readBuckets on the upstream c (a test's own).
func readBucketsIn(t *testing.T, ctx context.Context, c *mongo.Client, db string) []bucketDoc {
	t.Helper()
	cur, err := c.Database(db).Collection("readings.buckets").Find(ctx, bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	var out []bucketDoc
	if err := cur.All(ctx, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

type sentEvent struct {
	id     bson.ObjectID
	sensor string
	ts     time.Time
	value  float64
}

// genEvents makes n events over series sensors and days days, at random
// times (millisecond precision, as BSON dates are).
func genEvents(n, series, days int, seed uint64) []sentEvent {
	r := rand.New(rand.NewPCG(seed, 7))
	base := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	out := make([]sentEvent, n)
	for i := range out {
		out[i] = sentEvent{
			id:     bson.NewObjectID(),
			sensor: fmt.Sprintf("sensor-%02d", r.IntN(series)),
			ts:     base.Add(time.Duration(r.Int64N(int64(days)*24*3600*1000)) * time.Millisecond),
			value:  math.Round(r.Float64()*1000) / 10,
		}
	}
	return out
}

func (e sentEvent) doc() bson.D {
	return bson.D{{Key: "_id", Value: e.id}, {Key: "ts", Value: e.ts}, {Key: "sensorId", Value: e.sensor}, {Key: "value", Value: e.value}, {Key: "unit", Value: "C"}}
}

// checkStored asserts that the buckets hold exactly the sent events, once
// each, in the right (series, window), with summaries that match them.
func checkStored(t *testing.T, buckets []bucketDoc, sent []sentEvent, maxEvents int) {
	t.Helper()
	want := make(map[bson.ObjectID]sentEvent, len(sent))
	for _, e := range sent {
		want[e.id] = e
	}
	seen := make(map[bson.ObjectID]bool, len(sent))
	var total int64
	for _, b := range buckets {
		if int(b.Count) != len(b.Events) {
			t.Fatalf("bucket %v: count %d but %d events", b.ID, b.Count, len(b.Events))
		}
		if b.Count > int64(maxEvents) {
			t.Fatalf("bucket %v: %d events > maxEvents %d", b.ID, b.Count, maxEvents)
		}
		total += b.Count
		minT, maxT := time.Time{}, time.Time{}
		minV, maxV, sumV := math.Inf(1), math.Inf(-1), 0.0
		for _, ev := range b.Events {
			m := dmap(ev)
			id, _ := m["_id"].(bson.ObjectID)
			se, ok := want[id]
			if !ok {
				t.Fatalf("bucket %v holds an event %v that was never sent", b.ID, id)
			}
			if seen[id] {
				t.Fatalf("event %v stored twice", id)
			}
			seen[id] = true
			if b.Meta != se.sensor {
				t.Fatalf("event %v of %s stored in bucket of %v", id, se.sensor, b.Meta)
			}
			if !b.Start.Equal(se.ts.Truncate(time.Hour)) {
				t.Fatalf("event %v at %v stored in window %v", id, se.ts, b.Start)
			}
			// The stored event keeps the meta key as a null marker, in place.
			if len(ev) != 5 || ev[2].Key != "sensorId" || ev[2].Value != nil {
				t.Fatalf("stored event layout: %v", ev)
			}
			if minT.IsZero() || se.ts.Before(minT) {
				minT = se.ts
			}
			if se.ts.After(maxT) {
				maxT = se.ts
			}
			minV, maxV, sumV = math.Min(minV, se.value), math.Max(maxV, se.value), sumV+se.value
		}
		if got := b.Min["ts"].(bson.DateTime).Time(); !got.Equal(minT) {
			t.Fatalf("bucket %v: min.ts %v, events say %v", b.ID, got, minT)
		}
		if got := b.Max["ts"].(bson.DateTime).Time(); !got.Equal(maxT) {
			t.Fatalf("bucket %v: max.ts %v, events say %v", b.ID, got, maxT)
		}
		if b.Min["value"] != minV || b.Max["value"] != maxV {
			t.Fatalf("bucket %v: min/max value %v/%v, events say %v/%v", b.ID, b.Min["value"], b.Max["value"], minV, maxV)
		}
		if got := b.Sum["value"].(float64); math.Abs(got-sumV) > 1e-6*math.Max(1, math.Abs(sumV)) {
			t.Fatalf("bucket %v: sum.value %v, events say %v", b.ID, got, sumV)
		}
	}
	if total != int64(len(sent)) || len(seen) != len(sent) {
		t.Fatalf("stored %d events (%d distinct), sent %d", total, len(seen), len(sent))
	}
}

// seriesWindows counts the distinct (series, window) pairs of events.
func seriesWindows(sent []sentEvent) int {
	m := map[string]bool{}
	for _, e := range sent {
		m[e.sensor+e.ts.Truncate(time.Hour).String()] = true
	}
	return len(m)
}

// TestInsertBucketsGoDriver: 10,000 events over 10 series and 3 days, with
// insertMany of several batch sizes and insertOne, become one bucket per
// (series, hour) holding exactly those events with exact summaries.
func TestInsertBucketsGoDriver(t *testing.T) {
	t.Parallel()
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: readingsRule(db, 1000)})
	ctx := ctxFor(t)
	coll := connect(t, p.URI()).Database(db).Collection("readings")
	sent := genEvents(10_000, 10, 3, 1)
	sizes := []int{1000, 500, 1, 250, 37, 1}
	for i, k := 0, 0; i < len(sent); k++ {
		n := min(sizes[k%len(sizes)], len(sent)-i)
		if n == 1 {
			res, err := coll.InsertOne(ctx, sent[i].doc())
			if err != nil {
				t.Fatal(err)
			}
			if res.InsertedID != sent[i].id {
				t.Fatalf("insertedId %v, want %v", res.InsertedID, sent[i].id)
			}
		} else {
			docs := make([]any, n)
			for j := range docs {
				docs[j] = sent[i+j].doc()
			}
			res, err := coll.InsertMany(ctx, docs)
			if err != nil {
				t.Fatal(err)
			}
			if len(res.InsertedIDs) != n {
				t.Fatalf("inserted %d, want %d", len(res.InsertedIDs), n)
			}
		}
		i += n
	}
	buckets := readBuckets(t, ctx, db)
	if want := seriesWindows(sent); len(buckets) != want {
		t.Fatalf("%d buckets, want one per (series, hour) = %d", len(buckets), want)
	}
	checkStored(t, buckets, sent, 1000)
	// Nothing went to the app's namespace on the upstream.
	if n, err := direct(t).Database(db).Collection("readings").CountDocuments(ctx, bson.D{}); err != nil || n != 0 {
		t.Fatalf("plain collection holds %d documents (err %v)", n, err)
	}
	// The proxy made its {meta, start} index where the upstream reads by
	// it (MongoDB), and not on FerretDB, which reads by no index but _id's
	// (caps.UnusedIndexes); the app lists it either way.
	specs, err := direct(t).Database(db).Collection("readings.buckets").Indexes().ListSpecifications(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, s := range specs {
		if s.Name == "meta_1_start_1" {
			found = true
		}
	}
	if found != env.external {
		t.Fatalf("bucket index made: %v, want %v (upstream indexes %+v)", found, env.external, specs)
	}
	listed, err := coll.Indexes().ListSpecifications(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(listed) != 1 || listed[0].Name != "sensorId_1_ts_1" {
		t.Fatalf("indexes listed through the proxy: %+v", listed)
	}
}

// TestInsertOverflow: past maxEvents, a new bucket starts; events of one
// series and window spread over ceil(n/max)..n buckets, none over max.
func TestInsertOverflow(t *testing.T) {
	t.Parallel()
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: readingsRule(db, 50)})
	ctx := ctxFor(t)
	coll := connect(t, p.URI()).Database(db).Collection("readings")
	sent := genEvents(1200, 2, 1, 2) // ~25 windows per series, ~24 events each
	for i := 0; i < len(sent); i += 60 {
		docs := []any{}
		for _, e := range sent[i:min(i+60, len(sent))] {
			docs = append(docs, e.doc())
		}
		if _, err := coll.InsertMany(ctx, docs); err != nil {
			t.Fatal(err)
		}
	}
	// One more window, filled far past maxEvents with single inserts and a
	// large batch.
	base := time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)
	var extra []sentEvent
	for i := 0; i < 230; i++ {
		extra = append(extra, sentEvent{id: bson.NewObjectID(), sensor: "hot", ts: base.Add(time.Duration(i) * time.Second), value: float64(i)})
	}
	for _, e := range extra[:30] {
		if _, err := coll.InsertOne(ctx, e.doc()); err != nil {
			t.Fatal(err)
		}
	}
	docs := []any{}
	for _, e := range extra[30:] {
		docs = append(docs, e.doc())
	}
	if _, err := coll.InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}
	sent = append(sent, extra...)
	buckets := readBuckets(t, ctx, db)
	checkStored(t, buckets, sent, 50)
	hot := 0
	for _, b := range buckets {
		if b.Meta == "hot" {
			hot++
		}
	}
	if hot < 5 { // 230 events, at most 50 per bucket
		t.Fatalf("hot window in %d buckets, want >= 5", hot)
	}
}

// TestInsertBadEvents: an event without a valid time field is rejected
// with its index; ordered stops there, unordered writes all the others.
func TestInsertBadEvents(t *testing.T) {
	t.Parallel()
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: readingsRule(db, 1000)})
	ctx := ctxFor(t)
	coll := connect(t, p.URI()).Database(db).Collection("readings")
	good := genEvents(6, 2, 1, 3)
	docs := []any{good[0].doc(), good[1].doc(),
		bson.D{{Key: "sensorId", Value: "x"}, {Key: "value", Value: 1.0}}, // no ts
		good[2].doc(),
		bson.D{{Key: "ts", Value: "yesterday"}, {Key: "sensorId", Value: "x"}}, // ts not a date
		good[3].doc()}
	_, err := coll.InsertMany(ctx, docs) // ordered
	var bwe mongo.BulkWriteException
	if !errors.As(err, &bwe) || len(bwe.WriteErrors) != 1 || bwe.WriteErrors[0].Index != 2 {
		t.Fatalf("ordered: want one write error at index 2, got %v", err)
	}
	if !strings.Contains(bwe.WriteErrors[0].Message, `'ts' must be present`) || !strings.Contains(bwe.WriteErrors[0].Message, db+".readings") {
		t.Fatalf("error should name the time field and the rule: %q", bwe.WriteErrors[0].Message)
	}
	checkStored(t, readBuckets(t, ctx, db), good[:2], 1000)

	// Unordered: the other three good ones are written, both bad reported.
	_, err = coll.InsertMany(ctx, []any{docs[2], docs[3], docs[4], docs[5]}, options.InsertMany().SetOrdered(false))
	if !errors.As(err, &bwe) || len(bwe.WriteErrors) != 2 || bwe.WriteErrors[0].Index != 0 || bwe.WriteErrors[1].Index != 2 {
		t.Fatalf("unordered: want write errors at 0 and 2, got %v", err)
	}
	if !strings.Contains(bwe.WriteErrors[1].Message, "date") {
		t.Fatalf("error should say the time field must be a date: %q", bwe.WriteErrors[1].Message)
	}
	checkStored(t, readBuckets(t, ctx, db), good[:4], 1000)
}

// TestInsertConcurrent: 16 clients insert into the same series at once;
// every event is stored exactly once.
func TestInsertConcurrent(t *testing.T) {
	t.Parallel()
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: readingsRule(db, 100)})
	ctx := ctxFor(t)
	const clients, perClient = 16, 150
	base := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	sent := insertConcurrently(t, ctx, p.URI(), db, "shared", clients, perClient, 7, base)
	checkStored(t, readBuckets(t, ctx, db), sent, 100)
}

// TestInsertUnacknowledged: w:0 inserts (moreToCome) are bucketed too.
func TestInsertUnacknowledged(t *testing.T) {
	t.Parallel()
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: readingsRule(db, 1000)})
	ctx := ctxFor(t)
	cl := connect(t, p.URI())
	coll := cl.Database(db).Collection("readings", options.Collection().SetWriteConcern(writeconcern.Unacknowledged()))
	sent := genEvents(300, 3, 1, 4)
	for i := 0; i < len(sent); i += 100 {
		docs := []any{}
		for _, e := range sent[i : i+100] {
			docs = append(docs, e.doc())
		}
		if _, err := coll.InsertMany(ctx, docs); err != nil {
			t.Fatal(err)
		}
	}
	// An acknowledged command on the same client orders after them only on
	// the same connection; poll instead.
	deadline := time.Now().Add(20 * time.Second)
	for {
		var total int64
		for _, b := range readBuckets(t, ctx, db) {
			total += b.Count
		}
		if total == int64(len(sent)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 20s, %d of %d unacknowledged events stored", total, len(sent))
		}
		time.Sleep(100 * time.Millisecond)
	}
	checkStored(t, readBuckets(t, ctx, db), sent, 1000)
}

// TestInsertMongosh: the same through the real mongosh (Node.js driver):
// insertMany and insertOne, then the buckets are checked directly.
func TestInsertMongosh(t *testing.T) {
	t.Parallel()
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: readingsRule(db, 1000)})
	ctx := ctxFor(t)
	script := fmt.Sprintf(`
const d = connect(process.env.TSPROXY_URI + %q);
const base = ISODate("2026-03-01T00:00:00Z").getTime();
let n = 0, sum = 0;
for (let b = 0; b < 10; b++) {
  const docs = [];
  for (let i = 0; i < 199; i++) {
    const k = b * 200 + i;
    docs.push({ts: new Date(base + k * 97000), sensorId: "sensor-" + (k %% 10), value: k %% 100, unit: "C"});
    sum += k %% 100;
  }
  const r = d.readings.insertMany(docs);
  n += Object.keys(r.insertedIds).length;
  const k = b * 200 + 199;
  d.readings.insertOne({ts: new Date(base + k * 97000), sensorId: "sensor-" + (k %% 10), value: k %% 100, unit: "C"});
  sum += k %% 100;
  n++;
}
let err = "";
try { d.readings.insertOne({sensorId: "nots", value: 1}); } catch (e) { err = e.message; }
print(JSON.stringify({n: n, sum: sum, err: err}));
`, db)
	out := runMongosh(t, p.URI(), script)
	line := out[strings.LastIndex(strings.TrimSpace(out), "\n")+1:]
	if !strings.Contains(line, `"n":2000`) || !strings.Contains(line, `'ts' must be present and contain a valid BSON UTC datetime value`) {
		t.Fatalf("mongosh output: %s", out)
	}
	buckets := readBuckets(t, ctx, db)
	var total int64
	var sum float64
	windows := map[string]bool{}
	for _, b := range buckets {
		total += b.Count
		switch v := b.Sum["value"].(type) {
		case int32:
			sum += float64(v)
		case int64:
			sum += float64(v)
		case float64:
			sum += v
		}
		windows[fmt.Sprint(b.Meta, b.Start)] = true
	}
	if total != 2000 || len(windows) != len(buckets) {
		t.Fatalf("mongosh: %d events in %d buckets (%d distinct windows)", total, len(buckets), len(windows))
	}
	var wantSum float64
	for k := 0; k < 2000; k++ {
		wantSum += float64(k % 100)
	}
	if sum != wantSum {
		t.Fatalf("sum of sums %v, want %v", sum, wantSum)
	}
	ids := map[any]bool{}
	for _, b := range buckets {
		for _, ev := range b.Events {
			ids[fmt.Sprint(dmap(ev)["_id"])] = true
		}
	}
	if len(ids) != 2000 {
		t.Fatalf("%d distinct event ids, want 2000", len(ids))
	}
}

func dmap(d bson.D) bson.M {
	m := make(bson.M, len(d))
	for _, e := range d {
		m[e.Key] = e.Value
	}
	return m
}

// TestInsertSeqIDs: 4 clients write one series and window far past
// maxEvents at once; its buckets are exactly the deterministic ids of seq
// 0..n, none over maxEvents, every event once.
func TestInsertSeqIDs(t *testing.T) {
	t.Parallel()
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: readingsRule(db, 20)})
	ctx := ctxFor(t)
	const clients, perClient = 4, 60
	base := time.Date(2026, 7, 1, 3, 0, 0, 0, time.UTC)
	sent := insertConcurrently(t, ctx, p.URI(), db, "seq", clients, perClient, 9, base)
	buckets := readBuckets(t, ctx, db)
	checkStored(t, buckets, sent, 20)
	ids := map[bson.ObjectID]bool{}
	for _, b := range buckets {
		ids[b.ID] = true
	}
	_, metaBytes, err := bson.MarshalValue("seq")
	if err != nil {
		t.Fatal(err)
	}
	meta := bson.RawValue{Type: bson.TypeString, Value: metaBytes}
	for seq := 0; seq < len(buckets); seq++ {
		if id := bucket.IDOf(db+".readings.buckets", meta, base.UnixMilli(), seq); !ids[id] {
			t.Fatalf("bucket seq %d (%v) missing among %d buckets", seq, id, len(buckets))
		}
	}
	if min := (clients*perClient + 19) / 20; len(buckets) < min {
		t.Fatalf("%d buckets, want at least %d", len(buckets), min)
	}
}

// insertConcurrently has clients connections write perClient events each
// of one series, at consecutive seconds from base, in insertMany batches of
// 1..maxBatch events, all at once; it returns the events acknowledged.
func insertConcurrently(t *testing.T, ctx context.Context, uri, db, sensor string, clients, perClient, maxBatch int, base time.Time) []sentEvent {
	t.Helper()
	var mu sync.Mutex
	var sent []sentEvent
	colls := make([]*mongo.Collection, clients)
	for c := range colls {
		colls[c] = connect(t, uri).Database(db).Collection("readings")
	}
	runClients(t, clients, func(c int) error {
		for i := 0; i < perClient; {
			batch := seriesBatch(sensor, base, c*perClient+i, min(1+(i+c)%maxBatch, perClient-i))
			i += len(batch)
			if _, err := colls[c].InsertMany(ctx, eventDocs(batch)); err != nil {
				return err
			}
			mu.Lock()
			sent = append(sent, batch...)
			mu.Unlock()
		}
		return nil
	})
	return sent
}

// seriesBatch is n events of one series at consecutive seconds from
// base+first seconds, valued by their index in the client's run.
func seriesBatch(sensor string, base time.Time, first, n int) []sentEvent {
	out := make([]sentEvent, n)
	for j := range out {
		out[j] = sentEvent{id: bson.NewObjectID(), sensor: sensor, ts: base.Add(time.Duration(first+j) * time.Second), value: float64(first + j)}
	}
	return out
}

// eventDocs is the documents of events, for insertMany.
func eventDocs(events []sentEvent) []any {
	docs := make([]any, len(events))
	for k, e := range events {
		docs[k] = e.doc()
	}
	return docs
}
