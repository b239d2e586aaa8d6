package e2e

import (
	"context"
	"errors"
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

// updateCase is one update run on the bucketed namespace and on the
// plain collection of the same events, whose results must agree.
type updateCase struct {
	name string
	run  func(c *mongo.Collection) (*mongo.UpdateResult, error)
}

// TestUpdateDifferential: every update form MongoDB defines the same way
// on a time-series collection and a plain one (operators, replacement,
// pipeline, upsert, and updates that move events to another series or
// window) gives the same counts through the proxy as directly on a plain
// collection of the same events, and leaves the same documents, with
// every bucket's summaries true to its events.
func TestUpdateDifferential(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db, _, buckets, plain, sent := delLoad(t, ctx)
	upsertID := bson.NewObjectID()
	cases := []updateCase{
		{"updateOne $set", func(c *mongo.Collection) (*mongo.UpdateResult, error) {
			return c.UpdateOne(ctx, bson.D{{Key: "sensorId", Value: "ordered"}, {Key: "value", Value: 3.0}}, bson.D{{Key: "$set", Value: bson.D{{Key: "value", Value: 33.0}, {Key: "note", Value: "fixed"}}}})
		}},
		{"updateMany $inc and a nested $set", func(c *mongo.Collection) (*mongo.UpdateResult, error) {
			return c.UpdateMany(ctx, bson.D{{Key: "sensorId", Value: "sensor-01"}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "value", Value: 1.5}}}, {Key: "$set", Value: bson.D{{Key: "extra.tag", Value: "x"}}}})
		}},
		{"updateMany that matches nothing", func(c *mongo.Collection) (*mongo.UpdateResult, error) {
			return c.UpdateMany(ctx, bson.D{{Key: "sensorId", Value: "nobody"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "value", Value: 0.0}}}})
		}},
		{"a no-op update matches without modifying", func(c *mongo.Collection) (*mongo.UpdateResult, error) {
			return c.UpdateMany(ctx, bson.D{{Key: "sensorId", Value: "ordered"}, {Key: "value", Value: 33.0}}, bson.D{{Key: "$set", Value: bson.D{{Key: "value", Value: 33.0}}}})
		}},
		{"replaceOne", func(c *mongo.Collection) (*mongo.UpdateResult, error) {
			return c.ReplaceOne(ctx, bson.D{{Key: "_id", Value: sent[5].id}}, bson.D{{Key: "ts", Value: sent[5].ts}, {Key: "sensorId", Value: sent[5].sensor}, {Key: "value", Value: 7.0}})
		}},
		{"updateMany moves events to another series", func(c *mongo.Collection) (*mongo.UpdateResult, error) {
			return c.UpdateMany(ctx, bson.D{{Key: "sensorId", Value: "sensor-02"}, {Key: "value", Value: bson.D{{Key: "$lt", Value: 50.0}}}}, bson.D{{Key: "$set", Value: bson.D{{Key: "sensorId", Value: "moved"}}}})
		}},
		{"updateOne moves an event to another window", func(c *mongo.Collection) (*mongo.UpdateResult, error) {
			return c.UpdateOne(ctx, bson.D{{Key: "_id", Value: sent[9].id}}, bson.D{{Key: "$set", Value: bson.D{{Key: "ts", Value: delBase.Add(30 * time.Hour)}}}})
		}},
		{"pipeline update", func(c *mongo.Collection) (*mongo.UpdateResult, error) {
			return c.UpdateMany(ctx, bson.D{{Key: "sensorId", Value: "sensor-03"}}, mongo.Pipeline{{{Key: "$set", Value: bson.D{{Key: "double", Value: bson.D{{Key: "$multiply", Value: bson.A{"$value", 2}}}}}}}})
		}},
		{"upsert that inserts", func(c *mongo.Collection) (*mongo.UpdateResult, error) {
			return c.UpdateOne(ctx, bson.D{{Key: "_id", Value: upsertID}, {Key: "sensorId", Value: "new"}, {Key: "ts", Value: delBase.Add(2 * time.Hour)}}, bson.D{{Key: "$set", Value: bson.D{{Key: "value", Value: 5.0}}}}, options.UpdateOne().SetUpsert(true))
		}},
		{"upsert that matches", func(c *mongo.Collection) (*mongo.UpdateResult, error) {
			return c.UpdateOne(ctx, bson.D{{Key: "_id", Value: upsertID}}, bson.D{{Key: "$set", Value: bson.D{{Key: "value", Value: 6.0}}}}, options.UpdateOne().SetUpsert(true))
		}},
	}
	// The same updates in a form any upstream runs on the plain
	// collection (FerretDB v1.24 refuses pipeline updates).
	plainForm := map[string]func(c *mongo.Collection) (*mongo.UpdateResult, error){
		"pipeline update": func(c *mongo.Collection) (*mongo.UpdateResult, error) {
			return updateEach(ctx, c, bson.D{{Key: "sensorId", Value: "sensor-03"}}, func(d bson.M) bson.D {
				return bson.D{{Key: "$set", Value: bson.D{{Key: "double", Value: d["value"].(float64) * 2}}}}
			})
		},
	}
	for _, c := range cases {
		got, err := c.run(buckets)
		if err != nil {
			t.Fatalf("%s through the proxy: %v", c.name, err)
		}
		run := c.run
		if f := plainForm[c.name]; f != nil {
			run = f
		}
		want, err := run(plain)
		if err != nil {
			t.Fatalf("%s directly: %v", c.name, err)
		}
		if got.MatchedCount != want.MatchedCount || got.ModifiedCount != want.ModifiedCount || fmt.Sprint(got.UpsertedID) != fmt.Sprint(want.UpsertedID) {
			t.Fatalf("%s: proxy matched %d, modified %d, upserted %v; plain %d, %d, %v", c.name,
				got.MatchedCount, got.ModifiedCount, got.UpsertedID, want.MatchedCount, want.ModifiedCount, want.UpsertedID)
		}
	}
	delCompare(t, ctx, db, buckets, plain)
	if n, err := buckets.CountDocuments(ctx, bson.D{{Key: "sensorId", Value: "moved"}}); err != nil || n == 0 {
		t.Fatalf("%d events in the series they were moved to (%v)", n, err)
	}
	delAppCollectionUntouched(t, ctx, db)
}

// updateEach updates each document filter matches by _id with what set
// makes of it, and counts as one update would.
func updateEach(ctx context.Context, c *mongo.Collection, filter bson.D, set func(bson.M) bson.D) (*mongo.UpdateResult, error) {
	cur, err := c.Find(ctx, filter)
	if err != nil {
		return nil, err
	}
	var docs []bson.M
	if err := cur.All(ctx, &docs); err != nil {
		return nil, err
	}
	total := &mongo.UpdateResult{}
	for _, d := range docs {
		r, err := c.UpdateOne(ctx, bson.D{{Key: "_id", Value: d["_id"]}}, set(d))
		if err != nil {
			return nil, err
		}
		total.MatchedCount += r.MatchedCount
		total.ModifiedCount += r.ModifiedCount
	}
	return total, nil
}

// TestUpdateRefusals: an update that would leave an event without a valid
// timeField is MongoDB's error and leaves the event as it was; updates in
// a transaction are refused as MongoDB refuses them on a time-series
// collection; an unordered update reports each failed statement at its
// index and runs the others.
func TestUpdateRefusals(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: readingsRule(db, 10)})
	client := connect(t, p.URI())
	coll := client.Database(db).Collection("readings")
	sent := genEvents(30, 2, 1, 3)
	docs := make([]any, len(sent))
	for i, e := range sent {
		docs[i] = e.doc()
	}
	if _, err := coll.InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}
	one := bson.D{{Key: "_id", Value: sent[0].id}}
	for _, u := range []bson.D{
		{{Key: "$unset", Value: bson.D{{Key: "ts", Value: 1}}}},
		{{Key: "$set", Value: bson.D{{Key: "ts", Value: "not a date"}}}},
	} {
		_, err := coll.UpdateOne(ctx, one, u)
		var we mongo.WriteException
		if err == nil || !errors.As(err, &we) || len(we.WriteErrors) != 1 || !strings.Contains(we.WriteErrors[0].Message, "ts") {
			t.Fatalf("update %v: %v; want a write error naming the timeField", u, err)
		}
	}
	var back bson.M
	if err := coll.FindOne(ctx, one).Decode(&back); err != nil || back["ts"] == nil {
		t.Fatalf("the event after refused updates: %v, %v", back, err)
	}
	// A value the upstream cannot take (FerretDB v1.x closes its link on
	// a NaN): an error naming it, or stored where the upstream takes it;
	// either way the connection goes on serving and no event is lost.
	_, nanErr := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: sent[1].id}}, bson.D{{Key: "$set", Value: bson.D{{Key: "value", Value: math.NaN()}}}})
	t.Logf("an update to NaN: %v", nanErr)
	if n, err := coll.CountDocuments(ctx, bson.D{}); err != nil || n != int64(len(sent)) {
		t.Fatalf("after an update to NaN (%v): %d events, %v", nanErr, n, err)
	}
	// Unordered: the bad statement fails at its index, the good one runs.
	res, err := coll.BulkWrite(ctx, []mongo.WriteModel{
		mongo.NewUpdateOneModel().SetFilter(one).SetUpdate(bson.D{{Key: "$unset", Value: bson.D{{Key: "ts", Value: 1}}}}),
		mongo.NewUpdateOneModel().SetFilter(one).SetUpdate(bson.D{{Key: "$set", Value: bson.D{{Key: "value", Value: -5.0}}}}),
	}, options.BulkWrite().SetOrdered(false))
	var bwe mongo.BulkWriteException
	if !errors.As(err, &bwe) || len(bwe.WriteErrors) != 1 || bwe.WriteErrors[0].Index != 0 {
		t.Fatalf("unordered bulk: %v", err)
	}
	_ = res
	if n, _ := coll.CountDocuments(ctx, bson.D{{Key: "value", Value: -5.0}}); n != 1 {
		t.Fatalf("the unordered bulk's good statement updated %d events", n)
	}
	if n, err := coll.CountDocuments(ctx, bson.D{}); err != nil || n != int64(len(sent)) {
		t.Fatalf("%d events after the updates (%v), want %d", n, err, len(sent))
	}
	// A bulk write mixing inserts and updates, ordered.
	extra := genEvents(5, 1, 1, 7)
	models := []mongo.WriteModel{}
	for _, e := range extra {
		models = append(models, mongo.NewInsertOneModel().SetDocument(e.doc()))
	}
	models = append(models, mongo.NewUpdateManyModel().SetFilter(bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: bson.A{extra[0].id, extra[1].id}}}}}).SetUpdate(bson.D{{Key: "$set", Value: bson.D{{Key: "value", Value: 99.0}}}}))
	bres, err := coll.BulkWrite(ctx, models)
	if err != nil || bres.InsertedCount != 5 || bres.MatchedCount != 2 || bres.ModifiedCount != 2 {
		t.Fatalf("mixed bulk: %+v, %v", bres, err)
	}
	delAppCollectionUntouched(t, ctx, db)
}

// TestFindAndModifyDifferential: findOneAndUpdate, findOneAndReplace and
// findOneAndDelete return the event before or after, projected, as a
// plain collection returns the same document, and leave the same events.
func TestFindAndModifyDifferential(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db, _, buckets, plain, sent := delLoad(t, ctx)
	after := options.After
	upsertID := bson.NewObjectID()
	cases := []struct {
		name string
		run  func(c *mongo.Collection) *mongo.SingleResult
		// keep, for the projected case, names the fields it keeps:
		// where the plain side's upstream refuses findAndModify's
		// fields (FerretDB v1.24), the same update runs there without
		// them and is projected here.
		keep []string
	}{
		{"update, before", func(c *mongo.Collection) *mongo.SingleResult {
			return c.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: sent[1].id}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "value", Value: 10.0}}}})
		}, nil},
		{"update, after, projected", func(c *mongo.Collection) *mongo.SingleResult {
			return c.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: sent[2].id}}, bson.D{{Key: "$set", Value: bson.D{{Key: "value", Value: -2.0}}}},
				options.FindOneAndUpdate().SetReturnDocument(after).SetProjection(bson.D{{Key: "value", Value: 1}, {Key: "sensorId", Value: 1}}))
		}, []string{"_id", "sensorId", "value"}},
		{"update that moves the event, after", func(c *mongo.Collection) *mongo.SingleResult {
			return c.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: sent[3].id}}, bson.D{{Key: "$set", Value: bson.D{{Key: "sensorId", Value: "elsewhere"}}}}, options.FindOneAndUpdate().SetReturnDocument(after))
		}, nil},
		{"replace, after", func(c *mongo.Collection) *mongo.SingleResult {
			return c.FindOneAndReplace(ctx, bson.D{{Key: "_id", Value: sent[4].id}}, bson.D{{Key: "ts", Value: sent[4].ts}, {Key: "sensorId", Value: sent[4].sensor}, {Key: "value", Value: 0.5}}, options.FindOneAndReplace().SetReturnDocument(after))
		}, nil},
		{"update the latest of a series (sort), after", func(c *mongo.Collection) *mongo.SingleResult {
			return c.FindOneAndUpdate(ctx, bson.D{{Key: "sensorId", Value: "sensor-01"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "value", Value: -9.0}}}},
				options.FindOneAndUpdate().SetSort(bson.D{{Key: "ts", Value: -1}}).SetReturnDocument(after))
		}, nil},
		{"delete the earliest (sort)", func(c *mongo.Collection) *mongo.SingleResult {
			return c.FindOneAndDelete(ctx, bson.D{{Key: "sensorId", Value: "sensor-02"}}, options.FindOneAndDelete().SetSort(bson.D{{Key: "ts", Value: 1}}))
		}, nil},
		{"delete", func(c *mongo.Collection) *mongo.SingleResult {
			return c.FindOneAndDelete(ctx, bson.D{{Key: "_id", Value: sent[6].id}})
		}, nil},
		{"no match", func(c *mongo.Collection) *mongo.SingleResult {
			return c.FindOneAndUpdate(ctx, bson.D{{Key: "sensorId", Value: "nobody"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "value", Value: 1.0}}}})
		}, nil},
		{"upsert, after", func(c *mongo.Collection) *mongo.SingleResult {
			return c.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: upsertID}, {Key: "sensorId", Value: "fresh"}, {Key: "ts", Value: delBase.Add(3 * time.Hour)}},
				bson.D{{Key: "$set", Value: bson.D{{Key: "value", Value: 3.0}}}}, options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(after))
		}, nil},
	}
	for _, c := range cases {
		var got, want bson.D
		gerr := c.run(buckets).Decode(&got)
		werr := c.run(plain).Decode(&want)
		if c.keep != nil && werr != nil && strings.Contains(werr.Error(), "NotImplemented") {
			want = nil
			var whole bson.D
			werr = plain.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: sent[2].id}}, bson.D{{Key: "$set", Value: bson.D{{Key: "value", Value: -2.0}}}},
				options.FindOneAndUpdate().SetReturnDocument(after)).Decode(&whole)
			for _, e := range whole {
				if slices.Contains(c.keep, e.Key) {
					want = append(want, e)
				}
			}
		}
		if fmt.Sprint(gerr) != fmt.Sprint(werr) || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%s: proxy %v (%v), plain %v (%v)", c.name, got, gerr, want, werr)
		}
	}
	delCompare(t, ctx, db, buckets, plain)
}

// TestUpdateMongosh: updateOne and updateMany from mongosh.
func TestUpdateMongosh(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db, p, buckets, _, _ := delLoad(t, ctx)
	out := runMongosh(t, p.URI(), strings.ReplaceAll(`
const sdb = connect(process.env.TSPROXY_URI + "DBNAME");
const c = sdb.readings;
const a = c.updateOne({sensorId: "ordered", value: 4}, {$set: {value: 44}});
const b = c.updateMany({sensorId: "sensor-00"}, {$set: {checked: true}});
print(JSON.stringify({a: [a.matchedCount, a.modifiedCount], b: [b.matchedCount, b.modifiedCount], v: c.findOne({sensorId: "ordered", value: 44}).value}));
`, "DBNAME", db))
	n, err := buckets.CountDocuments(ctx, bson.D{{Key: "sensorId", Value: "sensor-00"}})
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf(`{"a":[1,1],"b":[%d,%d],"v":44}`, n, n); !strings.Contains(out, want) {
		t.Fatalf("mongosh printed %q, want %s", out, want)
	}
	if m, _ := buckets.CountDocuments(ctx, bson.D{{Key: "checked", Value: true}}); m != n {
		t.Fatalf("%d events checked, want %d", m, n)
	}
}

// TestUpdateArrayFilters: $[] and $[<identifier>] with arrayFilters
// update the elements of events' arrays as MongoDB does (FerretDB v1.24
// refuses arrayFilters on a plain collection, so the expected documents
// are written here).
func TestUpdateArrayFilters(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: readingsRule(db, 10)})
	coll := connect(t, p.URI()).Database(db).Collection("readings")
	base := time.Date(2026, 7, 1, 0, 0, 0, 0, time.UTC)
	var docs []any
	for i := range 12 {
		docs = append(docs, bson.D{{Key: "_id", Value: int32(i)}, {Key: "ts", Value: base.Add(time.Duration(i) * time.Minute)}, {Key: "sensorId", Value: "s"},
			{Key: "probes", Value: bson.A{bson.D{{Key: "k", Value: "t"}, {Key: "v", Value: int32(i)}}, bson.D{{Key: "k", Value: "h"}, {Key: "v", Value: int32(2 * i)}}}},
			{Key: "flags", Value: bson.A{int32(1), int32(2)}}})
	}
	if _, err := coll.InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}
	res, err := coll.UpdateMany(ctx, bson.D{{Key: "ts", Value: bson.D{{Key: "$lt", Value: base.Add(6 * time.Minute)}}}},
		bson.D{{Key: "$mul", Value: bson.D{{Key: "probes.$[p].v", Value: int32(100)}}}, {Key: "$inc", Value: bson.D{{Key: "flags.$[]", Value: int32(10)}}}},
		options.UpdateMany().SetArrayFilters([]any{bson.D{{Key: "p.k", Value: "h"}}}))
	if err != nil || res.MatchedCount != 6 || res.ModifiedCount != 6 {
		t.Fatalf("updateMany with arrayFilters: %+v, %v", res, err)
	}
	cur, err := coll.Find(ctx, bson.D{}, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		t.Fatal(err)
	}
	var got []bson.D
	if err := cur.All(ctx, &got); err != nil {
		t.Fatal(err)
	}
	for i, d := range got {
		h, flag := int32(2*i), int32(1)
		if i < 6 {
			h, flag = 200*int32(i), 11
		}
		want := bson.D{{Key: "_id", Value: int32(i)}, {Key: "ts", Value: bson.NewDateTimeFromTime(base.Add(time.Duration(i) * time.Minute))}, {Key: "sensorId", Value: "s"},
			{Key: "probes", Value: bson.A{bson.D{{Key: "k", Value: "t"}, {Key: "v", Value: int32(i)}}, bson.D{{Key: "k", Value: "h"}, {Key: "v", Value: h}}}},
			{Key: "flags", Value: bson.A{flag, flag + 1}}}
		if fmt.Sprint(d) != fmt.Sprint(want) {
			t.Fatalf("event %d: %v, want %v", i, d, want)
		}
	}
}
