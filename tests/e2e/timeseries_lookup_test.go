package e2e

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// joinFixture is a database with a plain collection of sensors and a
// time-series collection of their readings ({t, m: {sensor}, v, seq,
// nextSeq}): s1 has 10 readings (v 0..9, seq 0..9), s2 5 (v 100..104,
// seq 100..104), s3 none. Some are inserted one at a time (staged), some
// in one batch.
func joinFixture(t *testing.T) (*mongo.Database, context.Context) {
	t.Helper()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	c := connect(t, startProxy(t, proxyOptions{}).URI())
	dropAtEnd(t, c, db)
	d := c.Database(db)
	ts := options.TimeSeries().SetTimeField("t").SetMetaField("m")
	if err := d.CreateCollection(ctx, "readings", options.CreateCollection().SetTimeSeriesOptions(ts)); err != nil {
		t.Fatalf("create readings: %v", err)
	}
	base := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	var batch []any
	for i := 0; i < 10; i++ {
		batch = append(batch, bson.D{{Key: "t", Value: base.Add(time.Duration(i) * time.Minute)}, {Key: "m", Value: bson.D{{Key: "sensor", Value: "s1"}}},
			{Key: "v", Value: int32(i)}, {Key: "seq", Value: int32(i)}, {Key: "nextSeq", Value: int32(i + 1)}})
	}
	if _, err := d.Collection("readings").InsertMany(ctx, batch); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		doc := bson.D{{Key: "t", Value: base.Add(time.Duration(i) * time.Minute)}, {Key: "m", Value: bson.D{{Key: "sensor", Value: "s2"}}},
			{Key: "v", Value: int32(100 + i)}, {Key: "seq", Value: int32(100 + i)}, {Key: "nextSeq", Value: int32(101 + i)}}
		if _, err := d.Collection("readings").InsertOne(ctx, doc); err != nil {
			t.Fatal(err)
		}
	}
	sensors := []any{
		bson.D{{Key: "_id", Value: "s1"}, {Key: "room", Value: "a"}, {Key: "first", Value: int32(0)}},
		bson.D{{Key: "_id", Value: "s2"}, {Key: "room", Value: "b"}, {Key: "first", Value: int32(100)}},
		bson.D{{Key: "_id", Value: "s3"}, {Key: "room", Value: "a"}},
	}
	if _, err := d.Collection("sensors").InsertMany(ctx, sensors); err != nil {
		t.Fatal(err)
	}
	return d, ctx
}

func aggregateM(t *testing.T, ctx context.Context, coll *mongo.Collection, pipeline bson.A) []doc {
	t.Helper()
	cur, err := coll.Aggregate(ctx, pipeline)
	if err != nil {
		t.Fatalf("aggregate %v: %v", pipeline, err)
	}
	var docs []bson.D
	if err := cur.All(ctx, &docs); err != nil {
		t.Fatalf("aggregate %v: %v", pipeline, err)
	}
	out := make([]doc, len(docs))
	for i, d := range docs {
		out[i] = toM(d).(doc)
	}
	return out
}

// doc is a result document as a map: printed in key order.
type doc = map[string]any

// toM is v with its documents as maps, at every depth (printed in key
// order, so compared whatever the order of their fields).
func toM(v any) any {
	switch x := v.(type) {
	case bson.D:
		m := doc{}
		for _, e := range x {
			m[e.Key] = toM(e.Value)
		}
		return m
	case bson.A:
		out := make(bson.A, len(x))
		for i, el := range x {
			out[i] = toM(el)
		}
		return out
	}
	return v
}

// ints are the int32 values of field in docs (an array of documents), sorted.
func ints(t *testing.T, docs any, field string) []int32 {
	t.Helper()
	arr, _ := docs.(bson.A)
	var out []int32
	for _, d := range arr {
		m, ok := d.(doc)
		if !ok {
			t.Fatalf("%v: not documents", docs)
		}
		n, ok := m[field].(int32)
		if !ok {
			t.Fatalf("%v: %s is %T", m, field, m[field])
		}
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

func seqOf(lo, hi int32) []int32 {
	var out []int32
	for i := lo; i < hi; i++ {
		out = append(out, i)
	}
	return out
}

var bySensor = bson.D{{Key: "$sort", Value: bson.D{{Key: "_id", Value: 1}}}}

// A $lookup from a plain collection into a time-series one joins its
// events (answered from buckets, staged ones included), as MongoDB does:
// localField/foreignField, an uncorrelated pipeline, both together, and
// let variables.
func TestTimeseriesLookupFromPlain(t *testing.T) {
	t.Parallel()
	d, ctx := joinFixture(t)
	sensors := d.Collection("sensors")

	t.Run("localField/foreignField", func(t *testing.T) {
		got := aggregateM(t, ctx, sensors, bson.A{bySensor, bson.D{{Key: "$lookup", Value: bson.D{{Key: "from", Value: "readings"}, {Key: "localField", Value: "_id"}, {Key: "foreignField", Value: "m.sensor"}, {Key: "as", Value: "r"}}}}})
		want := map[string][]int32{"s1": seqOf(0, 10), "s2": seqOf(100, 105), "s3": nil}
		if len(got) != 3 {
			t.Fatalf("%d sensors: %v", len(got), got)
		}
		for _, s := range got {
			id := s["_id"].(string)
			if v := ints(t, s["r"], "v"); fmt.Sprint(v) != fmt.Sprint(want[id]) {
				t.Errorf("%s: joined v %v, want %v", id, v, want[id])
			}
			for _, ev := range s["r"].(bson.A) {
				m := ev.(doc)
				if meta, _ := m["m"].(doc); meta["sensor"] != id {
					t.Errorf("%s joined %v", id, m)
				}
				if _, ok := m["t"].(bson.DateTime); !ok {
					t.Errorf("%s: event without its time: %v", id, m)
				}
			}
		}
	})
	t.Run("uncorrelated pipeline", func(t *testing.T) {
		got := aggregateM(t, ctx, sensors, bson.A{bySensor, bson.D{{Key: "$lookup", Value: bson.D{{Key: "from", Value: "readings"},
			{Key: "pipeline", Value: bson.A{bson.D{{Key: "$match", Value: bson.D{{Key: "v", Value: bson.D{{Key: "$gte", Value: 8}}}}}}, bson.D{{Key: "$sort", Value: bson.D{{Key: "v", Value: 1}}}}, bson.D{{Key: "$project", Value: bson.D{{Key: "_id", Value: 0}, {Key: "v", Value: 1}}}}}},
			{Key: "as", Value: "hi"}}}}})
		for _, s := range got {
			if v := ints(t, s["hi"], "v"); fmt.Sprint(v) != "[8 9 100 101 102 103 104]" {
				t.Errorf("%v: %v", s["_id"], v)
			}
		}
		if len(got) != 3 {
			t.Fatalf("%d sensors", len(got))
		}
	})
	t.Run("localField/foreignField with a pipeline", func(t *testing.T) {
		got := aggregateM(t, ctx, sensors, bson.A{bySensor, bson.D{{Key: "$lookup", Value: bson.D{{Key: "from", Value: "readings"}, {Key: "localField", Value: "_id"}, {Key: "foreignField", Value: "m.sensor"},
			{Key: "pipeline", Value: bson.A{bson.D{{Key: "$match", Value: bson.D{{Key: "v", Value: bson.D{{Key: "$gt", Value: 2}}}}}}, bson.D{{Key: "$count", Value: "n"}}}},
			{Key: "as", Value: "c"}}}}, bson.D{{Key: "$project", Value: bson.D{{Key: "c", Value: 1}}}}})
		want := "[map[_id:s1 c:[map[n:7]]] map[_id:s2 c:[map[n:5]]] map[_id:s3 c:[]]]"
		if fmt.Sprint(got) != want {
			t.Errorf("got %v, want %v", got, want)
		}
	})
	t.Run("let", func(t *testing.T) {
		got := aggregateM(t, ctx, sensors, bson.A{bySensor, bson.D{{Key: "$lookup", Value: bson.D{{Key: "from", Value: "readings"}, {Key: "let", Value: bson.D{{Key: "room", Value: "$room"}}},
			{Key: "pipeline", Value: bson.A{bson.D{{Key: "$match", Value: bson.D{{Key: "m.sensor", Value: "s2"}}}}, bson.D{{Key: "$sort", Value: bson.D{{Key: "v", Value: -1}}}}, bson.D{{Key: "$limit", Value: 1}},
				bson.D{{Key: "$project", Value: bson.D{{Key: "_id", Value: 0}, {Key: "v", Value: 1}, {Key: "room", Value: "$$room"}}}}}},
			{Key: "as", Value: "last"}}}}, bson.D{{Key: "$project", Value: bson.D{{Key: "last", Value: 1}}}}})
		want := "[map[_id:s1 last:[map[room:a v:104]]] map[_id:s2 last:[map[room:b v:104]]] map[_id:s3 last:[map[room:a v:104]]]]"
		if fmt.Sprint(got) != want {
			t.Errorf("got %v, want %v", got, want)
		}
	})
	t.Run("events inserted after the first join", func(t *testing.T) {
		ev := bson.D{{Key: "t", Value: time.Date(2024, 1, 2, 0, 0, 0, 0, time.UTC)}, {Key: "m", Value: bson.D{{Key: "sensor", Value: "s3"}}}, {Key: "v", Value: int32(7)}}
		if _, err := d.Collection("readings").InsertOne(ctx, ev); err != nil {
			t.Fatal(err)
		}
		got := aggregateM(t, ctx, sensors, bson.A{bson.D{{Key: "$match", Value: bson.D{{Key: "_id", Value: "s3"}}}}, bson.D{{Key: "$lookup", Value: bson.D{{Key: "from", Value: "readings"}, {Key: "localField", Value: "_id"}, {Key: "foreignField", Value: "m.sensor"}, {Key: "as", Value: "r"}}}}})
		if len(got) != 1 || fmt.Sprint(ints(t, got[0]["r"], "v")) != "[7]" {
			t.Errorf("got %v, want s3 with its one event", got)
		}
		if _, err := d.Collection("readings").DeleteMany(ctx, bson.D{{Key: "m.sensor", Value: "s3"}}); err != nil {
			t.Fatal(err)
		}
	})
}

// A $graphLookup from a plain collection walks a time-series one: each
// depth one read of its events, maxDepth, depthField and
// restrictSearchWithMatch as MongoDB's.
func TestTimeseriesGraphLookupFromPlain(t *testing.T) {
	t.Parallel()
	d, ctx := joinFixture(t)
	gl := func(extra ...bson.E) bson.A {
		spec := bson.D{{Key: "from", Value: "readings"}, {Key: "startWith", Value: "$first"}, {Key: "connectFromField", Value: "nextSeq"}, {Key: "connectToField", Value: "seq"}, {Key: "as", Value: "chain"}}
		return bson.A{bySensor, bson.D{{Key: "$graphLookup", Value: append(spec, extra...)}}}
	}
	got := aggregateM(t, ctx, d.Collection("sensors"), gl())
	want := map[string]string{"s1": fmt.Sprint(seqOf(0, 10)), "s2": fmt.Sprint(seqOf(100, 105)), "s3": "[]"}
	for _, s := range got {
		if v := fmt.Sprint(ints(t, s["chain"], "seq")); v != want[s["_id"].(string)] {
			t.Errorf("%v: chain %v, want %v", s["_id"], v, want[s["_id"].(string)])
		}
	}
	got = aggregateM(t, ctx, d.Collection("sensors"), gl(bson.E{Key: "maxDepth", Value: 3}, bson.E{Key: "depthField", Value: "d"}, bson.E{Key: "restrictSearchWithMatch", Value: bson.D{{Key: "m.sensor", Value: "s1"}}}))
	if len(got) != 3 {
		t.Fatalf("%d sensors", len(got))
	}
	chain, _ := got[0]["chain"].(bson.A)
	var pairs []string
	for _, e := range chain {
		m := e.(doc)
		pairs = append(pairs, fmt.Sprintf("%v@%v:%T", m["seq"], m["d"], m["d"]))
	}
	slices.Sort(pairs)
	if w := "[0@0:int64 1@1:int64 2@2:int64 3@3:int64]"; fmt.Sprint(pairs) != w {
		t.Errorf("s1 to depth 3: %v, want %v", pairs, w)
	}
	if c, _ := got[1]["chain"].(bson.A); len(c) != 0 {
		t.Errorf("s2 restricted to s1's events: %v, want none", c)
	}
}

// $unionWith from a plain collection adds a time-series collection's
// events after the plain documents.
func TestTimeseriesUnionWithFromPlain(t *testing.T) {
	t.Parallel()
	d, ctx := joinFixture(t)
	sensors := d.Collection("sensors")
	got := aggregateM(t, ctx, sensors, bson.A{bson.D{{Key: "$unionWith", Value: bson.D{{Key: "coll", Value: "readings"}, {Key: "pipeline", Value: bson.A{bson.D{{Key: "$match", Value: bson.D{{Key: "m.sensor", Value: "s2"}}}}, bson.D{{Key: "$project", Value: bson.D{{Key: "_id", Value: 0}, {Key: "v", Value: 1}}}}}}}}}})
	if len(got) != 8 {
		t.Fatalf("%d documents, want 3 sensors and 5 events: %v", len(got), got)
	}
	for i, doc := range got {
		if _, sensor := doc["room"]; sensor != (i < 3) {
			t.Errorf("document %d: %v: the sensors come first", i, doc)
		}
	}
	got = aggregateM(t, ctx, sensors, bson.A{bson.D{{Key: "$match", Value: bson.D{{Key: "_id", Value: "s3"}}}}, bson.D{{Key: "$unionWith", Value: "readings"}}, bson.D{{Key: "$count", Value: "n"}}})
	if fmt.Sprint(got) != "[map[n:16]]" {
		t.Errorf("s3 and every event: %v, want n 16", got)
	}
}

// What still cannot work is refused with an error naming it: writing a
// plain collection's pipeline into a time-series collection.
func TestTimeseriesLookupRefusals(t *testing.T) {
	t.Parallel()
	if env.external {
		t.Skip("MongoDB answers its own errors")
	}
	d, ctx := joinFixture(t)
	sensors := d.Collection("sensors")
	lookup := bson.D{{Key: "$lookup", Value: bson.D{{Key: "from", Value: "readings"}, {Key: "localField", Value: "_id"}, {Key: "foreignField", Value: "m.sensor"}, {Key: "as", Value: "r"}}}}
	for _, c := range []struct {
		pipeline bson.A
		want     string
	}{
		{bson.A{lookup, bson.D{{Key: "$out", Value: "readings"}}}, "bucketed namespace"},
		{bson.A{bson.D{{Key: "$merge", Value: bson.D{{Key: "into", Value: "readings"}}}}}, "bucketed namespace"},
	} {
		_, err := sensors.Aggregate(ctx, c.pipeline)
		var ce mongo.CommandError
		if err == nil || !strings.Contains(err.Error(), c.want) || !errors.As(err, &ce) || ce.Code != 238 {
			t.Errorf("%v: %v, want NotImplemented naming %s", c.pipeline, err, c.want)
		}
	}
	_, err := sensors.Aggregate(ctx, bson.A{lookup}, options.Aggregate().SetCollation(&options.Collation{Locale: "fr"}))
	if err == nil || !strings.Contains(err.Error(), "collation") {
		t.Errorf("a join with a collation: %v, want a refusal naming it", err)
	}
}
