package e2e

import (
	"fmt"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/tsproxy/tsproxy/proxy"
)

// TestLatestOfSeries: the reads of one series that bound time on one
// side or not at all (its latest reading, its first, the latest before a
// time, a few series' latest) answer what a plain collection answers, in
// every state the series entries of the event-id index go through: after
// merges, with events staged, after a delete of the latest windows, for
// a series with one event at each end of a day and for one that has
// none. On the embedded upstream, where those reads look up the series'
// windows by _id, the latest reading costs the upstream a small part of
// what the whole series does (bytes the upstream sent, through a relay).
func TestLatestOfSeries(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	rl := newRelay(t, upstreamAddr(t))
	p := startProxy(t, proxyOptions{yaml: readingsRule(db, 20), upstreamURI: rl.URI(), edit: func(o *proxy.Options) {
		if env.emb != nil {
			o.IndexIDs = env.emb.IndexIDs // as on the embedded upstream itself
		}
	}})
	coll := connect(t, p.URI()).Database(db).Collection("readings")
	plain := direct(t).Database(db).Collection("plain")
	base := time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC)
	var docs []any
	for i, s := range []string{"a", "b", "c"} {
		every, n := 10*time.Minute, 180 // 30 hours
		if s == "b" {
			every, n = 30*time.Minute, 400 // 200 hours: many more windows than one read's lookups
		}
		for j := range n { // series apart by seconds
			docs = append(docs, bson.D{{Key: "_id", Value: bson.NewObjectID()}, {Key: "ts", Value: base.Add(time.Duration(j)*every + time.Duration(i)*time.Second)},
				{Key: "sensorId", Value: s}, {Key: "value", Value: float64(j)}})
		}
	}
	for _, at := range []time.Duration{0, 29 * time.Hour} {
		docs = append(docs, bson.D{{Key: "_id", Value: bson.NewObjectID()}, {Key: "ts", Value: base.Add(at + 5*time.Second)}, {Key: "sensorId", Value: "sparse"}, {Key: "value", Value: 1.0}})
	}
	insertBoth := func(docs []any) {
		t.Helper()
		for i := 0; i < len(docs); i += 50 {
			batch := docs[i:min(i+50, len(docs))]
			if _, err := coll.InsertMany(ctx, batch); err != nil {
				t.Fatal(err)
			}
			if _, err := plain.InsertMany(ctx, batch); err != nil {
				t.Fatal(err)
			}
		}
	}
	insertBoth(docs)
	flush(t, ctx, coll.Database().Client(), 1)

	desc := options.Find().SetSort(bson.D{{Key: "ts", Value: -1}})
	asc := options.Find().SetSort(bson.D{{Key: "ts", Value: 1}})
	check := func(when string) {
		t.Helper()
		for _, q := range []struct {
			what   string
			filter bson.D
			opts   *options.FindOptionsBuilder
		}{
			{"latest of a", bson.D{{Key: "sensorId", Value: "a"}}, desc.SetLimit(1)},
			{"latest 25 of b", bson.D{{Key: "sensorId", Value: "b"}}, options.Find().SetSort(bson.D{{Key: "ts", Value: -1}}).SetLimit(25)},
			{"first 3 of c", bson.D{{Key: "sensorId", Value: "c"}}, asc.SetLimit(3)},
			{"latest of sparse", bson.D{{Key: "sensorId", Value: "sparse"}}, options.Find().SetSort(bson.D{{Key: "ts", Value: -1}}).SetLimit(1)},
			{"latest of a series with none", bson.D{{Key: "sensorId", Value: "none"}}, options.Find().SetSort(bson.D{{Key: "ts", Value: -1}}).SetLimit(1)},
			{"latest of a before noon", bson.D{{Key: "sensorId", Value: "a"}, {Key: "ts", Value: bson.D{{Key: "$lt", Value: base.Add(12 * time.Hour)}}}}, options.Find().SetSort(bson.D{{Key: "ts", Value: -1}}).SetLimit(2)},
			{"a since the evening", bson.D{{Key: "sensorId", Value: "a"}, {Key: "ts", Value: bson.D{{Key: "$gte", Value: base.Add(20 * time.Hour)}}}}, options.Find().SetSort(bson.D{{Key: "ts", Value: 1}})},
			{"latest 4 of b, c and sparse", bson.D{{Key: "sensorId", Value: bson.D{{Key: "$in", Value: bson.A{"b", "c", "sparse"}}}}}, options.Find().SetSort(bson.D{{Key: "ts", Value: -1}}).SetLimit(4)},
			{"all of sparse", bson.D{{Key: "sensorId", Value: "sparse"}}, options.Find().SetSort(bson.D{{Key: "ts", Value: 1}})},
		} {
			got, want := findAll(t, ctx, coll, q.filter, q.opts), findAll(t, ctx, plain, q.filter, q.opts)
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("%s, %s: proxy %v\nplain %v", when, q.what, got, want)
			}
		}
	}
	check("merged")

	// Events staged, of a later window and of a new series: the read
	// merges them first, and their series entries widen.
	late := []any{
		bson.D{{Key: "_id", Value: bson.NewObjectID()}, {Key: "ts", Value: base.Add(40 * time.Hour)}, {Key: "sensorId", Value: "a"}, {Key: "value", Value: -1.0}},
		bson.D{{Key: "_id", Value: bson.NewObjectID()}, {Key: "ts", Value: base.Add(3 * time.Hour)}, {Key: "sensorId", Value: "new"}, {Key: "value", Value: -2.0}},
	}
	insertBoth(late)
	check("staged")
	var got bson.D
	if err := coll.FindOne(ctx, bson.D{{Key: "sensorId", Value: "new"}}, options.FindOne().SetSort(bson.D{{Key: "ts", Value: -1}})).Decode(&got); err != nil {
		t.Fatalf("latest of a new series: %v", err)
	}

	// A delete of a's latest windows leaves its entry wider than its
	// buckets: the read looks up windows that are gone, and finds the
	// latest left.
	cut := bson.D{{Key: "sensorId", Value: "a"}, {Key: "ts", Value: bson.D{{Key: "$gte", Value: base.Add(18 * time.Hour)}}}}
	if _, err := coll.DeleteMany(ctx, cut); err != nil {
		t.Fatal(err)
	}
	if _, err := plain.DeleteMany(ctx, cut); err != nil {
		t.Fatal(err)
	}
	check("after a delete")

	if env.emb == nil || env.external {
		return // the lookups are only where _id is indexed (embedded) and events packed
	}
	cost := func(filter bson.D, opts *options.FindOptionsBuilder) int64 {
		before := rl.down.Load()
		findAll(t, ctx, coll, filter, opts)
		return rl.down.Load() - before
	}
	series := bson.D{{Key: "sensorId", Value: "b"}}
	latest := cost(series, options.Find().SetSort(bson.D{{Key: "ts", Value: -1}}).SetLimit(1))
	whole := cost(series, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	if latest*5 > whole {
		t.Fatalf("the latest event of a series cost the upstream %d bytes, the whole series %d: want under a fifth", latest, whole)
	}
	t.Logf("upstream bytes: latest event %d, whole series %d", latest, whole)
}
