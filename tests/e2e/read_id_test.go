package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/tsproxy/tsproxy/proxy"
)

// TestReadByEventID: finds by an event's own _id (what drivers and ODMs
// send after an insert: findOne({_id}), and $in of ids) return what the
// same finds return on a plain collection, through the event-id index on
// FerretDB (explain names it), in every state: after a merge, with more
// events staged, after a delete, with ids of several types, with two
// events sharing an _id (both returned), and after another proxy wrote
// the rule directly (the index stops answering; the scan does).
func TestReadByEventID(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: readingsRule(db, 100)})
	client := connect(t, p.URI())
	coll := client.Database(db).Collection("readings")
	plain := direct(t).Database(db).Collection("plain")
	base := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	var sent []bson.D
	for i, s := range []string{"a", "b", "c", "d"} {
		for _, e := range seriesEvents(300, s, base.Add(time.Duration(i)*time.Minute)) {
			sent = append(sent, e.doc())
		}
	}
	// Ids of other types, equal across number types as MongoDB compares.
	sent = append(sent,
		bson.D{{Key: "_id", Value: "reading-1"}, {Key: "ts", Value: base}, {Key: "sensorId", Value: "a"}, {Key: "value", Value: 1.0}},
		bson.D{{Key: "_id", Value: int32(42)}, {Key: "ts", Value: base.Add(time.Hour)}, {Key: "sensorId", Value: "b"}, {Key: "value", Value: 2.0}},
		bson.D{{Key: "_id", Value: 7.5}, {Key: "ts", Value: base.Add(2 * time.Hour)}, {Key: "sensorId", Value: "c"}, {Key: "value", Value: 3.0}},
		bson.D{{Key: "_id", Value: bson.D{{Key: "k", Value: int32(1)}}}, {Key: "ts", Value: base}, {Key: "sensorId", Value: "d"}, {Key: "value", Value: 4.0}},
	)
	insertBoth := func(docs []bson.D) {
		for i := 0; i < len(docs); i += 7 { // small batches, as apps send
			batch := make([]any, 0, 7)
			for _, d := range docs[i:min(i+7, len(docs))] {
				batch = append(batch, d)
			}
			if _, err := coll.InsertMany(ctx, batch); err != nil {
				t.Fatal(err)
			}
			if _, err := plain.InsertMany(ctx, batch); err != nil {
				t.Fatal(err)
			}
		}
	}
	insertBoth(sent)
	flush(t, ctx, coll.Database().Client(), 1)
	if !env.external && !indexMarker(t, ctx, db) {
		t.Fatal("no event-id index marker after the first merge")
	}

	same := func(what string, filter any, opts ...options.Lister[options.FindOptions]) {
		t.Helper()
		got, want := findAll(t, ctx, coll, filter, opts...), findAll(t, ctx, plain, filter, opts...)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%s: proxy %v\nplain %v", what, got, want)
		}
	}
	idOf := func(i int) any { return sent[i][0].Value }
	for _, i := range []int{0, 17, 299, 300, 777, 1199, 1200, 1201, 1202, 1203} {
		var got, want bson.D
		errP := coll.FindOne(ctx, bson.D{{Key: "_id", Value: idOf(i)}}).Decode(&got)
		errD := plain.FindOne(ctx, bson.D{{Key: "_id", Value: idOf(i)}}).Decode(&want)
		if errP != nil || errD != nil || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("findOne %v: proxy %v (%v), plain %v (%v)", idOf(i), got, errP, want, errD)
		}
	}
	same("int64 42 finds int32 42", bson.D{{Key: "_id", Value: int64(42)}})
	same("double 42.0 finds int32 42", bson.D{{Key: "_id", Value: 42.0}})
	same("an id nobody has", bson.D{{Key: "_id", Value: bson.NewObjectID()}})
	in := bson.A{idOf(3), idOf(450), idOf(1100), idOf(1201), "nobody", idOf(1203)}
	same("$in sorted by time", bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: in}}}}, options.Find().SetSort(bson.D{{Key: "ts", Value: 1}, {Key: "_id", Value: 1}}))
	same("$in and a value", bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: in}}}, {Key: "value", Value: bson.D{{Key: "$lt", Value: 100}}}}, options.Find().SetSort(bson.D{{Key: "ts", Value: -1}}).SetProjection(bson.D{{Key: "value", Value: 1}}))

	if !env.external {
		var ex bson.Raw
		if err := coll.Database().RunCommand(ctx, bson.D{{Key: "explain", Value: bson.D{{Key: "find", Value: "readings"}, {Key: "filter", Value: bson.D{{Key: "_id", Value: idOf(5)}}}}}}).Decode(&ex); err != nil {
			t.Fatal(err)
		}
		if stage, _ := ex.Lookup("queryPlanner", "winningPlan", "stage").StringValueOK(); stage != "TSPROXY_EVENT_ID_INDEX" {
			t.Fatalf("explain of a find by _id: stage %v, want TSPROXY_EVENT_ID_INDEX", stage)
		}
	}

	// Staged, not merged yet: the read merges first, and the index
	// holds the new buckets.
	more := seriesEvents(30, "e", base.Add(3*time.Hour))
	var moreDocs []bson.D
	for _, e := range more {
		moreDocs = append(moreDocs, e.doc())
	}
	insertBoth(moreDocs)
	same("findOne of a staged event", bson.D{{Key: "_id", Value: more[29].id}})

	// Deleted events are gone.
	for _, c := range []*mongo.Collection{coll, plain} {
		if r, err := c.DeleteOne(ctx, bson.D{{Key: "_id", Value: idOf(17)}}); err != nil || r.DeletedCount != 1 {
			t.Fatalf("deleteOne: %v %v", r, err)
		}
	}
	same("after a delete", bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: bson.A{idOf(16), idOf(17), idOf(18)}}}}}, options.Find().SetSort(bson.D{{Key: "ts", Value: 1}}))
	gone := bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: bson.A{idOf(20), idOf(640), more[3].id, "reading-1", idOf(17)}}}}}
	for _, c := range []*mongo.Collection{coll, plain} {
		if r, err := c.DeleteMany(ctx, gone); err != nil || r.DeletedCount != 4 {
			t.Fatalf("deleteMany of 4 ids on %s: %v %v", c.Name(), r, err)
		}
	}
	same("after a deleteMany by _id", bson.D{{Key: "sensorId", Value: bson.D{{Key: "$in", Value: bson.A{"a", "c", "e"}}}}}, options.Find().SetSort(bson.D{{Key: "ts", Value: 1}, {Key: "_id", Value: 1}}))
	if n, err := coll.CountDocuments(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: bson.A{idOf(19), idOf(20), idOf(21)}}}}}); err != nil || n != 2 {
		t.Fatalf("countDocuments by _id after the delete: %d %v, want 2", n, err)
	}

	// Two events with one _id (a plain collection refuses the second):
	// both come back, as from a native time-series collection.
	dup := bson.D{{Key: "_id", Value: idOf(1000)}, {Key: "ts", Value: base.Add(5 * time.Hour)}, {Key: "sensorId", Value: "z"}, {Key: "value", Value: 9.0}}
	if _, err := coll.InsertOne(ctx, dup); err != nil {
		t.Fatal(err)
	}
	if got := findAll(t, ctx, coll, bson.D{{Key: "_id", Value: idOf(1000)}}); len(got) != 2 {
		t.Fatalf("two events with one _id: found %d, want 2: %v", len(got), got)
	}

	// Another proxy writes the rule directly: its buckets have no index
	// entries, so the index stops answering and the finds scan. (The
	// first proxy stops first: it holds the rule's writer lease.)
	_ = client.Disconnect(ctx)
	stopProxy(t, p)
	p2 := startProxy(t, proxyOptions{yaml: readingsRule(db, 100) + "    ingest: direct\n"})
	client2 := connect(t, p2.URI())
	coll2 := client2.Database(db).Collection("readings")
	late := seriesEvents(5, "f", base.Add(4*time.Hour))
	for _, e := range late {
		if _, err := coll2.InsertOne(ctx, e.doc()); err != nil {
			t.Fatal(err)
		}
	}
	_ = client2.Disconnect(ctx)
	stopProxy(t, p2)
	if !env.external && indexMarker(t, ctx, db) {
		t.Fatal("the event-id index marker is still there after a direct write")
	}
	p3 := startProxy(t, proxyOptions{yaml: readingsRule(db, 100)})
	coll = connect(t, p3.URI()).Database(db).Collection("readings")
	for _, e := range late {
		var got bson.M
		if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: e.id}}).Decode(&got); err != nil {
			t.Fatalf("findOne of an event written directly by another proxy: %v", err)
		}
	}
	same("an id of the first batch, index stopped", bson.D{{Key: "_id", Value: idOf(299)}})
}

// idIndexCollection is the name of db's event-id index collection on
// the upstream, or "".
func idIndexCollection(t *testing.T, ctx context.Context, db string) string {
	t.Helper()
	names, err := direct(t).Database(db).ListCollectionNames(ctx, bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if strings.HasPrefix(n, "tsproxy_stage_") && strings.HasSuffix(n, "_ids") {
			return n
		}
	}
	return ""
}

// indexMarker says whether db holds an event-id index with its marker.
func indexMarker(t *testing.T, ctx context.Context, db string) bool {
	t.Helper()
	name := idIndexCollection(t, ctx, db)
	if name == "" {
		return false
	}
	n, err := direct(t).Database(db).Collection(name).CountDocuments(ctx, bson.D{{Key: "_id", Value: "complete"}})
	if err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// findAll reads a whole find as documents.
func findAll(t *testing.T, ctx context.Context, c *mongo.Collection, filter any, opts ...options.Lister[options.FindOptions]) []bson.D {
	t.Helper()
	cur, err := c.Find(ctx, filter, opts...)
	if err != nil {
		t.Fatalf("find %v on %s: %v", filter, c.Name(), err)
	}
	var out []bson.D
	if err := cur.All(ctx, &out); err != nil {
		t.Fatalf("find %v on %s: %v", filter, c.Name(), err)
	}
	if len(opts) == 0 {
		// No sort: compare as sets.
		slices.SortFunc(out, func(a, b bson.D) int { return strings.Compare(fmt.Sprint(a), fmt.Sprint(b)) })
	}
	return out
}

// TestReadByEventIDAcrossProxies: a proxy that kept a rule's event-id
// index reads it again once another proxy's merge added entries (the
// marker's version changed), so it finds the other proxy's events by _id.
func TestReadByEventIDAcrossProxies(t *testing.T) {
	if env.external {
		t.Skip("the event-id index serves FerretDB upstreams")
	}
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	ca, cb := twoShortLeaseProxies(t, db)
	a, b := ca.Database(db).Collection("readings"), cb.Database(db).Collection("readings")
	base := time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC)
	first := seriesEvents(50, "a", base)
	if _, err := a.InsertMany(ctx, docsOf(first)); err != nil {
		t.Fatal(err)
	}
	flush(t, ctx, ca, 1)
	if err := a.FindOne(ctx, bson.D{{Key: "_id", Value: first[10].id}}).Err(); err != nil {
		t.Fatalf("findOne through the first proxy: %v", err)
	}
	// The second proxy writes once the first one's lease lapsed, and
	// merges: the index gets entries, and a new version.
	second := seriesEvents(50, "b", base.Add(time.Hour))
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := b.InsertMany(ctx, docsOf(second))
		if err == nil {
			break
		}
		if !leaseRefusal(err) || time.Now().After(deadline) {
			t.Fatalf("insert through the second proxy: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	flush(t, ctx, cb, 1)
	for _, e := range []sentEvent{second[0], second[49], first[10]} {
		var got sentEventDoc
		if err := a.FindOne(ctx, bson.D{{Key: "_id", Value: e.id}}).Decode(&got); err != nil || got.ID != e.id {
			t.Fatalf("findOne of %v through the first proxy after the second one's merge: %v (%v)", e.id, got.ID, err)
		}
	}
}

// sentEventDoc is an event read back.
type sentEventDoc struct {
	ID bson.ObjectID `bson:"_id"`
}

// twoShortLeaseProxies starts two proxies with db's readings rule and a
// 2 s writer lease, and returns a client of each.
func twoShortLeaseProxies(t *testing.T, db string) (*mongo.Client, *mongo.Client) {
	t.Helper()
	short := func(o *proxy.Options) { o.WriterLease = 2 * time.Second }
	pa := startProxy(t, proxyOptions{yaml: readingsRule(db, 100), edit: short})
	pb := startProxy(t, proxyOptions{yaml: readingsRule(db, 100), edit: short})
	return connect(t, pa.URI()), connect(t, pb.URI())
}

// TestReadByEventIDAfterTopUps: per-event inserts with a read after each
// round (each read merges first, topping up every series' last bucket),
// as a dashboard over live data does. On FerretDB each top-up leaves its
// bucket's old event-id index entry stale, and the holder deletes those
// many at a time, not at each merge (rewrite/stage's stale.go): finds
// by event _id return what a plain collection returns all along, after
// a delete and a reinsert of the same ids too, and a flush leaves one
// entry a bucket.
func TestReadByEventIDAfterTopUps(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: readingsRule(db, 100)})
	client := connect(t, p.URI())
	coll := client.Database(db).Collection("readings")
	plain := direct(t).Database(db).Collection("plain")
	base := time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)
	series := map[string][]sentEvent{}
	for _, s := range []string{"a", "b", "c"} {
		series[s] = seriesEvents(40, s, base)
	}
	var all []sentEvent
	insertRound := func(i int) {
		for _, s := range []string{"a", "b", "c"} {
			e := series[s][i]
			all = append(all, e)
			for _, c := range []*mongo.Collection{coll, plain} {
				if _, err := c.InsertOne(ctx, e.doc()); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	same := func(what string, filter any) {
		t.Helper()
		got, want := findAll(t, ctx, coll, filter), findAll(t, ctx, plain, filter)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%s: proxy %d documents, plain %d\nproxy %v\nplain %v", what, len(got), len(want), got, want)
		}
	}
	idsOf := func(evs []sentEvent) bson.A {
		out := bson.A{}
		for _, e := range evs {
			out = append(out, e.id)
		}
		return out
	}
	for i := range 40 {
		insertRound(i)
		// The dashboard's read: it merges the round's three events.
		n, err := coll.CountDocuments(ctx, bson.D{{Key: "sensorId", Value: "a"}})
		if err != nil || n != int64(i+1) {
			t.Fatalf("round %d: count of series a %d (%v), want %d", i, n, err, i+1)
		}
		if i%10 == 9 {
			// Through the index, with stale entries waiting.
			same(fmt.Sprintf("round %d: every id so far", i), bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: idsOf(all)}}}})
			same(fmt.Sprintf("round %d: the last id", i), bson.D{{Key: "_id", Value: all[len(all)-1].id}})
		}
	}
	// Read straight from the upstream: direct(t) flushes the test's
	// proxies first, which deletes what waits.
	raw := connect(t, env.upstreamURI).Database(db)
	entries := func() (buckets, entries int64) {
		t.Helper()
		names, err := raw.ListCollectionNames(ctx, bson.D{{Key: "name", Value: bson.D{{Key: "$regex", Value: "^tsproxy_stage_.*_ids$"}}}})
		if err != nil || len(names) != 1 {
			t.Fatalf("the event-id index: %v %v", names, err)
		}
		// Entries of buckets: those with a window start (not the marker nor a series entry).
		n, err := raw.Collection(names[0]).CountDocuments(ctx, bson.D{{Key: "s", Value: bson.D{{Key: "$exists", Value: true}}}})
		if err != nil {
			t.Fatal(err)
		}
		b, err := raw.Collection("readings.buckets").CountDocuments(ctx, bson.D{})
		if err != nil {
			t.Fatal(err)
		}
		return b, n
	}
	if !env.external {
		// 3 buckets, topped up 39 times each: the stale entries wait.
		if b, n := entries(); b != 3 || n <= b {
			t.Fatalf("%d buckets and %d event-id index entries before a flush, want 3 buckets and stale entries waiting", b, n)
		}
	}

	// Deleted, then the same events again: their ids are found once.
	gone := series["a"][10:20]
	for _, c := range []*mongo.Collection{coll, plain} {
		if r, err := c.DeleteMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: idsOf(gone)}}}}); err != nil || r.DeletedCount != 10 {
			t.Fatalf("deleteMany of 10 ids on %s: %v %v", c.Name(), r, err)
		}
	}
	same("after the delete", bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: idsOf(all)}}}})
	for _, e := range gone {
		for _, c := range []*mongo.Collection{coll, plain} {
			if _, err := c.InsertOne(ctx, e.doc()); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := coll.CountDocuments(ctx, bson.D{{Key: "sensorId", Value: "a"}}); err != nil {
			t.Fatal(err)
		}
	}
	same("after the reinsert", bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: idsOf(all)}}}})
	for _, e := range gone {
		same("findOne of a reinserted event", bson.D{{Key: "_id", Value: e.id}})
	}

	flush(t, ctx, client, 1)
	same("after a flush", bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: idsOf(all)}}}})
	if n, err := coll.CountDocuments(ctx, bson.D{}); err != nil || n != 120 {
		t.Fatalf("count %d (%v), want 120", n, err)
	}
	if !env.external {
		if b, n := entries(); n != b {
			t.Fatalf("%d event-id index entries for %d buckets after a flush, want one each", n, b)
		}
	}
}

// TestReadByEventIDTimes: finds and deletes by ObjectID _id go through
// the event-id index's id-time documents, on the upstream as it is: a
// minute whose document fills up (bulk ingest) is split by second, by the
// duplicate key the upstream answers the capped upsert with, and the ids
// of both halves are found as a plain collection finds them.
func TestReadByEventIDTimes(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: readingsRule(db, 1000)})
	coll := connect(t, p.URI()).Database(db).Collection("readings")
	plain := direct(t).Database(db).Collection("plain")
	minute := time.Date(2026, 4, 1, 10, 7, 0, 0, time.UTC)
	base := time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC)
	n := 0
	idOf := func(sec, i int) bson.ObjectID {
		id := bson.NewObjectIDFromTimestamp(minute.Add(time.Duration(sec) * time.Second))
		id[8], id[9], id[10], id[11] = byte(i>>24), byte(i>>16), byte(i>>8), byte(i)
		return id
	}
	var ids []bson.ObjectID
	insert := func(count, sec int) {
		t.Helper()
		var docs []any
		for range count {
			id := idOf(sec+n%7, n)
			ids = append(ids, id)
			docs = append(docs, bson.D{{Key: "_id", Value: id}, {Key: "ts", Value: base.Add(time.Duration(n) * time.Second)}, {Key: "sensorId", Value: fmt.Sprintf("s%d", n%3)}, {Key: "value", Value: float64(n)}})
			n++
		}
		for i := 0; i < len(docs); i += 1000 {
			batch := docs[i:min(i+1000, len(docs))]
			if _, err := coll.InsertMany(ctx, batch); err != nil {
				t.Fatal(err)
			}
			if _, err := plain.InsertMany(ctx, batch); err != nil {
				t.Fatal(err)
			}
		}
		flush(t, ctx, coll.Database().Client(), 1)
	}
	insert(20_500, 0) // more than a minute's document takes: split, by second
	insert(300, 20)   // into the split minute
	insert(50, 70)    // another minute
	idx := direct(t).Database(db).Collection(idIndexCollection(t, ctx, db))
	var doc bson.M
	if err := idx.FindOne(ctx, bson.D{{Key: "_id", Value: fmt.Sprintf("m:%d", minute.Unix()/60)}}).Decode(&doc); err != nil {
		t.Fatalf("the minute's id-time document: %v", err)
	}
	if doc["x"] != true {
		t.Fatalf("the full minute's document is not split: n=%v", doc["n"])
	}
	seconds, err := idx.CountDocuments(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$regex", Value: "^s:"}}}})
	if err != nil || seconds == 0 {
		t.Fatalf("no id-time documents by second after the split (%v)", err)
	}
	same := func(what string, filter bson.D) {
		t.Helper()
		got, want := findAll(t, ctx, coll, filter), findAll(t, ctx, plain, filter)
		if fmt.Sprint(got) != fmt.Sprint(want) || len(want) == 0 && what != "an id no event has" {
			t.Fatalf("%s: proxy %v\nplain %v", what, got, want)
		}
	}
	for i := 0; i < len(ids); i += 1013 {
		same(fmt.Sprintf("the id of event %d", i), bson.D{{Key: "_id", Value: ids[i]}})
	}
	same("an id after the split", bson.D{{Key: "_id", Value: ids[20_600]}})
	same("an id of the next minute", bson.D{{Key: "_id", Value: ids[len(ids)-1]}})
	same("ids of both halves and the next minute", bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: bson.A{ids[5], ids[20_700], ids[len(ids)-2]}}}}})
	same("an id no event has", bson.D{{Key: "_id", Value: idOf(30, 1<<30)}})
	for _, c := range []*mongo.Collection{coll, plain} {
		if r, err := c.DeleteOne(ctx, bson.D{{Key: "_id", Value: ids[20_650]}}); err != nil || r.DeletedCount != 1 {
			t.Fatalf("delete by an id after the split: %+v, %v", r, err)
		}
	}
	same("ids around the deleted one", bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: bson.A{ids[20_649], ids[20_650], ids[20_651]}}}}})
	if got, err := coll.CountDocuments(ctx, bson.D{}); err != nil || got != int64(len(ids)-1) {
		t.Fatalf("count %d (%v), want %d", got, err, len(ids)-1)
	}
}
