package e2e

import (
	"slices"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// TestBucketedWritesRefused: the writes a bucketed namespace refuses get
// an error naming the rule and what is refused, change nothing, and
// nothing reaches the upstream collection of the app's name; updates,
// findAndModify and deletes with a hint run, the hint ignored.
func TestBucketedWritesRefused(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: readingsRule(db, 100)})
	coll := connect(t, p.URI()).Database(db).Collection("readings")
	sent := genEvents(40, 2, 1, 3)
	docs := make([]any, len(sent))
	for i, e := range sent {
		docs[i] = e.doc()
	}
	if _, err := coll.InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}
	one := bson.D{{Key: "_id", Value: sent[0].id}}
	set := bson.D{{Key: "$set", Value: bson.D{{Key: "value", Value: -1.0}}}}
	rule := "tsproxy rule " + db + ".readings"
	checks := []struct {
		name, want string
		run        func() error
	}{
		{"updateOne with a hint that is not a name or a key", `hint must be either a string or nested object`, func() error {
			return coll.Database().RunCommand(ctx, bson.D{{Key: "update", Value: "readings"},
				{Key: "updates", Value: bson.A{bson.D{{Key: "q", Value: one}, {Key: "u", Value: set}, {Key: "hint", Value: 1}}}}}).Err()
		}},
		{"renameCollection", "renameCollection", func() error {
			return connect(t, p.URI()).Database("admin").RunCommand(ctx, bson.D{{Key: "renameCollection", Value: db + ".readings"}, {Key: "to", Value: db + ".other"}}).Err()
		}},
		{"validate", "not supported on a bucketed namespace", func() error {
			return coll.Database().RunCommand(ctx, bson.D{{Key: "validate", Value: "readings"}}).Err()
		}},
	}
	for _, c := range checks {
		err := c.run()
		if err == nil || !strings.Contains(err.Error(), rule) || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%s: %v; want an error naming %q and %q", c.name, err, rule, c.want)
		}
	}
	if n, err := coll.CountDocuments(ctx, bson.D{{Key: "value", Value: -1.0}}); err != nil || n != 0 {
		t.Fatalf("refused updates changed %d events (%v)", n, err)
	}
	// A hint is accepted and ignored, as on a find: the proxy plans the
	// write itself.
	if r, err := coll.UpdateOne(ctx, one, set, options.UpdateOne().SetHint(bson.D{{Key: "ts", Value: 1}})); err != nil || r.ModifiedCount != 1 {
		t.Fatalf("updateOne with a hint: %+v, %v", r, err)
	}
	if err := coll.FindOneAndUpdate(ctx, one, bson.D{{Key: "$set", Value: bson.D{{Key: "value", Value: -2.0}}}}, options.FindOneAndUpdate().SetHint("sensor_1_ts_1")).Err(); err != nil {
		t.Fatalf("findOneAndUpdate with a hint: %v", err)
	}
	if r, err := coll.DeleteOne(ctx, one, options.DeleteOne().SetHint(bson.D{{Key: "ts", Value: 1}})); err != nil || r.DeletedCount != 1 {
		t.Fatalf("deleteOne with a hint: %+v, %v", r, err)
	}
	if n, err := coll.CountDocuments(ctx, bson.D{}); err != nil || n != int64(len(sent)-1) {
		t.Fatalf("%d events after the hinted delete (%v), want %d", n, err, len(sent)-1)
	}
	sent = sent[1:]
	if n, err := coll.CountDocuments(ctx, bson.D{}); err != nil || n != int64(len(sent)) {
		t.Fatalf("%d events after refused writes, %v; want %d", n, err, len(sent))
	}
	delAppCollectionUntouched(t, ctx, db)
}

// TestBucketedCreateAndIndexes: createCollection creates the bucket
// collection; indexes on the metaField and timeField are created on meta
// and start and listed back under the app's names; others are refused.
func TestBucketedCreateAndIndexes(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: readingsRule(db, 100)})
	pdb := connect(t, p.URI()).Database(db)
	ddb := direct(t).Database(db)
	if err := pdb.CreateCollection(ctx, "readings"); err != nil {
		t.Fatalf("createCollection: %v", err)
	}
	names, _ := ddb.ListCollectionNames(ctx, bson.D{})
	if !slices.Contains(names, "readings.buckets") || slices.Contains(names, "readings") {
		t.Fatalf("after create, upstream collections are %v", names)
	}
	names, _ = pdb.ListCollectionNames(ctx, bson.D{})
	if !slices.Equal(names, []string{"readings"}) {
		t.Fatalf("after create, the proxy lists %v", names)
	}
	// A second create fails as for a plain collection, naming the app's.
	err := pdb.CreateCollection(ctx, "readings")
	if err == nil || !strings.Contains(err.Error(), db+".readings") || strings.Contains(err.Error(), "buckets") {
		t.Fatalf("second create: %v", err)
	}
	err = pdb.CreateCollection(ctx, "readings", options.CreateCollection().SetTimeSeriesOptions(options.TimeSeries().SetTimeField("time")))
	if err == nil || !strings.Contains(err.Error(), "timeField") {
		t.Fatalf("create with another timeField: %v", err)
	}

	coll := pdb.Collection("readings")
	name, err := coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: "sensorId", Value: 1}, {Key: "ts", Value: -1}}})
	if err != nil || name != "sensorId_1_ts_-1" {
		t.Fatalf("createIndex on meta and time: %q, %v", name, err)
	}
	// A measurement the rule does not aggregate (value, which it does,
	// is tested in timeseries_index_test.go).
	_, err = coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: "temp", Value: 1}}})
	if err == nil || !strings.Contains(err.Error(), `index on "temp" is not supported`) {
		t.Fatalf("index on an event field: %v", err)
	}
	_, err = coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: "sensorId", Value: 1}}, Options: options.Index().SetUnique(true)})
	if err == nil || !strings.Contains(err.Error(), `"unique"`) {
		t.Fatalf("unique index: %v", err)
	}
	specs := func(c *mongo.Collection) map[string]string {
		cur, err := c.Indexes().List(ctx)
		if err != nil {
			t.Fatalf("listIndexes on %s: %v", c.Name(), err)
		}
		var all []bson.M
		if err := cur.All(ctx, &all); err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, s := range all {
			out[s["name"].(string)] = strings.ReplaceAll(bsonString(t, s["key"]), " ", "")
		}
		return out
	}
	up := specs(ddb.Collection("readings.buckets"))
	if up["sensorId_1_ts_-1"] != `{"meta":{"$numberInt":"1"},"start":{"$numberInt":"-1"}}` {
		t.Fatalf("upstream indexes: %v", up)
	}
	app := specs(coll)
	// As a native time-series collection lists them: MongoDB's
	// {metaField: 1, timeField: 1} index, no _id index.
	if app["sensorId_1_ts_-1"] != `{"sensorId":{"$numberInt":"1"},"ts":{"$numberInt":"-1"}}` || app["sensorId_1_ts_1"] != `{"sensorId":{"$numberInt":"1"},"ts":{"$numberInt":"1"}}` || len(app) != 2 {
		t.Fatalf("indexes listed through the proxy: %v", app)
	}
	for _, own := range []string{"meta_1_start_1", "sensorId_1_ts_1"} {
		if err := coll.Indexes().DropOne(ctx, own); err == nil || !strings.Contains(err.Error(), "proxy's own") {
			t.Fatalf("dropping the proxy's index as %s: %v", own, err)
		}
	}
	// Creating it again is a no-op, as on a native collection.
	if name, err := coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: "sensorId", Value: 1}, {Key: "ts", Value: 1}}}); err != nil {
		t.Fatalf("createIndex of the metaField and timeField index: %q, %v", name, err)
	}
	if n := len(specs(coll)); n != 2 {
		t.Fatalf("%d indexes after creating the existing one again, want 2", n)
	}
	if err := coll.Indexes().DropOne(ctx, "sensorId_1_ts_-1"); err != nil {
		t.Fatalf("dropIndex: %v", err)
	}
	if _, ok := specs(ddb.Collection("readings.buckets"))["sensorId_1_ts_-1"]; ok {
		t.Fatal("index still upstream after dropIndex")
	}
	delAppCollectionUntouched(t, ctx, db)
}

func bsonString(t *testing.T, v any) string {
	t.Helper()
	b, err := bson.MarshalExtJSON(bson.D{{Key: "k", Value: v}}, true, false)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	s = strings.TrimPrefix(s, `{"k":`)
	return strings.TrimSuffix(s, "}")
}

// TestBucketedCursorsEndWithSession: a rewritten read's open cursor is
// killed and forgotten when its session ends (the driver sends
// endSessions on Disconnect).
func TestBucketedCursorsEndWithSession(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: readingsRule(db, 100)})
	cl := connect(t, p.URI())
	coll := cl.Database(db).Collection("readings")
	sent := genEvents(60, 2, 1, 5)
	docs := make([]any, len(sent))
	for i, e := range sent {
		docs[i] = e.doc()
	}
	if _, err := coll.InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}
	before := p.srv.OpenCursors()
	reader := connect(t, p.URI())
	rc := reader.Database(db).Collection("readings")
	sess, err := reader.StartSession()
	if err != nil {
		t.Fatal(err)
	}
	sctx := mongo.NewSessionContext(ctx, sess)
	for range 3 {
		cur, err := rc.Find(sctx, bson.D{}, options.Find().SetBatchSize(5))
		if err != nil {
			t.Fatal(err)
		}
		if !cur.Next(sctx) {
			t.Fatal("no first event")
		}
	}
	// A cursor of another session stays.
	other, err := rc.Find(ctx, bson.D{}, options.Find().SetBatchSize(5))
	if err != nil {
		t.Fatal(err)
	}
	if n := p.srv.OpenCursors(); n != before+4 {
		t.Fatalf("%d cursors registered, want %d", n, before+4)
	}
	err = reader.Database("admin").RunCommand(ctx, bson.D{{Key: "endSessions", Value: bson.A{sess.ID()}}}).Err()
	// endSessions passes through: FerretDB v1.24 does not know it (drivers
	// ignore the error), MongoDB answers ok.
	if err != nil && !strings.Contains(err.Error(), "CommandNotFound") {
		t.Fatalf("endSessions: %v", err)
	}
	if n := p.srv.OpenCursors(); n != before+1 {
		t.Fatalf("%d cursors registered after the session ended, want %d", n, before+1)
	}
	// The other cursor still reads to its end (and is then forgotten).
	got := 0
	for other.Next(ctx) {
		got++
	}
	if other.Err() != nil || got != len(sent) {
		t.Fatalf("other session's cursor: %d events, %v", got, other.Err())
	}
	if n := p.srv.OpenCursors(); n != before {
		t.Fatalf("%d cursors registered at the end, want %d", n, before)
	}
}
