package e2e

import (
	"errors"
	"math"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// What FerretDB itself fails at must not become a dropped client
// connection or an unclear answer.

// TestUpstreamQuirksNaN: FerretDB 1.x closes its connection on any
// message holding a NaN or a Decimal128. Through the proxy the client
// gets an error naming the value's place, on a connection that goes on
// serving (one connection in the pool: a dropped one would surface as a
// network error, which the driver retries once and then reports). MongoDB
// stores both values.
func TestUpstreamQuirksNaN(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{})
	c := connect(t, p.URI(), "maxPoolSize=1")
	dropAtEnd(t, c, db)
	coll := c.Database(db).Collection("plain")
	if _, err := coll.InsertOne(ctx, bson.D{{Key: "a", Value: 1}}); err != nil {
		t.Fatal(err)
	}
	dec, _ := bson.ParseDecimal128("1.5")
	bad := []struct {
		name string
		run  func() error
		path string
	}{
		{"insert NaN", func() error {
			_, err := coll.InsertOne(ctx, bson.D{{Key: "a", Value: bson.D{{Key: "b", Value: math.NaN()}}}})
			return err
		}, "documents.0.a.b"},
		{"insert Decimal128", func() error {
			_, err := coll.InsertOne(ctx, bson.D{{Key: "d", Value: bson.A{dec}}})
			return err
		}, "documents.0.d.0"},
		{"find NaN", func() error {
			return coll.FindOne(ctx, bson.D{{Key: "a", Value: math.NaN()}}).Err()
		}, "filter.a"},
		{"update NaN", func() error {
			_, err := coll.UpdateOne(ctx, bson.D{}, bson.D{{Key: "$set", Value: bson.D{{Key: "x", Value: math.NaN()}}}})
			return err
		}, "updates.0.u.$set.x"},
	}
	stored := 1
	for _, b := range bad {
		err := b.run()
		if env.external {
			if err != nil && !errors.Is(err, mongo.ErrNoDocuments) {
				t.Errorf("%s on MongoDB: %v", b.name, err)
			}
			if strings.HasPrefix(b.name, "insert") {
				stored++
			}
			continue
		}
		var se mongo.ServerError
		if !errors.As(err, &se) || !se.HasErrorCode(1) || !strings.Contains(err.Error(), "NaN or a Decimal128 at "+b.path) {
			t.Errorf("%s: %v; want the proxy's error (code 1) naming %s", b.name, err, b.path)
		}
		if _, err := coll.InsertOne(ctx, bson.D{{Key: "a", Value: 2}}); err != nil {
			t.Fatalf("insert after %s: %v", b.name, err)
		}
		stored++
	}
	n, err := coll.CountDocuments(ctx, bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(stored) {
		t.Fatalf("count %d, want %d", n, stored)
	}
}

// TestUpstreamQuirksQuotedNames: MongoDB takes collection names holding
// '"'; FerretDB 1.x on SQLite fails to create them with an SQL syntax
// error. The proxy makes plain ones by a rename (create options kept)
// and refuses a time-series one with InvalidNamespace naming the cause.
func TestUpstreamQuirksQuotedNames(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{})
	c := connect(t, p.URI())
	dropAtEnd(t, c, db)
	d := c.Database(db)
	if err := d.CreateCollection(ctx, `ca"pped`, options.CreateCollection().SetCapped(true).SetSizeInBytes(1<<20)); err != nil {
		t.Fatalf("create: %v", err)
	}
	for _, name := range []string{`ca"pped`, `im"plicit`} {
		if _, err := d.Collection(name).InsertMany(ctx, []any{bson.D{{Key: "a", Value: 1}}, bson.D{{Key: "a", Value: 2}}}); err != nil {
			t.Fatalf("insert into %s: %v", name, err)
		}
		if _, err := d.Collection(name).Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: "a", Value: 1}}}); err != nil {
			t.Fatalf("createIndexes on %s: %v", name, err)
		}
		n, err := d.Collection(name).CountDocuments(ctx, bson.D{{Key: "a", Value: bson.D{{Key: "$gte", Value: 1}}}})
		if err != nil || n != 2 {
			t.Fatalf("count on %s: %d, %v; want 2", name, n, err)
		}
	}
	infos := tsCollections(t, ctx, c, db)
	// The options kept are the upstream's: FerretDB 2.x ignores capped
	// on any create, as a collection made directly shows.
	if err := direct(t).Database(db).CreateCollection(ctx, "capped_direct", options.CreateCollection().SetCapped(true).SetSizeInBytes(1<<20)); err != nil {
		t.Fatalf("direct create: %v", err)
	}
	keepsCapped := hasField(tsCollections(t, ctx, direct(t), db)["capped_direct"]["options"], "capped", true)
	if keepsCapped && !hasField(infos[`ca"pped`]["options"], "capped", true) {
		t.Fatalf("listCollections: %v; want ca\"pped capped", infos)
	}
	if !keepsCapped {
		t.Log("the upstream keeps no capped option on a create of its own; not checked through the proxy")
	}
	if _, ok := infos[`im"plicit`]; !ok {
		t.Fatalf("listCollections: %v; want im\"plicit", infos)
	}
	err := d.CreateCollection(ctx, `ts"q`, options.CreateCollection().SetTimeSeriesOptions(options.TimeSeries().SetTimeField("t")))
	if err != nil && (serverCode(err) != 73 || !strings.Contains(err.Error(), `holds '"'`)) {
		t.Fatalf("time-series create: %v; want success or InvalidNamespace naming the quote", err)
	}
}

// hasField: doc (a bson.D or bson.M decoded from a reply) has key = v.
func hasField(doc any, key string, v any) bool {
	switch d := doc.(type) {
	case bson.D:
		for _, e := range d {
			if e.Key == key {
				return e.Value == v
			}
		}
	case bson.M:
		return d[key] == v
	}
	return false
}
