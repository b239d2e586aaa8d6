package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/tsproxy/tsproxy/rewrite/admin"
	"github.com/tsproxy/tsproxy/rules"
)

// MongoDB's time-series API through the proxy on a namespace no config
// rule names (issue: apps written for native time-series collections).

// tsCollections lists db's collections through c as {name: document}.
func tsCollections(t *testing.T, ctx context.Context, c *mongo.Client, db string) map[string]bson.M {
	t.Helper()
	cur, err := c.Database(db).ListCollections(ctx, bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	var docs []bson.M
	if err := cur.All(ctx, &docs); err != nil {
		t.Fatal(err)
	}
	out := map[string]bson.M{}
	for _, d := range docs {
		out[d["name"].(string)] = d
	}
	return out
}

// serverCode is the code of a command error or a write error.
func serverCode(err error) int {
	var ce mongo.CommandError
	if errors.As(err, &ce) {
		return int(ce.Code)
	}
	var we mongo.WriteException
	if errors.As(err, &we) && len(we.WriteErrors) > 0 {
		return we.WriteErrors[0].Code
	}
	var bwe mongo.BulkWriteException
	if errors.As(err, &bwe) && len(bwe.WriteErrors) > 0 {
		return bwe.WriteErrors[0].Code
	}
	return 0
}

// TestTimeseriesCreate: a create with the timeseries option through one
// proxy makes a time-series collection that every proxy on the upstream
// buckets (one started after the create too), listed as MongoDB lists
// one, with MongoDB's errors for wrong options, a repeated create, a
// plain collection of the name, collMod, renameCollection and a
// measurement without a date; drop removes it and everything that held
// its events, and the name is then an ordinary collection again.
func TestTimeseriesCreate(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	p1, p2 := startProxy(t, proxyOptions{}), startProxy(t, proxyOptions{})
	c1, c2 := connect(t, p1.URI()), connect(t, p2.URI())
	dropAtEnd(t, c1, db)

	tsOpts := options.TimeSeries().SetTimeField("ts").SetMetaField("meta").SetGranularity("minutes")
	if err := c1.Database(db).CreateCollection(ctx, "weather", options.CreateCollection().SetTimeSeriesOptions(tsOpts).SetExpireAfterSeconds(86400*365*10)); err != nil {
		t.Fatalf("create: %v", err)
	}
	// Inserted through the other proxy, at once, one event per insert.
	base := time.Now().UTC().Truncate(time.Hour).Add(-48 * time.Hour)
	coll2 := c2.Database(db).Collection("weather")
	const n = 300
	for i := 0; i < n; i++ {
		doc := bson.D{{Key: "ts", Value: base.Add(time.Duration(i) * time.Minute)}, {Key: "meta", Value: bson.D{{Key: "station", Value: i % 3}}}, {Key: "temp", Value: float64(i) / 4}}
		if _, err := coll2.InsertOne(ctx, doc); err != nil {
			t.Fatalf("insert %d: %v", i, err)
		}
	}
	coll1 := c1.Database(db).Collection("weather")
	if got, err := coll1.CountDocuments(ctx, bson.D{}); err != nil || got != n {
		t.Fatalf("count through the creating proxy: %d, %v; want %d", got, err, n)
	}
	if got, err := coll1.CountDocuments(ctx, bson.D{{Key: "meta.station", Value: 1}, {Key: "ts", Value: bson.D{{Key: "$gte", Value: base.Add(time.Hour)}}}}); err != nil || got != 80 {
		t.Fatalf("count of one station's later events: %d, %v; want 80", got, err)
	}
	if !env.external {
		flush(t, ctx, c2, 1)
		up := direct(t).Database(db)
		if plain, _ := up.Collection("weather").CountDocuments(ctx, bson.D{}); plain != 0 {
			t.Fatalf("%d events stored unbucketed", plain)
		}
		if buckets, _ := up.Collection("weather.buckets").CountDocuments(ctx, bson.D{}); buckets == 0 || buckets > 12 {
			t.Fatalf("%d buckets for %d events of 3 series over 5 hours (1-day windows)", buckets, n)
		}
	}

	// Listed as MongoDB lists a time-series collection, by every proxy,
	// and by one started after the create (the catalog is upstream).
	p3 := startProxy(t, proxyOptions{})
	c3 := connect(t, p3.URI())
	for i, c := range []*mongo.Client{c1, c2, c3} {
		colls := tsCollections(t, ctx, c, db)
		w := colls["weather"]
		if len(colls) != 1 || w == nil || w["type"] != "timeseries" {
			t.Fatalf("proxy %d lists %v", i+1, colls)
		}
		opts := fmt.Sprint(w["options"])
		// MongoDB's BSON types: expireAfterSeconds a long, the span an int.
		if want := `{"expireAfterSeconds":{"$numberLong":"315360000"},"timeseries":{"timeField":"ts","metaField":"meta","granularity":"minutes","bucketMaxSpanSeconds":{"$numberInt":"86400"}}}`; opts != want {
			t.Fatalf("proxy %d options %s, want %s", i+1, opts, want)
		}
	}
	if got, err := c3.Database(db).Collection("weather").CountDocuments(ctx, bson.D{}); err != nil || got != n {
		t.Fatalf("count through a proxy started later: %d, %v", got, err)
	}
	names, err := c3.Database(db).ListCollectionNames(ctx, bson.D{})
	if err != nil || fmt.Sprint(names) != "[weather]" {
		t.Fatalf("collection names %v, %v", names, err)
	}

	// MongoDB's answers to a create repeated, different, or on a plain
	// collection's name.
	if err := c2.Database(db).CreateCollection(ctx, "weather", options.CreateCollection().SetTimeSeriesOptions(tsOpts).SetExpireAfterSeconds(86400*365*10)); err != nil {
		t.Fatalf("the same create again: %v", err)
	}
	err = c2.Database(db).CreateCollection(ctx, "weather", options.CreateCollection().SetTimeSeriesOptions(options.TimeSeries().SetTimeField("ts")))
	if serverCode(err) != 48 || !strings.Contains(err.Error(), "A timeseries collection already exists. NS: "+db+".weather") {
		t.Fatalf("a different create: %v", err)
	}
	if _, err := c2.Database(db).Collection("plain").InsertOne(ctx, bson.D{{Key: "a", Value: 1}}); err != nil {
		t.Fatal(err)
	}
	err = c1.Database(db).CreateCollection(ctx, "plain", options.CreateCollection().SetTimeSeriesOptions(tsOpts))
	if serverCode(err) != 48 || !strings.Contains(err.Error(), "Collection "+db+".plain already exists.") {
		t.Fatalf("a create over a plain collection: %v", err)
	}

	// A measurement without a date: MongoDB's write error. (Through the
	// proxy that wrote: on FerretDB one proxy at a time writes a
	// namespace, see docs/how-it-works.md, the writer lease.)
	_, err = coll2.InsertOne(ctx, bson.D{{Key: "meta", Value: 1}, {Key: "ts", Value: "yesterday"}})
	if serverCode(err) != 2 || !strings.Contains(err.Error(), "'ts' must be present and contain a valid BSON UTC datetime value") {
		t.Fatalf("insert without a date: %v", err)
	}

	// collMod: coarser granularity and expireAfterSeconds "off"; finer
	// is refused; rename is refused.
	run := func(c *mongo.Client, cmd bson.D) error { return c.Database(db).RunCommand(ctx, cmd).Err() }
	if err := run(c1, bson.D{{Key: "collMod", Value: "weather"}, {Key: "timeseries", Value: bson.D{{Key: "granularity", Value: "hours"}}}, {Key: "expireAfterSeconds", Value: "off"}}); err != nil {
		t.Fatalf("collMod: %v", err)
	}
	if opts := fmt.Sprint(tsCollections(t, ctx, c2, db)["weather"]["options"]); opts != `{"timeseries":{"timeField":"ts","metaField":"meta","granularity":"hours","bucketMaxSpanSeconds":{"$numberInt":"2592000"}}}` {
		t.Fatalf("after collMod, another proxy lists %s", opts)
	}
	err = run(c2, bson.D{{Key: "collMod", Value: "weather"}, {Key: "timeseries", Value: bson.D{{Key: "granularity", Value: "seconds"}}}})
	if serverCode(err) != 72 || !strings.Contains(err.Error(), "Invalid transition for timeseries.granularity") {
		t.Fatalf("collMod to a finer granularity: %v", err)
	}
	err = c1.Database("admin").RunCommand(ctx, bson.D{{Key: "renameCollection", Value: db + ".weather"}, {Key: "to", Value: db + ".w2"}}).Err()
	if serverCode(err) != 166 {
		t.Fatalf("renameCollection: %v", err)
	}
	if got, err := coll2.CountDocuments(ctx, bson.D{}); err != nil || got != n {
		t.Fatalf("count after collMod: %d, %v", got, err)
	}

	// drop: the collection and what held its events go; the name is an
	// ordinary collection's again, on every proxy.
	if err := coll1.Drop(ctx); err != nil {
		t.Fatalf("drop: %v", err)
	}
	if colls := tsCollections(t, ctx, c2, db); colls["weather"] != nil {
		t.Fatalf("after drop, another proxy lists %v", colls)
	}
	if _, err := coll2.InsertOne(ctx, bson.D{{Key: "x", Value: 1}}); err != nil {
		t.Fatalf("an event without ts after the drop (a plain document now): %v", err)
	}
	if !env.external {
		up := direct(t).Database(db)
		names, _ := up.ListCollectionNames(ctx, bson.D{})
		for _, name := range names {
			if name != "plain" && name != "weather" && name != "tsproxy_leases" {
				t.Fatalf("left after drop: %s (all: %v)", name, names)
			}
		}
		if got, _ := up.Collection("weather").CountDocuments(ctx, bson.D{}); got != 1 {
			t.Fatalf("after drop the name holds %d plain documents, want 1", got)
		}
		if left, _ := direct(t).Database("tsproxy").Collection("catalog").CountDocuments(ctx, bson.D{{Key: "_id", Value: db + ".weather"}}); left != 0 {
			t.Fatal("the catalog entry was left")
		}
	}
}

// TestTimeseriesCreateErrors: options MongoDB refuses get MongoDB's code.
func TestTimeseriesCreateErrors(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{})
	c := connect(t, p.URI())
	dropAtEnd(t, c, db)
	for _, tc := range []struct {
		ts   bson.D
		more bson.D
		code int
		msg  string
	}{
		{ts: bson.D{{Key: "metaField", Value: "m"}}, code: 40414, msg: "'create.timeseries.timeField' is missing"},
		{ts: bson.D{{Key: "timeField", Value: 1}}, code: 14, msg: "expected type 'string'"},
		{ts: bson.D{{Key: "timeField", Value: "t"}, {Key: "metaField", Value: "t"}}, code: 72, msg: "'metaField' cannot be the same as 'timeField'"},
		{ts: bson.D{{Key: "timeField", Value: "t"}, {Key: "metaField", Value: "_id"}}, code: 72, msg: `'metaField' cannot be "_id"`},
		{ts: bson.D{{Key: "timeField", Value: "a.b"}}, code: 72, msg: "'timeField' must be a top-level field"},
		{ts: bson.D{{Key: "timeField", Value: "t"}, {Key: "granularity", Value: "days"}}, code: 2, msg: "Enumeration value 'days'"},
		{ts: bson.D{{Key: "timeField", Value: "t"}, {Key: "granularity", Value: "hours"}, {Key: "bucketMaxSpanSeconds", Value: 60}}, code: 72, msg: "not configurable to a value other than the default of 2592000"},
		{ts: bson.D{{Key: "timeField", Value: "t"}, {Key: "bucketMaxSpanSeconds", Value: 60}, {Key: "bucketRoundingSeconds", Value: 30}}, code: 72, msg: "needs to be equal to 'bucketMaxSpanSeconds'"},
		{ts: bson.D{{Key: "timeField", Value: "t"}, {Key: "bucketMaxSpanSeconds", Value: 60}}, code: 72, msg: "needs to be equal to 'bucketMaxSpanSeconds'"},
		{ts: bson.D{{Key: "timeField", Value: "t"}, {Key: "colour", Value: "red"}}, code: 40415, msg: "'create.timeseries.colour' is an unknown field"},
		{ts: bson.D{{Key: "timeField", Value: "t"}}, more: bson.D{{Key: "expireAfterSeconds", Value: -1}}, code: 72, msg: "cannot be less than 0"},
		{ts: bson.D{{Key: "timeField", Value: "t"}}, more: bson.D{{Key: "capped", Value: true}}, code: 72, msg: "'timeseries' is not allowed with 'capped'"},
	} {
		cmd := append(bson.D{{Key: "create", Value: "bad"}, {Key: "timeseries", Value: tc.ts}}, tc.more...)
		err := c.Database(db).RunCommand(ctx, cmd).Err()
		if serverCode(err) != tc.code || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("create %v: %v; want code %d with %q", cmd, err, tc.code, tc.msg)
		}
	}
	if names, _ := c.Database(db).ListCollectionNames(ctx, bson.D{}); len(names) != 0 {
		t.Fatalf("refused creates left %v", names)
	}
	// Custom bucketing is listed as MongoDB lists it.
	cmd := bson.D{{Key: "create", Value: "custom"}, {Key: "timeseries", Value: bson.D{{Key: "timeField", Value: "t"}, {Key: "bucketMaxSpanSeconds", Value: 600}, {Key: "bucketRoundingSeconds", Value: 600}}}}
	if err := c.Database(db).RunCommand(ctx, cmd).Err(); err != nil {
		t.Fatal(err)
	}
	if opts := fmt.Sprint(tsCollections(t, ctx, c, db)["custom"]["options"]); opts != `{"timeseries":{"timeField":"t","bucketRoundingSeconds":{"$numberInt":"600"},"bucketMaxSpanSeconds":{"$numberInt":"600"}}}` {
		t.Fatalf("custom bucketing listed as %s", opts)
	}
	if _, err := c.Database(db).Collection("custom").InsertOne(ctx, bson.D{{Key: "t", Value: time.Now()}}); err != nil {
		t.Fatal(err)
	}

	// dropDatabase takes its time-series collections with it: the name is
	// free for a collection of other options.
	if err := c.Database(db).Drop(ctx); err != nil {
		t.Fatalf("dropDatabase: %v", err)
	}
	if !env.external {
		if left, _ := direct(t).Database("tsproxy").Collection("catalog").CountDocuments(ctx, bson.D{{Key: "db", Value: db}}); left != 0 {
			t.Fatalf("%d catalog entries of the dropped database were left", left)
		}
	}
	if err := c.Database(db).CreateCollection(ctx, "custom", options.CreateCollection().SetTimeSeriesOptions(options.TimeSeries().SetTimeField("time"))); err != nil {
		t.Fatalf("create after dropDatabase: %v", err)
	}
	if got, err := c.Database(db).Collection("custom").CountDocuments(ctx, bson.D{}); err != nil || got != 0 {
		t.Fatalf("the new collection holds %d events (%v)", got, err)
	}
}

// dropAtEnd drops db through c when the test ends: the catalog is the
// upstream's, so every proxy of every later test would otherwise run the
// background loops of the test's time-series collections.
func dropAtEnd(t *testing.T, c *mongo.Client, db string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.Database(db).Drop(ctx); err != nil {
			t.Errorf("dropDatabase %s: %v", db, err)
		}
	})
}

// TestTimeseriesCreateRace: clients insert through another proxy while
// the create runs. Either the create wins and every acknowledged event is
// bucketed, or a plain insert won and the create is NamespaceExists; in
// both cases every acknowledged event is stored exactly once.
func TestTimeseriesCreateRace(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	p1, p2 := startProxy(t, proxyOptions{}), startProxy(t, proxyOptions{})
	c1, c2 := connect(t, p1.URI()), connect(t, p2.URI())
	dropAtEnd(t, c1, db)
	coll := c2.Database(db).Collection("race")
	var acked atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	createDone := make(chan error, 1)
	go func() {
		createDone <- c1.Database(db).CreateCollection(ctx, "race", options.CreateCollection().SetTimeSeriesOptions(options.TimeSeries().SetTimeField("ts").SetMetaField("m")))
	}()
	time.Sleep(300 * time.Millisecond) // the create is waiting out the catalog lease
	base := time.Now().UTC()
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				_, err := coll.InsertOne(ctx, bson.D{{Key: "ts", Value: base.Add(time.Duration(i) * time.Second)}, {Key: "m", Value: w}, {Key: "i", Value: i}})
				if err != nil {
					t.Errorf("insert: %v", err)
					return
				}
				acked.Add(1)
			}
		}()
	}
	createErr := <-createDone
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	got, err := c1.Database(db).Collection("race").CountDocuments(ctx, bson.D{})
	if err != nil || got != acked.Load() {
		t.Fatalf("%d events read, %d acknowledged (%v); create: %v", got, acked.Load(), err, createErr)
	}
	if createErr != nil {
		if serverCode(createErr) != 48 {
			t.Fatalf("create: %v", createErr)
		}
		t.Logf("a plain insert won the race: %d events, plain", got)
		return
	}
	if env.external {
		return
	}
	flush(t, ctx, c2, 1)
	if plain, _ := direct(t).Database(db).Collection("race").CountDocuments(ctx, bson.D{}); plain != 0 {
		t.Fatalf("%d of %d events stored unbucketed after the create won", plain, got)
	}
	t.Logf("the create won: %d events, all bucketed", got)
}

// TestTimeseriesMongosh: the mongosh an app developer uses: create with
// the timeseries option, show collections marks it [time-series],
// getCollectionInfos shows its options, inserts and finds as on MongoDB.
func TestTimeseriesMongosh(t *testing.T) {
	t.Parallel()
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{})
	dropAtEnd(t, connect(t, p.URI()), db)
	script := fmt.Sprintf(`
const d = connect(process.env.TSPROXY_URI + %q);
d.createCollection("weather", {timeseries: {timeField: "ts", metaField: "sensor", granularity: "hours"}, expireAfterSeconds: 315360000});
d.notes.insertOne({text: "plain"});
const docs = [];
for (let i = 0; i < 500; i++) docs.push({ts: new Date(Date.UTC(2026, 0, 1) + i * 60000), sensor: "s" + (i %% 5), temp: i});
d.weather.insertMany(docs);
print("COUNT " + d.weather.countDocuments({sensor: "s1"}));
print("FIRST " + JSON.stringify(d.weather.find({}, {_id: 0}).sort({ts: 1}).limit(1).toArray()));
const info = d.getCollectionInfos({name: "weather"})[0];
print("INFO " + info.type + " " + EJSON.stringify(info.options, {relaxed: false}));
try { d.weather.insertOne({sensor: "x"}); } catch (e) { print("ERR " + e.code + " " + e.message); }
`, db)
	out := runMongosh(t, p.URI(), script+"\n")
	for _, want := range []string{
		"COUNT 100",
		`FIRST [{"ts":"2026-01-01T00:00:00.000Z","sensor":"s0","temp":0}]`,
		`INFO timeseries {"expireAfterSeconds":{"$numberLong":"315360000"},"timeseries":{"timeField":"ts","metaField":"sensor","granularity":"hours","bucketMaxSpanSeconds":{"$numberInt":"2592000"}}}`,
		"ERR 2 'ts' must be present and contain a valid BSON UTC datetime value",
	} {
		if !strings.Contains(out, want) {
			t.Fatalf("mongosh output lacks %q:\n%s", want, out)
		}
	}
	show := runMongosh(t, p.URI(), fmt.Sprintf("const d = connect(process.env.TSPROXY_URI + %q);\nprint(d.getCollectionNames().join(','));\nd.getMongo().getDB(%q).runCommand({listCollections: 1, nameOnly: true}).cursor.firstBatch.forEach(c => print('LIST ' + c.name + ' ' + c.type));\n", db, db))
	// Both names, in whatever order the server lists them (MongoDB
	// promises none; FerretDB 2.x lists the created one first).
	if !strings.Contains(show, "LIST weather timeseries") || !strings.Contains(show, "notes,weather") && !strings.Contains(show, "weather,notes") {
		t.Fatalf("mongosh listing:\n%s", show)
	}
}

// TestTimeseriesConfigRule: a config rule shows as a time-series
// collection too, a create that agrees with it is ok, and one that
// contradicts it names the rule.
func TestTimeseriesConfigRule(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: readingsRule(db, 100)})
	c := connect(t, p.URI())
	ok := options.CreateCollection().SetTimeSeriesOptions(options.TimeSeries().SetTimeField("ts").SetMetaField("sensorId"))
	if err := c.Database(db).CreateCollection(ctx, "readings", ok); err != nil {
		t.Fatalf("a create that agrees with the config rule: %v", err)
	}
	bad := options.CreateCollection().SetTimeSeriesOptions(options.TimeSeries().SetTimeField("time"))
	err := c.Database(db).CreateCollection(ctx, "readings", bad)
	if err == nil || !strings.Contains(err.Error(), "tsproxy rule "+db+".readings") {
		t.Fatalf("a create that contradicts the config rule: %v", err)
	}
	w := tsCollections(t, ctx, c, db)["readings"]
	if w == nil || w["type"] != "timeseries" || fmt.Sprint(w["options"]) != `{"timeseries":{"timeField":"ts","metaField":"sensorId","granularity":"seconds","bucketMaxSpanSeconds":{"$numberInt":"3600"}}}` {
		t.Fatalf("config rule listed as %v", w)
	}
	err = c.Database(db).RunCommand(ctx, bson.D{{Key: "collMod", Value: "readings"}, {Key: "expireAfterSeconds", Value: 60}}).Err()
	if err == nil || !strings.Contains(err.Error(), "config.yaml") {
		t.Fatalf("collMod of a config rule: %v", err)
	}
}

// TestTimeseriesMongoose: a Mongoose app whose schema has the timeseries
// option and autoCreate (tests/e2e/apps/mongoose_weather.js) runs
// unchanged through the proxy: its model creates the collection, writes,
// reads, aggregates and deletes as on MongoDB, and its events are stored
// in buckets only.
func TestTimeseriesMongoose(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{})
	dropAtEnd(t, connect(t, p.URI()), db)
	mongosh(t) // installs the npm packages (mongoose among them)
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(runCtx, "node", filepath.Join(wd, "apps", "mongoose_weather.js"))
	cmd.Dir = wd
	cmd.Env = append(os.Environ(), "TSPROXY_URI="+p.URI()+db)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the Mongoose app: %v\n%s", err, out)
	}
	want := `{"count":601,"sensor5":101,"latest":{"temp":99,"timestamp":"2026-01-01T10:00:00.000Z","sensorId":5},` +
		`"firstHour":60,"firstTemps":[10,10.5,11],"sensors":[0,1,2,3,4,5],` +
		`"lastThree":[23.5,20.5,17.5],"inRange":60,"deleted":100,"after":501,"fixed":98,"warmer":100,` +
		`"type":"timeseries","timeseries":{"timeField":"timestamp","metaField":"metadata","granularity":"hours","bucketMaxSpanSeconds":2592000},` +
		`"expireAfterSeconds":315360000,"noDate":"2 'timestamp' must be present and contain a valid BSON UTC datetime value"}`
	if got := strings.TrimSpace(string(out)); got != want {
		t.Fatalf("the Mongoose app printed\n%s\nwant\n%s", got, want)
	}
	if env.external {
		return
	}
	c := connect(t, p.URI())
	flush(t, ctx, c, 1)
	up := direct(t).Database(db)
	if plain, _ := up.Collection("readings").CountDocuments(ctx, bson.D{}); plain != 0 {
		t.Fatalf("%d events stored unbucketed", plain)
	}
	// 6 series, 1 month windows (granularity hours): one bucket each but
	// the deleted series'.
	if buckets, _ := up.Collection("readings.buckets").CountDocuments(ctx, bson.D{}); buckets != 5 {
		t.Fatalf("%d buckets, want 5", buckets)
	}
}

// TestTimeseriesProbeLeavesNothing: the proxy finds whether the upstream
// makes time-series collections by making one (never from the version
// buildInfo claims: FerretDB 2.x claims MongoDB 7.0 and makes a plain
// collection), then drops it; the collections it served a create with
// are listed as time-series ones. Its probes drop their scratch
// collections, and it sweeps those that proxies stopped mid-probe left
// (kill -9 leaves them whatever a proxy does at exit): a planted one of
// an hour ago is gone. Probe collections younger than the test may be
// another test's proxy's, killed or mid-probe; only this proxy's probes,
// begun after the test began, are counted.
func TestTimeseriesProbeLeavesNothing(t *testing.T) {
	ctx := ctxFor(t)
	db := uniqueDB(t)
	began := time.Now().Add(-time.Second) // names carry whole seconds
	left := admin.ProbeName(time.Now().Add(-time.Hour), "e2e"+strings.ReplaceAll(db, "_", ""))
	if err := direct(t).Database(rules.CatalogDB).CreateCollection(ctx, left); err != nil {
		t.Fatalf("planting a probe collection left behind: %v", err)
	}
	p := startProxy(t, proxyOptions{})
	c := connect(t, p.URI())
	dropAtEnd(t, c, db)
	if err := c.Database(db).CreateCollection(ctx, "probe", options.CreateCollection().SetTimeSeriesOptions(options.TimeSeries().SetTimeField("t"))); err != nil {
		t.Fatalf("create: %v", err)
	}
	if w := tsCollections(t, ctx, c, db)["probe"]; w == nil || w["type"] != "timeseries" {
		t.Fatalf("listed %v, want a time-series collection", w)
	}
	// An insert on the collection needs the upstream's abilities: the
	// proxy probes them (and sweeps) before it answers.
	if _, err := c.Database(db).Collection("probe").InsertOne(ctx, bson.D{{Key: "t", Value: time.Now()}}); err != nil {
		t.Fatalf("insert: %v", err)
	}
	names, err := direct(t).Database(rules.CatalogDB).ListCollectionNames(ctx, bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if n == left {
			t.Errorf("the probe collection left an hour ago, %s.%s, was not swept", rules.CatalogDB, n)
		}
		if strings.HasPrefix(n, admin.ProbePrefix) && !admin.StaleProbe(n, began.Add(admin.StaleProbeAge)) {
			t.Errorf("the probe left %s.%s", rules.CatalogDB, n)
		}
	}
}
