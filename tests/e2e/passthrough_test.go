package e2e

import (
	"context"
	"errors"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readconcern"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
)

// item is the document shape of the CRUD tests.
type item struct {
	ID    int32  `bson:"_id"`
	Kind  string `bson:"kind"`
	Qty   int32  `bson:"qty"`
	Extra string `bson:"extra,omitempty"`
}

// crud runs a full round of CRUD through client on database dbName and
// checks every result exactly; it returns the documents left at the end
// (sorted by _id) for a direct check of the upstream.
func crud(t *testing.T, client *mongo.Client, dbName string) []item {
	t.Helper()
	ctx := ctxFor(t)
	coll := client.Database(dbName).Collection("items")

	// insertOne / insertMany
	one, err := coll.InsertOne(ctx, item{ID: 0, Kind: "a", Qty: 0})
	if err != nil {
		t.Fatalf("insertOne: %v", err)
	}
	if one.InsertedID != int32(0) {
		t.Fatalf("insertOne id %v", one.InsertedID)
	}
	var docs []any
	for i := int32(1); i < 30; i++ {
		docs = append(docs, item{ID: i, Kind: []string{"a", "b", "c"}[i%3], Qty: i})
	}
	many, err := coll.InsertMany(ctx, docs)
	if err != nil {
		t.Fatalf("insertMany: %v", err)
	}
	if len(many.InsertedIDs) != 29 {
		t.Fatalf("insertMany inserted %d ids, want 29", len(many.InsertedIDs))
	}
	// A duplicate key is the upstream's write error, passed through.
	_, err = coll.InsertOne(ctx, item{ID: 5, Kind: "dup"})
	if !mongo.IsDuplicateKeyError(err) {
		t.Fatalf("duplicate insert: want a duplicate key error, got %v", err)
	}

	// find with filter, sort, limit, and a batch size that forces getMores
	cur, err := coll.Find(ctx, bson.D{{Key: "qty", Value: bson.D{{Key: "$gte", Value: 10}}}},
		options.Find().SetSort(bson.D{{Key: "qty", Value: -1}}).SetLimit(15).SetBatchSize(4))
	if err != nil {
		t.Fatalf("find: %v", err)
	}
	var got []item
	batches := 0
	for cur.Next(ctx) {
		if cur.RemainingBatchLength() == 3 { // just took the first of a batch of 4
			batches++
		}
		var it item
		if err := cur.Decode(&it); err != nil {
			t.Fatal(err)
		}
		got = append(got, it)
	}
	if err := cur.Err(); err != nil {
		t.Fatalf("find cursor: %v", err)
	}
	_ = cur.Close(ctx)
	if len(got) != 15 {
		t.Fatalf("find returned %d documents, want 15", len(got))
	}
	for i, it := range got {
		if want := int32(29 - i); it.Qty != want || it.ID != want {
			t.Fatalf("find[%d] = %+v, want qty %d", i, it, want)
		}
	}
	if batches < 3 {
		t.Fatalf("find came in %d full batches of 4; getMore was not exercised", batches)
	}

	// countDocuments / distinct
	n, err := coll.CountDocuments(ctx, bson.D{{Key: "kind", Value: "a"}})
	if err != nil || n != 10 {
		t.Fatalf("countDocuments kind a = %d, %v; want 10", n, err)
	}
	checkDistinct(t, coll, []string{"a", "b", "c"}, true)

	// updateOne / updateMany
	u1, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: 1}}, bson.D{{Key: "$set", Value: bson.D{{Key: "extra", Value: "one"}}}})
	if err != nil || u1.MatchedCount != 1 || u1.ModifiedCount != 1 {
		t.Fatalf("updateOne: %+v, %v", u1, err)
	}
	um, err := coll.UpdateMany(ctx, bson.D{{Key: "kind", Value: "b"}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "qty", Value: 100}}}})
	if err != nil || um.MatchedCount != 10 || um.ModifiedCount != 10 {
		t.Fatalf("updateMany: %+v, %v", um, err)
	}
	up, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: 100}}, bson.D{{Key: "$set", Value: bson.D{{Key: "kind", Value: "z"}, {Key: "qty", Value: 7}}}}, options.UpdateOne().SetUpsert(true))
	if err != nil || up.UpsertedCount != 1 || up.UpsertedID != int32(100) {
		t.Fatalf("upsert: %+v, %v", up, err)
	}
	var one1 item
	if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: 1}}).Decode(&one1); err != nil || one1 != (item{ID: 1, Kind: "b", Qty: 101, Extra: "one"}) {
		t.Fatalf("after updates, _id 1 = %+v, %v", one1, err)
	}

	// deleteOne / deleteMany
	d1, err := coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: 0}})
	if err != nil || d1.DeletedCount != 1 {
		t.Fatalf("deleteOne: %+v, %v", d1, err)
	}
	dm, err := coll.DeleteMany(ctx, bson.D{{Key: "kind", Value: "c"}})
	if err != nil || dm.DeletedCount != 10 {
		t.Fatalf("deleteMany: %+v, %v", dm, err)
	}
	if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: 0}}).Err(); !errors.Is(err, mongo.ErrNoDocuments) {
		t.Fatalf("deleted document still found: %v", err)
	}

	// aggregate: $match, $group, $sort. (One accumulator per $group:
	// FerretDB 1.24 answers 0 for all but one of several $sum
	// accumulators in one $group, directly as well as through the proxy.)
	type group struct {
		ID string `bson:"_id"`
		V  int64  `bson:"v"`
	}
	agg := func(acc any) []group {
		t.Helper()
		acur, err := coll.Aggregate(ctx, mongo.Pipeline{
			{{Key: "$match", Value: bson.D{{Key: "kind", Value: bson.D{{Key: "$in", Value: bson.A{"a", "b"}}}}}}},
			{{Key: "$group", Value: bson.D{{Key: "_id", Value: "$kind"}, {Key: "v", Value: bson.D{{Key: "$sum", Value: acc}}}}}},
			{{Key: "$sort", Value: bson.D{{Key: "_id", Value: -1}}}},
		}, options.Aggregate().SetBatchSize(1))
		if err != nil {
			t.Fatalf("aggregate: %v", err)
		}
		var groups []group
		if err := acur.All(ctx, &groups); err != nil {
			t.Fatalf("aggregate cursor: %v", err)
		}
		return groups
	}
	// a: ids 3,6,...,27 (0 deleted): 9 docs, qty 3+6+...+27 = 135.
	// b: ids 1,4,...,28: 10 docs, qty (1+4+...+28)+1000 = 145+1000.
	if g := agg(1); !reflect.DeepEqual(g, []group{{"b", 10}, {"a", 9}}) {
		t.Fatalf("aggregate counts = %+v", g)
	}
	if g := agg("$qty"); !reflect.DeepEqual(g, []group{{"b", 1145}, {"a", 135}}) {
		t.Fatalf("aggregate totals = %+v", g)
	}

	// createIndexes + listIndexes
	names, err := coll.Indexes().CreateMany(ctx, []mongo.IndexModel{
		{Keys: bson.D{{Key: "kind", Value: 1}, {Key: "qty", Value: -1}}, Options: options.Index().SetName("kind_qty")},
		{Keys: bson.D{{Key: "extra", Value: 1}}, Options: options.Index().SetName("extra_1").SetSparse(true)},
	})
	if err != nil || !reflect.DeepEqual(names, []string{"kind_qty", "extra_1"}) {
		t.Fatalf("createIndexes: %v, %v", names, err)
	}
	specs, err := coll.Indexes().ListSpecifications(ctx)
	if err != nil {
		t.Fatalf("listIndexes: %v", err)
	}
	idx := map[string]bson.D{}
	for _, s := range specs {
		idx[s.Name] = mustD(t, bson.Raw(s.KeysDocument))
	}
	wantIdx := map[string]bson.D{
		"_id_":     {{Key: "_id", Value: int32(1)}},
		"kind_qty": {{Key: "kind", Value: int32(1)}, {Key: "qty", Value: int32(-1)}},
		"extra_1":  {{Key: "extra", Value: int32(1)}},
	}
	if !reflect.DeepEqual(idx, wantIdx) {
		t.Fatalf("listIndexes = %v, want %v", idx, wantIdx)
	}

	// listCollections
	if err := client.Database(dbName).CreateCollection(ctx, "other"); err != nil {
		t.Fatalf("create: %v", err)
	}
	colls, err := client.Database(dbName).ListCollectionNames(ctx, bson.D{})
	if err != nil {
		t.Fatalf("listCollections: %v", err)
	}
	sort.Strings(colls)
	if !reflect.DeepEqual(colls, []string{"items", "other"}) {
		t.Fatalf("listCollections = %v", colls)
	}

	// drop
	if err := client.Database(dbName).Collection("other").Drop(ctx); err != nil {
		t.Fatalf("drop: %v", err)
	}
	colls, err = client.Database(dbName).ListCollectionNames(ctx, bson.D{})
	if err != nil || !reflect.DeepEqual(colls, []string{"items"}) {
		t.Fatalf("after drop, collections = %v, %v", colls, err)
	}

	// A command error of the upstream comes back as a command error.
	err = client.Database(dbName).RunCommand(ctx, bson.D{{Key: "noSuchCommandAtAll", Value: 1}}).Err()
	var ce mongo.CommandError
	if !errors.As(err, &ce) || ce.Code != 59 {
		t.Fatalf("unknown command: want CommandNotFound (59), got %v", err)
	}

	var left []item
	cur, err = coll.Find(ctx, bson.D{}, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		t.Fatal(err)
	}
	if err := cur.All(ctx, &left); err != nil {
		t.Fatal(err)
	}
	return left
}

// checkDistinct runs distinct on "kind". FerretDB 1.24 refuses the
// maxTimeMS that the driver adds to distinct under a client-wide timeout
// (connect sets one): then its error must come through unchanged.
func checkDistinct(t *testing.T, coll *mongo.Collection, want []string, csot bool) {
	t.Helper()
	ctx := ctxFor(t)
	if !csot {
		// A context deadline also makes the driver send maxTimeMS.
		ctx = context.Background()
	}
	res := coll.Distinct(ctx, "kind", bson.D{})
	if err := res.Err(); err != nil {
		var ce mongo.CommandError
		if !csot || env.external || !errors.As(err, &ce) || ce.Code != 9 || !strings.Contains(ce.Message, `unknown field "maxTimeMS"`) {
			t.Fatalf("distinct: %v", err)
		}
		return
	}
	var kinds []string
	if err := res.Decode(&kinds); err != nil {
		t.Fatalf("distinct: %v", err)
	}
	sort.Strings(kinds)
	if !reflect.DeepEqual(kinds, want) {
		t.Fatalf("distinct kinds = %v, want %v", kinds, want)
	}
}

// connectNoTimeout is connect without a client-wide timeout (no CSOT):
// the driver's default configuration.
func connectNoTimeout(t testing.TB, uri string) *mongo.Client {
	t.Helper()
	c, err := mongo.Connect(options.Client().ApplyURI(uri).SetServerSelectionTimeout(10 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Disconnect(context.Background()) })
	return c
}

// expectedLeft is what crud leaves: kinds a and b without _id 0, the b
// ones incremented by 100, _id 1 with extra "one", plus the upsert.
func expectedLeft() []item {
	var want []item
	for i := int32(1); i < 30; i++ {
		switch i % 3 {
		case 0:
			want = append(want, item{ID: i, Kind: "a", Qty: i})
		case 1:
			it := item{ID: i, Kind: "b", Qty: i + 100}
			if i == 1 {
				it.Extra = "one"
			}
			want = append(want, it)
		}
	}
	return append(want, item{ID: 100, Kind: "z", Qty: 7})
}

// checkDirect reads dbName.items straight from the upstream and compares.
func checkDirect(t *testing.T, dbName string, want []item) {
	t.Helper()
	ctx := ctxFor(t)
	cur, err := direct(t).Database(dbName).Collection("items").Find(ctx, bson.D{}, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		t.Fatal(err)
	}
	var got []item
	if err := cur.All(ctx, &got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("upstream holds\n%+v\nwant\n%+v", got, want)
	}
}

// TestPassthroughCRUD: the Go driver, given only the proxy's address, does
// CRUD, aggregate, indexes and collections through it; every result is
// exact, and the upstream holds exactly what was written.
func TestPassthroughCRUD(t *testing.T) {
	t.Parallel()
	p := startProxy(t, proxyOptions{})
	c := connect(t, p.URI())
	db := uniqueDB(t)
	left := crud(t, c, db)
	want := expectedLeft()
	if !reflect.DeepEqual(left, want) {
		t.Fatalf("through the proxy the collection holds\n%+v\nwant\n%+v", left, want)
	}
	checkDirect(t, db, want)
	// Without a client timeout, distinct runs on FerretDB too.
	checkDistinct(t, connectNoTimeout(t, p.URI()).Database(db).Collection("items"), []string{"a", "b", "z"}, false)

	// The driver discovered the proxy as a router and nothing else.
	ctx := ctxFor(t)
	var hello bson.M
	if err := c.Database("admin").RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&hello); err != nil {
		t.Fatal(err)
	}
	if hello["msg"] != "isdbgrid" {
		t.Fatalf("hello msg %v", hello["msg"])
	}
	if err := c.Database(db).Drop(ctx); err != nil {
		t.Fatalf("dropDatabase: %v", err)
	}
	names, err := direct(t).ListDatabaseNames(ctx, bson.D{{Key: "name", Value: db}})
	if err != nil || len(names) != 0 {
		t.Fatalf("after dropDatabase the upstream lists %v, %v", names, err)
	}
}

// TestPassthroughCompression: the Go driver asking for each compressor does
// CRUD through the proxy correctly.
func TestPassthroughCompression(t *testing.T) {
	t.Parallel()
	p := startProxy(t, proxyOptions{})
	for _, comp := range []string{"zstd", "snappy", "zlib"} {
		t.Run(comp, func(t *testing.T) {
			c := connect(t, p.URI(), "compressors="+comp)
			db := uniqueDB(t)
			left := crud(t, c, db)
			if want := expectedLeft(); !reflect.DeepEqual(left, want) {
				t.Fatalf("%s: collection holds\n%+v\nwant\n%+v", comp, left, want)
			}
			checkDirect(t, db, expectedLeft())
			// A document large enough that compression matters comes back whole.
			ctx := ctxFor(t)
			big := make([]byte, 1<<20)
			for i := range big {
				big[i] = byte('a' + i%7)
			}
			coll := c.Database(db).Collection("big")
			if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 1}, {Key: "s", Value: string(big)}}); err != nil {
				t.Fatalf("insert 1 MiB document: %v", err)
			}
			var back struct {
				S string `bson:"s"`
			}
			if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: 1}}).Decode(&back); err != nil || back.S != string(big) {
				t.Fatalf("1 MiB document did not come back intact (%d bytes, %v)", len(back.S), err)
			}
		})
	}
}

// TestPassthroughHello: hello, isMaster and ismaster with every value type
// drivers send, through the Go driver's RunCommand.
func TestPassthroughHello(t *testing.T) {
	t.Parallel()
	p := startProxy(t, proxyOptions{})
	c := connect(t, p.URI())
	up := upstreamHello(t)
	ctx := ctxFor(t)
	for _, name := range []string{"hello", "isMaster", "ismaster"} {
		for _, v := range []any{int32(1), true, 1.0} {
			raw, err := c.Database("admin").RunCommand(ctx, bson.D{{Key: name, Value: v}}).Raw()
			if err != nil {
				t.Fatalf("%s: %v: %v", name, v, err)
			}
			field := "isWritablePrimary"
			if name != "hello" {
				field = "ismaster"
			}
			checkRouterHello(t, raw, field, up)
		}
	}
	// On a database other than admin too.
	raw, err := c.Database(uniqueDB(t)).RunCommand(ctx, bson.D{{Key: "isMaster", Value: 1}}).Raw()
	if err != nil {
		t.Fatal(err)
	}
	checkRouterHello(t, raw, "ismaster", up)
}

// TestPassthroughSessions: a causally consistent session reads its own
// writes through the proxy; a transaction either commits (MongoDB) or is
// refused with the upstream's command error (FerretDB), and the client keeps
// working either way.
func TestPassthroughSessions(t *testing.T) {
	t.Parallel()
	p := startProxy(t, proxyOptions{})
	c := connect(t, p.URI())
	db := uniqueDB(t)
	ctx := ctxFor(t)
	coll := c.Database(db).Collection("s", options.Collection().SetWriteConcern(writeconcern.Majority()).SetReadConcern(readconcern.Majority()))

	sess, err := c.StartSession(options.Session().SetCausalConsistency(true))
	if err != nil {
		t.Fatal(err)
	}
	defer sess.EndSession(ctx)
	err = mongo.WithSession(ctx, sess, func(sc context.Context) error {
		for i := 0; i < 5; i++ {
			if _, err := coll.InsertOne(sc, bson.D{{Key: "_id", Value: i}, {Key: "v", Value: i * i}}); err != nil {
				return err
			}
			n, err := coll.CountDocuments(sc, bson.D{})
			if err != nil {
				return err
			}
			if n != int64(i+1) {
				t.Errorf("session read after write %d saw %d documents", i, n)
			}
		}
		if _, err := coll.UpdateOne(sc, bson.D{{Key: "_id", Value: 2}}, bson.D{{Key: "$set", Value: bson.D{{Key: "v", Value: -1}}}}); err != nil {
			return err
		}
		var d struct{ V int32 }
		if err := coll.FindOne(sc, bson.D{{Key: "_id", Value: 2}}).Decode(&d); err != nil {
			return err
		}
		if d.V != -1 {
			t.Errorf("session read its update as %d, want -1", d.V)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("causally consistent session: %v", err)
	}
	if sess.ID() == nil {
		t.Fatal("session has no lsid")
	}

	// A transaction.
	tx, err := c.StartSession()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.EndSession(ctx)
	tcoll := c.Database(db).Collection("tx")
	if env.external {
		// The collection must exist before a transaction on older servers.
		if err := c.Database(db).CreateCollection(ctx, "tx"); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	_, txErr := tx.WithTransaction(ctx, func(sc context.Context) (any, error) {
		if _, err := tcoll.InsertOne(sc, bson.D{{Key: "_id", Value: "t1"}}); err != nil {
			return nil, err
		}
		return tcoll.InsertOne(sc, bson.D{{Key: "_id", Value: "t2"}})
	})
	elapsed := time.Since(start)
	if env.external {
		if txErr != nil {
			t.Fatalf("transaction on a real MongoDB: %v", txErr)
		}
		n, err := direct(t).Database(db).Collection("tx").CountDocuments(ctx, bson.D{})
		if err != nil || n != 2 {
			t.Fatalf("after commit the upstream holds %d documents, %v", n, err)
		}
	} else {
		t.Logf("FerretDB transaction answer after %v: %v", elapsed, txErr)
		if txErr == nil {
			t.Fatal("FerretDB v1.24 has no transactions, yet the transaction succeeded")
		}
		var ce mongo.CommandError
		if !errors.As(txErr, &ce) {
			t.Fatalf("transaction: want the upstream's command error, got %T: %v", txErr, txErr)
		}
		if ce.Code == 0 || ce.Message == "" || ce.HasErrorLabel("NetworkError") {
			t.Fatalf("transaction error is not a plain command error: %+v", ce)
		}
		if elapsed > 10*time.Second {
			t.Fatalf("transaction took %v to fail", elapsed)
		}
	}
	// The same client keeps working.
	if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 99}}); err != nil {
		t.Fatalf("insert after transaction: %v", err)
	}
	n, err := coll.CountDocuments(ctx, bson.D{})
	if err != nil || n != 6 {
		t.Fatalf("after the transaction the collection counts %d, %v; want 6", n, err)
	}
}

// TestPassthroughUnacknowledgedWrites: the Go driver's w:0 writes (sent
// with moreToCome, no reply expected) on a one-connection pool, each
// followed by acknowledged commands on the same connection: every reply
// pairs with its own request and every write lands.
func TestPassthroughUnacknowledgedWrites(t *testing.T) {
	t.Parallel()
	p := startProxy(t, proxyOptions{})
	c := connect(t, p.URI(), "maxPoolSize=1")
	db := uniqueDB(t)
	ctx := ctxFor(t)
	acked := c.Database(db).Collection("w0")
	unacked := c.Database(db).Collection("w0", options.Collection().SetWriteConcern(writeconcern.Unacknowledged()))
	for i := 0; i < 20; i++ {
		res, err := unacked.InsertOne(ctx, bson.D{{Key: "_id", Value: i}, {Key: "v", Value: i}})
		if err != nil {
			t.Fatalf("w:0 insert %d: %v", i, err)
		}
		if res.Acknowledged {
			t.Fatalf("w:0 insert %d reported acknowledged", i)
		}
		// An acknowledged command right after: its reply must be its own.
		var d struct {
			ID int32 `bson:"_id"`
			V  int32 `bson:"v"`
		}
		if err := acked.FindOne(ctx, bson.D{{Key: "_id", Value: i}}).Decode(&d); err != nil || d.ID != int32(i) || d.V != int32(i) {
			t.Fatalf("find after w:0 insert %d: %+v, %v", i, d, err)
		}
	}
	if _, err := unacked.UpdateMany(ctx, bson.D{}, bson.D{{Key: "$inc", Value: bson.D{{Key: "v", Value: 100}}}}); err != nil {
		t.Fatalf("w:0 updateMany: %v", err)
	}
	if _, err := unacked.DeleteOne(ctx, bson.D{{Key: "_id", Value: 0}}); err != nil {
		t.Fatalf("w:0 deleteOne: %v", err)
	}
	n, err := acked.CountDocuments(ctx, bson.D{{Key: "v", Value: bson.D{{Key: "$gte", Value: 100}}}})
	if err != nil || n != 19 {
		t.Fatalf("after w:0 update and delete, %d documents with v >= 100, %v; want 19", n, err)
	}
}
