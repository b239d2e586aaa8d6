package e2e

import (
	"context"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// MongoDB options of time-series collections the proxy refused or
// ignored (issue 55, cases 5 and 7), answered as MongoDB 8.0 answers
// them.

// tsOptionsDB is a database of its own through a proxy of its own, and
// the client connected to it.
func tsOptionsDB(t *testing.T) (*mongo.Database, *mongo.Client) {
	t.Helper()
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{})
	c := connect(t, p.URI())
	dropAtEnd(t, c, db)
	return c.Database(db), c
}

// createTS creates the time-series collection name (timeField t,
// metaField m) with more options (expireAfterSeconds...).
func createTS(t *testing.T, ctx context.Context, d *mongo.Database, name string, more ...bson.E) {
	t.Helper()
	cmd := append(bson.D{{Key: "create", Value: name}, {Key: "timeseries", Value: bson.D{{Key: "timeField", Value: "t"}, {Key: "metaField", Value: "m"}}}}, more...)
	if err := d.RunCommand(ctx, cmd).Err(); err != nil {
		t.Fatalf("create %v: %v", cmd, err)
	}
}

// tsOptions is listCollections' options document of name, as extended
// JSON.
func tsOptions(t *testing.T, ctx context.Context, d *mongo.Database, name string) string {
	t.Helper()
	specs, err := d.ListCollectionSpecifications(ctx, bson.D{{Key: "name", Value: name}})
	if err != nil || len(specs) != 1 {
		t.Fatalf("list %s: %v, %v", name, specs, err)
	}
	return specs[0].Options.String()
}

// runCode runs cmd on d and returns the server's code (0: ok).
func runCode(ctx context.Context, d *mongo.Database, cmd bson.D) int {
	err := d.RunCommand(ctx, cmd).Err()
	if err != nil && serverCode(err) == 0 {
		return -1
	}
	return serverCode(err)
}

// deleteReply runs a delete command on d and returns n and the code of
// its first write error (0: none).
func deleteReply(t *testing.T, ctx context.Context, d *mongo.Database, cmd bson.D) (n int64, code int) {
	t.Helper()
	var reply struct {
		N           int64 `bson:"n"`
		WriteErrors []struct {
			Code   int    `bson:"code"`
			Errmsg string `bson:"errmsg"`
		} `bson:"writeErrors"`
	}
	if err := d.RunCommand(ctx, cmd).Decode(&reply); err != nil {
		// The driver turns a reply with write errors into an error.
		if code := serverCode(err); code != 0 {
			t.Logf("%v: %v", cmd, err)
			return 0, code
		}
		t.Fatalf("%v: %v", cmd, err)
	}
	if len(reply.WriteErrors) > 0 {
		t.Logf("%v: write error %d %s", cmd, reply.WriteErrors[0].Code, reply.WriteErrors[0].Errmsg)
		return reply.N, reply.WriteErrors[0].Code
	}
	return reply.N, 0
}

// awayFromHourEnd waits out the last 30 seconds of an hour, so that a
// test's events of "now" stay in the current window (seconds
// granularity: an hour) while it runs.
func awayFromHourEnd() {
	now := time.Now()
	if left := now.Truncate(time.Hour).Add(time.Hour).Sub(now); left < 30*time.Second {
		time.Sleep(left + time.Second)
	}
}

// TestTimeseriesOptionsTTLZero (case 5): expireAfterSeconds 0 is
// MongoDB's "expire a bucket once its whole time range has passed": taken
// on create and collMod, listed, and enforced by retention; "off" turns
// it off; negative and non-numeric values answer MongoDB's codes.
func TestTimeseriesOptionsTTLZero(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	d, _ := tsOptionsDB(t)

	createTS(t, ctx, d, "z", bson.E{Key: "expireAfterSeconds", Value: 0})
	if got, want := tsOptions(t, ctx, d, "z"), `{"expireAfterSeconds": {"$numberLong":"0"},"timeseries": {"timeField": "t","metaField": "m","granularity": "seconds","bucketMaxSpanSeconds": {"$numberInt":"3600"}}}`; got != want {
		t.Fatalf("listed %s, want %s", got, want)
	}
	// The same create again is ok; one without the TTL is another
	// collection: NamespaceExists.
	createTS(t, ctx, d, "z", bson.E{Key: "expireAfterSeconds", Value: 0})
	if code := runCode(ctx, d, bson.D{{Key: "create", Value: "z"}, {Key: "timeseries", Value: bson.D{{Key: "timeField", Value: "t"}, {Key: "metaField", Value: "m"}}}}); code != 48 {
		t.Fatalf("create without the TTL: code %d, want 48 (NamespaceExists)", code)
	}
	if code := runCode(ctx, d, bson.D{{Key: "collMod", Value: "z"}, {Key: "expireAfterSeconds", Value: "off"}}); code != 0 {
		t.Fatalf("collMod off: code %d", code)
	}
	if got, want := tsOptions(t, ctx, d, "z"), `{"timeseries": {"timeField": "t","metaField": "m","granularity": "seconds","bucketMaxSpanSeconds": {"$numberInt":"3600"}}}`; got != want {
		t.Fatalf("after off: listed %s, want %s", got, want)
	}

	// MongoDB's answers to bad values (timeseries_expire_collmod.js,
	// timeseries_create.js).
	for _, tc := range []struct {
		cmd  bson.D
		code int
	}{
		{bson.D{{Key: "collMod", Value: "z"}, {Key: "expireAfterSeconds", Value: -10}}, 72},
		{bson.D{{Key: "collMod", Value: "z"}, {Key: "expireAfterSeconds", Value: "10"}}, 72},
		{bson.D{{Key: "collMod", Value: "z"}, {Key: "expireAfterSeconds", Value: bson.D{}}}, 14},
		{bson.D{{Key: "create", Value: "bad"}, {Key: "timeseries", Value: bson.D{{Key: "timeField", Value: "t"}}}, {Key: "expireAfterSeconds", Value: int64(-10)}}, 72},
		{bson.D{{Key: "create", Value: "bad"}, {Key: "timeseries", Value: bson.D{{Key: "timeField", Value: "t"}}}, {Key: "expireAfterSeconds", Value: ""}}, 14},
	} {
		if code := runCode(ctx, d, tc.cmd); code != tc.code {
			t.Errorf("%v: code %d, want %d", tc.cmd, code, tc.code)
		}
	}

	// Retention: events 10 days old go, those of the current window
	// stay. The collMod starts the collection's retention, which sweeps
	// at once.
	awayFromHourEnd()
	createTS(t, ctx, d, "c")
	coll := d.Collection("c")
	now := time.Now().UTC()
	var docs []any
	for i := 0; i < 20; i++ {
		docs = append(docs,
			bson.D{{Key: "t", Value: now.Add(-10*24*time.Hour + time.Duration(i)*time.Minute)}, {Key: "m", Value: "old"}, {Key: "v", Value: i}},
			bson.D{{Key: "t", Value: now}, {Key: "m", Value: "now"}, {Key: "v", Value: i}})
	}
	if _, err := coll.InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}
	settleLive(t) // staged events into buckets: retention removes buckets
	if err := d.RunCommand(ctx, bson.D{{Key: "collMod", Value: "c"}, {Key: "expireAfterSeconds", Value: 0}}).Err(); err != nil {
		t.Fatalf("collMod expireAfterSeconds 0: %v", err)
	}
	if got, want := tsOptions(t, ctx, d, "c"), `{"expireAfterSeconds": {"$numberLong":"0"},"timeseries": {"timeField": "t","metaField": "m","granularity": "seconds","bucketMaxSpanSeconds": {"$numberInt":"3600"}}}`; got != want {
		t.Fatalf("after collMod: listed %s, want %s", got, want)
	}
	wait := ttlWait(30 * time.Second)
	deadline := time.Now().Add(wait)
	for {
		old, err := coll.CountDocuments(ctx, bson.D{{Key: "m", Value: "old"}})
		if err != nil {
			t.Fatal(err)
		}
		if old == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s %d events 10 days old are left with expireAfterSeconds 0", wait, old)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if n, err := coll.CountDocuments(ctx, bson.D{{Key: "m", Value: "now"}}); err != nil || n != 20 {
		t.Fatalf("events of the current window: %d, %v; want 20 kept", n, err)
	}
}

// TestTimeseriesOptionsDelete (case 7a, b, e): a delete's let and
// collation are taken as MongoDB takes them; a $jsonSchema that is not a
// document is MongoDB's TypeMismatch.
func TestTimeseriesOptionsDelete(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	d, _ := tsOptionsDB(t)
	createTS(t, ctx, d, "c")
	T := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	var docs []any
	for i, m := range []string{"a", "a", "b", "b", "c", "c", "d", "e"} {
		docs = append(docs, bson.D{{Key: "t", Value: T.Add(time.Duration(i) * time.Minute)}, {Key: "m", Value: m}, {Key: "v", Value: i}})
	}
	if _, err := d.Collection("c").InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}
	del := func(q bson.D, stmtMore bson.D, cmdMore ...bson.E) bson.D {
		st := append(bson.D{{Key: "q", Value: q}, {Key: "limit", Value: 0}}, stmtMore...)
		return append(bson.D{{Key: "delete", Value: "c"}, {Key: "deletes", Value: bson.A{st}}}, cmdMore...)
	}
	for _, tc := range []struct {
		name string
		cmd  bson.D
		n    int64
		code int
	}{
		{"let null", del(bson.D{{Key: "m", Value: "a"}}, nil, bson.E{Key: "let", Value: nil}), 2, 0},
		{"let a document", del(bson.D{{Key: "m", Value: "b"}}, nil, bson.E{Key: "let", Value: bson.D{{Key: "x", Value: 1}}}), 2, 0},
		{"simple collation", del(bson.D{{Key: "m", Value: "c"}}, bson.D{{Key: "collation", Value: bson.D{{Key: "locale", Value: "simple"}}}}), 2, 0},
		{"a collation on numbers", del(bson.D{{Key: "v", Value: 6}}, bson.D{{Key: "collation", Value: bson.D{{Key: "locale", Value: "fr"}, {Key: "strength", Value: 2}}}}), 1, 0},
		{"$jsonSchema not a document", del(bson.D{{Key: "$jsonSchema", Value: 1}}, nil), 0, 14},
	} {
		n, code := deleteReply(t, ctx, d, tc.cmd)
		if n != tc.n || code != tc.code {
			t.Errorf("%s: n %d, code %d; want n %d, code %d", tc.name, n, code, tc.n, tc.code)
		}
	}
	if n, err := d.Collection("c").CountDocuments(ctx, bson.D{}); err != nil || n != 1 {
		t.Fatalf("left %d, %v; want the one event of e", n, err)
	}
}

// TestTimeseriesOptionsCollModGranularitySpan (case 7c): collMod takes a
// granularity with the bucketMaxSpanSeconds it stands for
// (timeseries_collmod.js), and refuses another span or a rounding with
// it.
func TestTimeseriesOptionsCollModGranularitySpan(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	d, _ := tsOptionsDB(t)
	createTS(t, ctx, d, "c")
	mod := func(ts bson.D) bson.D {
		return bson.D{{Key: "collMod", Value: "c"}, {Key: "timeseries", Value: ts}}
	}
	for _, tc := range []struct {
		cmd  bson.D
		code int
	}{
		{mod(bson.D{{Key: "granularity", Value: "hours"}, {Key: "bucketMaxSpanSeconds", Value: 2592000}}), 0},
		{mod(bson.D{{Key: "granularity", Value: "hours"}, {Key: "bucketMaxSpanSeconds", Value: 2592000}}), 0},
		{mod(bson.D{{Key: "granularity", Value: "hours"}, {Key: "bucketMaxSpanSeconds", Value: 2592001}}), 72},
		{mod(bson.D{{Key: "granularity", Value: "hours"}, {Key: "bucketMaxSpanSeconds", Value: 2592000}, {Key: "bucketRoundingSeconds", Value: 86400}}), 72},
		{mod(bson.D{}), 0},
	} {
		if code := runCode(ctx, d, tc.cmd); code != tc.code {
			t.Errorf("%v: code %d, want %d", tc.cmd, code, tc.code)
		}
	}
	if got, want := tsOptions(t, ctx, d, "c"), `{"timeseries": {"timeField": "t","metaField": "m","granularity": "hours","bucketMaxSpanSeconds": {"$numberInt":"2592000"}}}`; got != want {
		t.Fatalf("listed %s, want %s", got, want)
	}
}

// TestTimeseriesOptionsEmptyMetaField (case 7d): MongoDB 8.0 takes
// metaField "" (it refuses only "_id", the timeField and dotted names)
// and lists it.
func TestTimeseriesOptionsEmptyMetaField(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	d, _ := tsOptionsDB(t)
	ts := options.TimeSeries().SetTimeField("t").SetMetaField("")
	if err := d.CreateCollection(ctx, "e", options.CreateCollection().SetTimeSeriesOptions(ts)); err != nil {
		t.Fatalf("create: %v", err)
	}
	if got, want := tsOptions(t, ctx, d, "e"), `{"timeseries": {"timeField": "t","metaField": "","granularity": "seconds","bucketMaxSpanSeconds": {"$numberInt":"3600"}}}`; got != want {
		t.Fatalf("listed %s, want %s", got, want)
	}
	// The same create again is ok; one without metaField differs.
	if err := d.CreateCollection(ctx, "e", options.CreateCollection().SetTimeSeriesOptions(ts)); err != nil {
		t.Fatalf("create again: %v", err)
	}
	if code := runCode(ctx, d, bson.D{{Key: "create", Value: "e"}, {Key: "timeseries", Value: bson.D{{Key: "timeField", Value: "t"}}}}); code != 48 {
		t.Fatalf("create without metaField: code %d, want 48 (NamespaceExists)", code)
	}
	T := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	if _, err := d.Collection("e").InsertOne(ctx, bson.D{{Key: "t", Value: T}, {Key: "", Value: "x"}, {Key: "v", Value: 1}}); err != nil {
		t.Fatalf("insert: %v", err)
	}
	var got bson.M
	if err := d.Collection("e").FindOne(ctx, bson.D{}, options.FindOne().SetProjection(bson.D{{Key: "_id", Value: 0}})).Decode(&got); err != nil || got[""] != "x" {
		t.Fatalf("read back %v, %v; want the \"\" field", got, err)
	}
}
