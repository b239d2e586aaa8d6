package e2e

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/tsproxy/tsproxy/tests/backend"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// The differential read test: the same events written once directly into
// a plain collection (db.plain) and once through the proxy into buckets
// (db.readings), then the same queries against both must give the same
// documents (in order when sorted).

const rdEvents = 50_000

var rdBase = time.Date(2024, 3, 1, 0, 0, 0, 0, time.UTC)

func rdRule(db string) string {
	return fmt.Sprintf(`rules:
  - namespace: %s.readings
    timeField: ts
    metaField: sensor
    bucket:
      span: 1h
      maxEvents: 200
    aggregates: [value]
`, db)
}

// rdSeries are the metas of the series: strings, numbers, documents, no
// meta at all (nil) and an explicit null. The documents' fields are in
// sorted order: a time-series collection sorts them at insert (MongoDB's
// normalization), the plain collection compared with it does not.
var rdSeries = []any{
	"s-a", "s-b", "s-c", "s-d",
	int32(7), int32(8), 9.5,
	bson.D{{Key: "n", Value: int32(1)}, {Key: "site", Value: "north"}},
	bson.D{{Key: "n", Value: int32(2)}, {Key: "site", Value: "north"}},
	bson.D{{Key: "n", Value: int32(1)}, {Key: "site", Value: "south"}},
	"<none>", "<null>",
}

// rdGen makes the events, sorted by series then time (so each insert batch
// holds whole windows), deterministic for a seed. It also returns a few
// timestamps that sit exactly on an hour boundary.
func rdGen() ([]bson.D, []time.Time) {
	rng := rand.New(rand.NewSource(42))
	var out []bson.D
	var edges []time.Time
	statuses := []string{"ok", "warn", "err"}
	i := 0
	mk := func(series any, ts time.Time) bson.D {
		d := bson.D{{Key: "_id", Value: bson.NewObjectID()}}
		meta := bson.E{Key: "sensor", Value: series}
		hasMeta := series != "<none>"
		if series == "<null>" {
			meta.Value = nil
		}
		if hasMeta && i%3 == 1 {
			d = append(d, meta)
		}
		d = append(d, bson.E{Key: "ts", Value: bson.NewDateTimeFromTime(ts)})
		if hasMeta && i%3 == 0 {
			d = append(d, meta)
		}
		switch i % 3 {
		case 0:
			d = append(d, bson.E{Key: "value", Value: int32(i % 100)})
		case 1:
			d = append(d, bson.E{Key: "value", Value: int64(i % 1000)})
		default:
			d = append(d, bson.E{Key: "value", Value: float64(i%100) + 0.5})
		}
		d = append(d, bson.E{Key: "temp", Value: 20 + float64(rng.Intn(100))/10})
		if i%5 != 0 {
			d = append(d, bson.E{Key: "status", Value: statuses[rng.Intn(3)]})
		}
		if i%7 == 0 {
			d = append(d, bson.E{Key: "tags", Value: bson.A{"a", []string{"b", "c"}[rng.Intn(2)]}})
		}
		if i%4 == 0 {
			d = append(d, bson.E{Key: "loc", Value: bson.D{{Key: "x", Value: int32(i % 10)}, {Key: "y", Value: "p"}}})
		}
		if hasMeta && i%3 == 2 {
			d = append(d, meta)
		}
		i++
		return d
	}
	// 100 events around the epoch, in a series of their own.
	old := time.Date(1969, 12, 31, 23, 10, 0, 0, time.UTC)
	for k := 0; k < 100; k++ {
		out = append(out, mk("s-old", old.Add(time.Duration(k)*67*time.Second)))
	}
	per := (rdEvents - 100) / len(rdSeries)
	for si, s := range rdSeries {
		n := per
		if si == len(rdSeries)-1 {
			n = rdEvents - 100 - per*(len(rdSeries)-1)
		}
		ts := rdBase.Add(time.Duration(rng.Intn(30)) * time.Second)
		for k := 0; k < n; k++ {
			if k%40 == 39 { // snap to the next hour boundary: bucket edges
				ts = ts.Truncate(time.Hour).Add(time.Hour)
				if len(edges) < 6 {
					edges = append(edges, ts)
				}
			}
			out = append(out, mk(s, ts))
			ts = ts.Add(time.Duration(1+rng.Intn(123)) * time.Second)
		}
	}
	return out, edges
}

// rdInsert inserts with insertMany batches of about 5000 events that end
// on a window boundary of a series, so every (series, window) group of a
// batch is whole: the proxy writes each as one complete bucket.
func rdInsert(t *testing.T, coll *mongo.Collection, docs []bson.D) {
	t.Helper()
	ctx := ctxFor(t)
	const batch = 5000
	window := func(d bson.D) string {
		var s, w string
		for _, e := range d {
			switch e.Key {
			case "sensor":
				s = fmt.Sprint(e.Value)
			case "ts":
				w = e.Value.(bson.DateTime).Time().Truncate(time.Hour).String()
			}
		}
		return s + "|" + w
	}
	for i := 0; i < len(docs); {
		end := min(i+batch, len(docs))
		for end < len(docs) && window(docs[end]) == window(docs[end-1]) {
			end++
		}
		items := make([]any, 0, end-i)
		for _, d := range docs[i:end] {
			items = append(items, d)
		}
		if _, err := coll.InsertMany(ctx, items); err != nil {
			t.Fatalf("insert into %s: %v", coll.Name(), err)
		}
		i = end
	}
}

type rdQuery struct {
	name   string
	kind   string // find (default), count, countDocuments, estimated, distinct, aggregate
	filter bson.D
	sort   bson.D
	skip   int64
	limit  int64
	proj   bson.D
	batch  int32
	key    string // distinct
	pipe   bson.A // aggregate
	sorted bool   // order must match (a sort with a unique tie-break)
	// ferretErr: on the embedded FerretDB the proxy refuses the query with
	// this error (its $unwind drops the bucket's meta).
	ferretErr string
	min       int      // at least this many results (guards against vacuous passes)
	series    []string // unused; documentation
}

func dt(t time.Time) bson.DateTime { return bson.NewDateTimeFromTime(t) }

func rdQueries(edges []time.Time) []rdQuery {
	h := func(n int) bson.DateTime { return dt(rdBase.Add(time.Duration(n) * time.Hour)) }
	rng := func(a, b int) bson.E {
		return bson.E{Key: "ts", Value: bson.D{{Key: "$gte", Value: h(a)}, {Key: "$lt", Value: h(b)}}}
	}
	doc := func(es ...bson.E) bson.D { return bson.D(es) }
	byTsID := bson.D{{Key: "ts", Value: 1}, {Key: "_id", Value: 1}}
	edge := dt(edges[0])
	return []rdQuery{
		{name: "all", min: rdEvents},
		{name: "range one hour at bucket edges", filter: doc(rng(1, 2)), min: 10},
		{name: "range $gt edge $lte edge", filter: doc(bson.E{Key: "ts", Value: bson.D{{Key: "$gt", Value: h(5)}, {Key: "$lte", Value: h(8)}}}), min: 10},
		{name: "ts $eq exact edge", filter: doc(bson.E{Key: "ts", Value: bson.D{{Key: "$eq", Value: edge}}}), min: 1},
		{name: "ts bare date on edge", filter: doc(bson.E{Key: "ts", Value: edge}), min: 1},
		{name: "ts $gt exact edge", filter: doc(bson.E{Key: "ts", Value: bson.D{{Key: "$gt", Value: edge}}}, bson.E{Key: "sensor", Value: "s-a"}), min: 10},
		{name: "open-ended $gte", filter: doc(bson.E{Key: "ts", Value: bson.D{{Key: "$gte", Value: h(60)}}}), min: 10},
		{name: "open-ended $lt", filter: doc(bson.E{Key: "ts", Value: bson.D{{Key: "$lt", Value: h(2)}}}), min: 10},
		{name: "empty future range", filter: doc(rng(1000, 1001))},
		{name: "empty inverted range", filter: doc(bson.E{Key: "ts", Value: bson.D{{Key: "$gt", Value: h(10)}, {Key: "$lt", Value: h(9)}}})},
		{name: "$and of ranges", filter: doc(bson.E{Key: "$and", Value: bson.A{doc(bson.E{Key: "ts", Value: bson.D{{Key: "$gte", Value: h(3)}}}), doc(bson.E{Key: "ts", Value: bson.D{{Key: "$lt", Value: h(7)}}})}}), min: 10},
		{name: "ts $in", filter: doc(bson.E{Key: "ts", Value: bson.D{{Key: "$in", Value: bson.A{dt(edges[0]), dt(edges[1])}}}}), min: 1},
		{name: "around the epoch", filter: doc(bson.E{Key: "ts", Value: bson.D{{Key: "$gte", Value: dt(time.Date(1969, 12, 31, 23, 30, 0, 0, time.UTC))}, {Key: "$lt", Value: dt(time.Unix(600, 0))}}}), min: 10},
		{name: "meta string", filter: doc(bson.E{Key: "sensor", Value: "s-a"}), min: 100},
		{name: "meta number", filter: doc(bson.E{Key: "sensor", Value: int32(7)}), min: 100},
		{name: "meta double", filter: doc(bson.E{Key: "sensor", Value: 9.5}, rng(10, 20)), min: 10},
		{name: "meta $in mixed", filter: doc(bson.E{Key: "sensor", Value: bson.D{{Key: "$in", Value: bson.A{"s-b", int32(8)}}}}, rng(0, 12)), min: 10},
		{name: "meta document", filter: doc(bson.E{Key: "sensor", Value: bson.D{{Key: "n", Value: int32(1)}, {Key: "site", Value: "north"}}}), min: 100},
		{name: "meta dotted", filter: doc(bson.E{Key: "sensor.site", Value: "south"}, rng(20, 30)), min: 10},
		{name: "meta dotted $in", filter: doc(bson.E{Key: "sensor.n", Value: bson.D{{Key: "$in", Value: bson.A{int32(2)}}}}), min: 100},
		{name: "meta null", filter: doc(bson.E{Key: "sensor", Value: nil}, rng(0, 10)), min: 10},
		{name: "meta $exists false", filter: doc(bson.E{Key: "sensor", Value: bson.D{{Key: "$exists", Value: false}}}), min: 100},
		{name: "meta $exists true in range", filter: doc(bson.E{Key: "sensor", Value: bson.D{{Key: "$exists", Value: true}}}, rng(30, 31)), min: 10},
		{name: "meta $type string", filter: doc(bson.E{Key: "sensor", Value: bson.D{{Key: "$type", Value: "string"}}}, rng(40, 42)), min: 10},
		{name: "meta $ne", filter: doc(bson.E{Key: "sensor", Value: bson.D{{Key: "$ne", Value: "s-a"}}}, rng(40, 41)), min: 10},
		{name: "residual value $gt", filter: doc(rng(0, 24), bson.E{Key: "value", Value: bson.D{{Key: "$gt", Value: 50}}}), min: 10},
		{name: "residual status + meta $in", filter: doc(bson.E{Key: "status", Value: "warn"}, bson.E{Key: "sensor", Value: bson.D{{Key: "$in", Value: bson.A{"s-c", "s-d"}}}}), min: 10},
		{name: "$or", filter: doc(rng(10, 14), bson.E{Key: "$or", Value: bson.A{doc(bson.E{Key: "status", Value: "err"}), doc(bson.E{Key: "value", Value: bson.D{{Key: "$lt", Value: 3}}})}}), min: 10},
		{name: "$nor", filter: doc(rng(14, 15), bson.E{Key: "$nor", Value: bson.A{doc(bson.E{Key: "status", Value: "ok"})}}), min: 10},
		{name: "$not regex", filter: doc(rng(15, 17), bson.E{Key: "status", Value: bson.D{{Key: "$not", Value: bson.Regex{Pattern: "^o"}}}}), min: 10},
		{name: "array element", filter: doc(bson.E{Key: "tags", Value: "c"}, rng(0, 30)), min: 10},
		{name: "$all", filter: doc(bson.E{Key: "tags", Value: bson.D{{Key: "$all", Value: bson.A{"a", "b"}}}}), min: 10},
		{name: "nested field", filter: doc(bson.E{Key: "loc.x", Value: int32(4)}, rng(0, 30)), min: 10},
		{name: "$exists on field", filter: doc(bson.E{Key: "status", Value: bson.D{{Key: "$exists", Value: false}}}, rng(50, 52)), min: 10},
		{name: "sort ts asc one series", filter: doc(bson.E{Key: "sensor", Value: "s-b"}), sort: bson.D{{Key: "ts", Value: 1}}, limit: 300, sorted: true, min: 300},
		{name: "sort ts desc skip limit", filter: doc(bson.E{Key: "sensor", Value: "s-c"}), sort: bson.D{{Key: "ts", Value: -1}}, skip: 10, limit: 50, sorted: true, min: 50},
		{name: "sort ts,_id range", filter: doc(rng(20, 26)), sort: byTsID, sorted: true, min: 100},
		{name: "sort value desc", filter: doc(rng(0, 6)), sort: bson.D{{Key: "value", Value: -1}, {Key: "_id", Value: 1}}, limit: 200, sorted: true, min: 200},
		{name: "sort by meta", filter: doc(rng(30, 32)), sort: bson.D{{Key: "sensor", Value: 1}, {Key: "ts", Value: -1}, {Key: "_id", Value: 1}}, sorted: true, min: 100},
		// Sorts naming the metaField, and the metaField inside $or: on
		// FerretDB, whose $unwind drops the bucket's meta, the proxy runs
		// them itself on whole buckets (an event scan). Named "scan: ...",
		// they run in CI on every upstream (scripts/test.sh).
		{name: "scan: sort ts then meta", filter: doc(rng(30, 31)), sort: bson.D{{Key: "ts", Value: 1}, {Key: "sensor", Value: 1}, {Key: "_id", Value: 1}}, sorted: true, min: 100},
		{name: "scan: sort meta desc ts desc $in", filter: doc(bson.E{Key: "sensor", Value: bson.D{{Key: "$in", Value: bson.A{"s-a", "s-c"}}}}, rng(0, 10)), sort: bson.D{{Key: "sensor", Value: -1}, {Key: "ts", Value: -1}}, sorted: true, min: 100},
		{name: "scan: sort meta subfield", filter: doc(rng(40, 41)), sort: bson.D{{Key: "sensor.site", Value: 1}, {Key: "ts", Value: 1}, {Key: "_id", Value: 1}}, sorted: true, min: 100},
		{name: "scan: latest of each series", sort: bson.D{{Key: "sensor", Value: 1}, {Key: "ts", Value: -1}, {Key: "_id", Value: 1}}, limit: 50, sorted: true, min: 50},
		{name: "scan: sort meta skip limit batches", filter: doc(rng(12, 20)), sort: bson.D{{Key: "sensor", Value: 1}, {Key: "ts", Value: 1}, {Key: "_id", Value: 1}}, skip: 33, limit: 400, batch: 50, sorted: true, min: 400},
		{name: "scan: $or with meta", filter: doc(rng(10, 12), bson.E{Key: "$or", Value: bson.A{doc(bson.E{Key: "sensor", Value: "s-a"}), doc(bson.E{Key: "status", Value: "err"})}}), sort: byTsID, sorted: true, min: 10},
		{name: "scan: $or of metas", filter: doc(bson.E{Key: "$or", Value: bson.A{doc(bson.E{Key: "sensor", Value: "s-b"}), doc(bson.E{Key: "sensor", Value: int32(7)})}}), sort: byTsID, limit: 300, sorted: true, min: 300},
		{name: "scan: $nor with meta subfield", filter: doc(rng(50, 51), bson.E{Key: "$nor", Value: bson.A{doc(bson.E{Key: "sensor.site", Value: "north"})}}), sort: byTsID, sorted: true, min: 10},
		{name: "skip only sorted", filter: doc(rng(33, 34)), sort: byTsID, skip: 17, sorted: true, min: 10},
		{name: "projection inclusion", filter: doc(rng(2, 4)), proj: bson.D{{Key: "ts", Value: 1}, {Key: "value", Value: 1}}, min: 10},
		{name: "projection exclusion", filter: doc(rng(4, 6)), proj: bson.D{{Key: "tags", Value: 0}, {Key: "loc", Value: 0}, {Key: "sensor", Value: 0}}, min: 10},
		{name: "projection _id 0 with meta", filter: doc(rng(6, 8)), sort: byTsID, proj: bson.D{{Key: "_id", Value: 0}, {Key: "sensor", Value: 1}, {Key: "ts", Value: 1}}, min: 10},
		{name: "projection dotted", filter: doc(rng(8, 10)), proj: bson.D{{Key: "loc.x", Value: 1}, {Key: "sensor.site", Value: 1}}, min: 10},
		{name: "batchSize forces getMores", filter: doc(rng(0, 24), bson.E{Key: "sensor", Value: "s-d"}), sort: bson.D{{Key: "ts", Value: 1}}, batch: 7, sorted: true, min: 100},
		{name: "negative limit single batch", filter: doc(bson.E{Key: "sensor", Value: "s-a"}), sort: bson.D{{Key: "ts", Value: 1}}, limit: -5, sorted: true, min: 5},
		// Point reads: the meta fixed and the time bounded, so the proxy
		// names the buckets and looks them up by _id (maxEvents 200 here:
		// windows have several seqs).
		{name: "point one series ts,_id", filter: doc(bson.E{Key: "sensor", Value: "s-a"}, rng(3, 30)), sort: byTsID, sorted: true, min: 200},
		{name: "point $in desc skip limit", filter: doc(bson.E{Key: "sensor", Value: bson.D{{Key: "$in", Value: bson.A{"s-c", "s-b"}}}}, rng(0, 48)), sort: bson.D{{Key: "ts", Value: -1}, {Key: "_id", Value: 1}}, skip: 5, limit: 500, sorted: true, min: 500},
		{name: "point null meta sorted", filter: doc(bson.E{Key: "sensor", Value: nil}, rng(0, 20)), sort: byTsID, sorted: true, min: 10},
		{name: "point unsorted batchSize 3", filter: doc(bson.E{Key: "sensor", Value: "s-d"}, rng(5, 9)), batch: 3, min: 10},
		{name: "point $gt $lte edges desc", filter: doc(bson.E{Key: "sensor", Value: "s-a"}, bson.E{Key: "ts", Value: bson.D{{Key: "$gt", Value: h(5)}, {Key: "$lte", Value: h(8)}}}), sort: bson.D{{Key: "ts", Value: -1}}, sorted: true, min: 10},
		{name: "point projection", filter: doc(bson.E{Key: "sensor", Value: "s-b"}, rng(1, 3)), sort: bson.D{{Key: "ts", Value: 1}}, proj: bson.D{{Key: "_id", Value: 0}, {Key: "sensor", Value: 1}, {Key: "value", Value: 1}}, sorted: true, min: 10},
		{name: "point exact edge", filter: doc(bson.E{Key: "sensor", Value: bson.D{{Key: "$in", Value: bson.A{"s-a", "s-b", "s-c", "s-d", nil}}}}, bson.E{Key: "ts", Value: edge}), min: 1},
		{name: "point with a measurement, desc skip limit", filter: doc(bson.E{Key: "sensor", Value: bson.D{{Key: "$in", Value: bson.A{"s-a", "s-c"}}}}, rng(0, 48), bson.E{Key: "value", Value: bson.D{{Key: "$gte", Value: 90}}}), sort: bson.D{{Key: "ts", Value: -1}, {Key: "_id", Value: 1}}, skip: 3, limit: 40, sorted: true, min: 40},
		{name: "point with a measurement, ts asc", filter: doc(bson.E{Key: "sensor", Value: "s-b"}, rng(2, 30), bson.E{Key: "value", Value: bson.D{{Key: "$lt", Value: 5}}}, bson.E{Key: "status", Value: "ok"}), sort: bson.D{{Key: "ts", Value: 1}}, sorted: true, min: 3},
		{name: "point with a measurement, unsorted", filter: doc(bson.E{Key: "sensor", Value: "s-d"}, rng(0, 100), bson.E{Key: "value", Value: bson.D{{Key: "$in", Value: bson.A{7, int64(507), 7.5}}}}), min: 1},
		{name: "point large unsorted", filter: doc(bson.E{Key: "sensor", Value: bson.D{{Key: "$in", Value: bson.A{"s-a", "s-b"}}}}, rng(0, 1000)), min: 1000},
		// Scans: a time range only, over every series, so the proxy
		// reads the buckets with one find sorted by start and orders each
		// window's events itself.
		{name: "scan whole range asc", filter: doc(bson.E{Key: "ts", Value: bson.D{{Key: "$gte", Value: dt(time.Unix(-86400, 0))}}}), sort: byTsID, sorted: true, min: rdEvents},
		{name: "scan whole range desc", filter: doc(bson.E{Key: "ts", Value: bson.D{{Key: "$lt", Value: h(100_000)}}}), sort: bson.D{{Key: "ts", Value: -1}, {Key: "_id", Value: -1}}, sorted: true, min: rdEvents},
		{name: "scan desc skip limit", filter: doc(rng(10, 40)), sort: bson.D{{Key: "ts", Value: -1}, {Key: "_id", Value: 1}}, skip: 123, limit: 777, sorted: true, min: 777},
		{name: "scan batchSize 5 $gt $lte", filter: doc(bson.E{Key: "ts", Value: bson.D{{Key: "$gt", Value: edge}, {Key: "$lte", Value: h(44)}}}), sort: byTsID, batch: 5, sorted: true, min: 100},
		{name: "scan unsorted projection", filter: doc(rng(44, 47)), proj: bson.D{{Key: "sensor", Value: 1}, {Key: "value", Value: 1}}, batch: 50, min: 100},
		{name: "_id equality", filter: doc(bson.E{Key: "value", Value: int64(1)}), min: 1},
		{name: "count range", kind: "count", filter: doc(rng(10, 40))},
		{name: "count skip limit", kind: "count", filter: doc(bson.E{Key: "sensor", Value: "s-a"}), skip: 5, limit: 100},
		{name: "countDocuments meta", kind: "countDocuments", filter: doc(bson.E{Key: "sensor", Value: "s-c"})},
		{name: "countDocuments empty", kind: "countDocuments", filter: doc(rng(1000, 1001))},
		{name: "estimatedDocumentCount", kind: "estimated"},
		{name: "distinct meta", kind: "distinct", key: "sensor"},
		{name: "distinct status in range", kind: "distinct", key: "status", filter: doc(rng(0, 5))},
		{name: "distinct array elements", kind: "distinct", key: "tags"},
		{name: "distinct dotted", kind: "distinct", key: "sensor.site"},
		{name: "aggregate match sort limit", kind: "aggregate", pipe: bson.A{
			bson.D{{Key: "$match", Value: doc(rng(3, 9))}},
			bson.D{{Key: "$sort", Value: byTsID}},
			bson.D{{Key: "$limit", Value: 40}},
		}, sorted: true, min: 40},
		{name: "aggregate match count", kind: "aggregate", pipe: bson.A{
			bson.D{{Key: "$match", Value: doc(bson.E{Key: "sensor", Value: "s-b"}, rng(0, 48))}},
			bson.D{{Key: "$count", Value: "total"}},
		}, min: 1},
		{name: "aggregate project last", kind: "aggregate", pipe: bson.A{
			bson.D{{Key: "$match", Value: doc(rng(3, 5))}},
			bson.D{{Key: "$sort", Value: byTsID}},
			bson.D{{Key: "$project", Value: bson.D{{Key: "_id", Value: 0}, {Key: "value", Value: 1}}}},
		}, sorted: true, min: 10},
	}
}

// rdRun runs one query on coll and returns its documents, normalised for
// comparison: unsorted results are ordered by _id (or by their JSON).
func rdRun(t *testing.T, ctx context.Context, coll *mongo.Collection, q rdQuery) ([]bson.D, error) {
	filter := q.filter
	if filter == nil {
		filter = bson.D{}
	}
	var docs []bson.D
	switch q.kind {
	case "", "find":
		o := options.Find()
		if q.sort != nil {
			o.SetSort(q.sort)
		}
		if q.skip != 0 {
			o.SetSkip(q.skip)
		}
		if q.limit != 0 {
			o.SetLimit(q.limit)
		}
		if q.proj != nil {
			o.SetProjection(q.proj)
		}
		if q.batch != 0 {
			o.SetBatchSize(q.batch)
		}
		cur, err := coll.Find(ctx, filter, o)
		if err != nil {
			return nil, err
		}
		if err := cur.All(ctx, &docs); err != nil {
			return nil, err
		}
	case "aggregate":
		cur, err := coll.Aggregate(ctx, q.pipe)
		if err != nil {
			return nil, err
		}
		if err := cur.All(ctx, &docs); err != nil {
			return nil, err
		}
	case "count":
		cmd := bson.D{{Key: "count", Value: coll.Name()}, {Key: "query", Value: filter}}
		if q.skip != 0 {
			cmd = append(cmd, bson.E{Key: "skip", Value: q.skip})
		}
		if q.limit != 0 {
			cmd = append(cmd, bson.E{Key: "limit", Value: q.limit})
		}
		var res bson.D
		if err := coll.Database().RunCommand(ctx, cmd).Decode(&res); err != nil {
			return nil, err
		}
		n, _ := bson.Raw(mustMarshal(res)).Lookup("n").AsInt64OK()
		docs = []bson.D{{{Key: "n", Value: n}}}
	case "countDocuments":
		n, err := coll.CountDocuments(ctx, filter)
		if err != nil {
			return nil, err
		}
		docs = []bson.D{{{Key: "n", Value: n}}}
	case "estimated":
		n, err := coll.EstimatedDocumentCount(ctx)
		if err != nil {
			return nil, err
		}
		docs = []bson.D{{{Key: "n", Value: n}}}
	case "distinct":
		// Without a client timeout or deadline: the driver would add
		// maxTimeMS, which FerretDB's distinct refuses.
		var res struct {
			Values []any `bson:"values"`
		}
		nt, err := mongo.Connect(options.Client().ApplyURI(rdURI[coll.Name()]))
		if err != nil {
			return nil, err
		}
		defer nt.Disconnect(context.Background())
		err = nt.Database(coll.Database().Name()).RunCommand(context.Background(), bson.D{{Key: "distinct", Value: coll.Name()}, {Key: "key", Value: q.key}, {Key: "query", Value: filter}}).Decode(&res)
		if err != nil {
			return nil, err
		}
		vals := res.Values
		for _, v := range vals {
			docs = append(docs, bson.D{{Key: "v", Value: v}})
		}
		sort.Slice(docs, func(i, j int) bool { return fmt.Sprint(docs[i]) < fmt.Sprint(docs[j]) })
		return docs, nil
	}
	if !q.sorted {
		key := func(d bson.D) string {
			for _, e := range d {
				if e.Key == "_id" {
					return fmt.Sprint(e.Value)
				}
			}
			return fmt.Sprint(d)
		}
		sort.SliceStable(docs, func(i, j int) bool { return key(docs[i]) < key(docs[j]) })
	}
	return docs, nil
}

// rdURI is the URI of each side, by collection name, for clients without
// a timeout.
var rdURI = map[string]string{}

func mustMarshal(v any) []byte {
	b, err := bson.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// rdLoad writes the events into db.plain directly and db.readings through
// the proxy.
func rdLoad(t *testing.T) (db string, p *testProxy, events []bson.D, edges []time.Time) {
	db = uniqueDB(t)
	p = startProxy(t, proxyOptions{yaml: rdRule(db)})
	events, edges = rdGen()
	t0 := time.Now()
	rdInsert(t, direct(t).Database(db).Collection("plain"), events)
	t1 := time.Now()
	rdInsert(t, connect(t, p.URI()).Database(db).Collection("readings"), events)
	t.Logf("loaded %d events: direct %v, through the proxy %v", len(events), t1.Sub(t0), time.Since(t1))
	return db, p, events, edges
}

func TestReadDifferential(t *testing.T) {
	db, p, _, edges := rdLoad(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	rdURI["plain"], rdURI["readings"] = env.upstreamURI, p.URI()
	plain := direct(t).Database(db).Collection("plain")
	proxied := connect(t, p.URI()).Database(db).Collection("readings")

	// Nothing was written to the app's namespace upstream; buckets were.
	up := direct(t).Database(db)
	if n, err := up.Collection("readings").CountDocuments(ctx, bson.D{}); err != nil || n != 0 {
		t.Fatalf("upstream %s.readings holds %d documents (err %v), want 0", db, n, err)
	}
	nb, err := up.Collection("readings.buckets").CountDocuments(ctx, bson.D{})
	if err != nil || nb == 0 || nb > rdEvents/10 {
		t.Fatalf("bucket collection holds %d documents (err %v)", nb, err)
	}

	queries := rdQueries(edges)
	if len(queries) < 40 {
		t.Fatalf("only %d queries", len(queries))
	}
	t.Run("queries", func(t *testing.T) {
		for _, q := range queries {
			t.Run(q.name, func(t *testing.T) {
				ctx := ctxFor(t)
				t0 := time.Now()
				want, err := rdRun(t, ctx, plain, q)
				if err != nil {
					t.Fatalf("direct: %v", err)
				}
				t1 := time.Now()
				got, err := rdRun(t, ctx, proxied, q)
				if q.ferretErr != "" && !env.external {
					if err == nil || !strings.Contains(err.Error(), q.ferretErr) {
						t.Fatalf("proxy on FerretDB: got %v, want an error with %q", err, q.ferretErr)
					}
					return
				}
				if err != nil {
					t.Fatalf("proxy: %v", err)
				}
				if len(want) < q.min {
					t.Fatalf("direct gave %d results, the query should give at least %d (test data problem)", len(want), q.min)
				}
				if len(got) != len(want) {
					t.Fatalf("proxy gave %d results, direct %d", len(got), len(want))
				}
				for i := range want {
					if !reflect.DeepEqual(got[i], want[i]) {
						t.Fatalf("result %d differs:\nproxy:  %v\ndirect: %v", i, got[i], want[i])
					}
				}
				t.Logf("%d results; direct %v, proxy %v", len(want), t1.Sub(t0), time.Since(t1))
			})
		}
	})

	t.Run("cursor registry drained", func(t *testing.T) {
		// Exhausted cursors are forgotten; killCursors forgets the rest.
		cur, err := proxied.Find(ctx, bson.D{}, options.Find().SetBatchSize(10))
		if err != nil {
			t.Fatal(err)
		}
		if !cur.Next(ctx) {
			t.Fatal("no document")
		}
		if p.srv.OpenCursors() == 0 {
			t.Fatal("open cursor not registered")
		}
		if err := cur.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if n := p.srv.OpenCursors(); n != 0 {
			t.Fatalf("%d cursors still registered after exhaustion/kill", n)
		}
	})
	t.Run("explain shows the bucket collection", func(t *testing.T) {
		var res bson.M
		err := proxied.Database().RunCommand(ctx, bson.D{
			{Key: "explain", Value: bson.D{{Key: "find", Value: "readings"}, {Key: "filter", Value: bson.D{{Key: "sensor", Value: "s-a"}}}}},
		}).Decode(&res)
		if err != nil {
			t.Fatal(err)
		}
		s := fmt.Sprint(res)
		if !strings.Contains(s, "readings.buckets") && !strings.Contains(s, "$unwind") {
			t.Fatalf("explain does not show the rewritten aggregate: %.500s", s)
		}
	})
	t.Run("point read explained and its cursor killed", func(t *testing.T) {
		filter := bson.D{{Key: "sensor", Value: "s-a"}, {Key: "ts", Value: bson.D{{Key: "$gte", Value: dt(rdBase)}, {Key: "$lt", Value: dt(rdBase.Add(48 * time.Hour))}}}}
		var res bson.Raw
		err := proxied.Database().RunCommand(ctx, bson.D{{Key: "explain", Value: bson.D{{Key: "find", Value: "readings"}, {Key: "filter", Value: filter}}}}).Decode(&res)
		if err != nil {
			t.Fatal(err)
		}
		// Where a find by _id scans the bucket collection (the stock
		// upstreams), one scan of the series serves it instead.
		lookups := env.external || cmp.Or(env.kind, backend.KindEmbedded) == backend.KindEmbedded
		want := map[bool]string{true: "TSPROXY_BUCKET_ID_LOOKUPS", false: "TSPROXY_BUCKET_SCAN"}[lookups]
		if st, _ := res.Lookup("queryPlanner", "winningPlan", "stage").StringValueOK(); st != want || !strings.Contains(res.String(), db+".readings.buckets") {
			t.Fatalf("explain of a point read: %.600s, want stage %s", res.String(), want)
		}
		if keys, _ := res.Lookup("queryPlanner", "winningPlan", "keys").AsInt64OK(); lookups && keys != 48 {
			t.Fatalf("explain: %d keys, want 48 (one series, 48 hourly windows)", keys)
		}
		before := p.srv.OpenCursors()
		cur, err := proxied.Find(ctx, filter, options.Find().SetBatchSize(5))
		if err != nil {
			t.Fatal(err)
		}
		if !cur.Next(ctx) {
			t.Fatal("no document")
		}
		if p.srv.OpenCursors() != before+1 {
			t.Fatal("point cursor not registered")
		}
		if err := cur.Close(ctx); err != nil {
			t.Fatalf("killCursors of a point cursor: %v", err)
		}
		if n := p.srv.OpenCursors(); n != before {
			t.Fatalf("%d cursors registered after killCursors, want %d", n, before)
		}
	})
	t.Run("scan read explained and its cursors killed", func(t *testing.T) {
		filter := bson.D{{Key: "ts", Value: bson.D{{Key: "$gte", Value: dt(rdBase)}}}}
		var res bson.Raw
		err := proxied.Database().RunCommand(ctx, bson.D{{Key: "explain", Value: bson.D{{Key: "find", Value: "readings"}, {Key: "filter", Value: filter}}}}).Decode(&res)
		if err != nil {
			t.Fatal(err)
		}
		if st, _ := res.Lookup("queryPlanner", "winningPlan", "stage").StringValueOK(); st != "TSPROXY_BUCKET_SCAN" && !env.external {
			t.Fatalf("explain of a scan read: %.600s", res.String())
		}
		before := p.srv.OpenCursors()
		// killCursors mid-way, then a limit that ends the read before the
		// upstream cursor: both kill the upstream cursor, and the
		// connection keeps serving.
		cur, err := proxied.Find(ctx, filter, options.Find().SetBatchSize(5).SetSort(bson.D{{Key: "ts", Value: 1}}))
		if err != nil {
			t.Fatal(err)
		}
		if !cur.Next(ctx) {
			t.Fatal("no document")
		}
		if err := cur.Close(ctx); err != nil {
			t.Fatalf("killCursors of a scan cursor: %v", err)
		}
		if n := p.srv.OpenCursors(); n != before {
			t.Fatalf("%d cursors registered after killCursors, want %d", n, before)
		}
		n, err := proxied.CountDocuments(ctx, filter)
		if err != nil {
			t.Fatal(err)
		}
		cur, err = proxied.Find(ctx, filter, options.Find().SetLimit(3))
		if err != nil {
			t.Fatal(err)
		}
		var docs []bson.D
		if err := cur.All(ctx, &docs); err != nil || len(docs) != 3 || n < 100 {
			t.Fatalf("limit 3: %d documents (err %v) of %d", len(docs), err, n)
		}
	})
	t.Run("unsupported gets a clear error", func(t *testing.T) {
		for _, c := range []struct {
			cmd  bson.D
			want string
		}{
			{bson.D{{Key: "find", Value: "readings"}, {Key: "filter", Value: bson.D{{Key: "$where", Value: "1"}}}}, `filter operator "$where"`},
			{bson.D{{Key: "find", Value: "readings"}, {Key: "collation", Value: bson.D{{Key: "locale", Value: "fr"}}}}, `find option "collation"`},
			{bson.D{{Key: "aggregate", Value: "readings"}, {Key: "pipeline", Value: bson.A{bson.D{{Key: "$graphLookup", Value: bson.D{{Key: "from", Value: "x"}}}}}}, {Key: "cursor", Value: bson.D{}}}, `"$graphLookup"`},
			{bson.D{{Key: "createIndexes", Value: "readings"}, {Key: "indexes", Value: bson.A{bson.D{{Key: "key", Value: bson.D{{Key: "x", Value: 1}}}, {Key: "name", Value: "x"}}}}}, `an index on "x" is not supported`},
		} {
			err := proxied.Database().RunCommand(ctx, c.cmd).Err()
			if env.external && strings.Contains(c.want, "$graphLookup") {
				continue // MongoDB runs it upstream
			}
			if err == nil || !strings.Contains(err.Error(), "tsproxy rule "+db+".readings") || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%v: got %v, want an error naming the rule and %s", c.cmd[0].Key, err, c.want)
			}
		}
	})
	t.Run("collStats", func(t *testing.T) {
		var res struct {
			NS      string `bson:"ns"`
			Count   int64  `bson:"count"`
			TSProxy struct {
				BucketCollection string `bson:"bucketCollection"`
				Buckets          int64  `bson:"buckets"`
			} `bson:"tsproxy"`
		}
		if err := proxied.Database().RunCommand(ctx, bson.D{{Key: "collStats", Value: "readings"}}).Decode(&res); err != nil {
			t.Fatal(err)
		}
		if res.NS != db+".readings" || res.Count != rdEvents || res.TSProxy.BucketCollection != db+".readings.buckets" || res.TSProxy.Buckets != nb {
			t.Fatalf("collStats: %+v, want ns %s.readings, count %d, %d buckets", res, db, rdEvents, nb)
		}
		// The count's BSON type is the plain collection's.
		types := map[string]bson.Type{}
		for name, c := range map[string]*mongo.Collection{"proxy": proxied, "plain": plain} {
			raw, err := c.Database().RunCommand(ctx, bson.D{{Key: "collStats", Value: c.Name()}}).Raw()
			if err != nil {
				t.Fatal(err)
			}
			types[name] = raw.Lookup("count").Type
		}
		if types["proxy"] != types["plain"] {
			t.Fatalf("collStats count is a %v through the proxy, a %v on a plain collection", types["proxy"], types["plain"])
		}
	})
	t.Run("mongosh", func(t *testing.T) { rdMongosh(t, p, db, edges) })
}

// rdMongoshScript prints, one JSON line, a few queries' results.
const rdMongoshScript = `
const sdb = connect(process.env.TSPROXY_URI + DBNAME);
const c = sdb[COLL];
const out = {};
out.range = c.find({ts: {$gte: ISODate(H1), $lt: ISODate(H2)}}).sort({ts: 1, _id: 1}).toArray();
out.meta = c.find({sensor: "s-a"}, {_id: 0, ts: 1, value: 1}).sort({ts: -1}).limit(25).toArray();
out.doc = c.find({"sensor.site": "north", ts: {$lt: ISODate(H2)}}).sort({ts: 1, _id: 1}).batchSize(5).toArray();
out.count = c.countDocuments({sensor: {$in: ["s-b", 7]}});
out.distinct = c.distinct("status", {ts: {$lt: ISODate(H2)}}).sort();
out.agg = c.aggregate([{$match: {sensor: 9.5}}, {$sort: {ts: 1}}, {$limit: 5}]).toArray();
print(EJSON.stringify(out));
`

func rdMongosh(t *testing.T, p *testProxy, db string, edges []time.Time) {
	mk := func(coll string) string {
		r := strings.NewReplacer("DBNAME", `"`+db+`"`, "COLL", `"`+coll+`"`,
			"H1", `"`+rdBase.Add(2*time.Hour).Format(time.RFC3339)+`"`,
			"H2", `"`+rdBase.Add(4*time.Hour).Format(time.RFC3339)+`"`)
		return r.Replace(rdMongoshScript)
	}
	viaProxy := runMongosh(t, p.URI(), mk("readings"))
	directOut := runMongosh(t, env.upstreamURI, mk("plain"))
	if strings.TrimSpace(viaProxy) != strings.TrimSpace(directOut) {
		t.Fatalf("mongosh results differ:\nproxy:  %.2000s\ndirect: %.2000s", viaProxy, directOut)
	}
	if len(viaProxy) < 1000 {
		t.Fatalf("mongosh printed little: %s", viaProxy)
	}
}

// TestReadHintIgnored: a hint naming the app's indexes (by name or key
// pattern) is accepted and ignored, as the server ignores one on a view;
// a hint that is neither a string nor a document is refused as the
// server refuses it.
func TestReadHintIgnored(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: readingsRule(db, 100)})
	coll := connect(t, p.URI()).Database(db).Collection("readings")
	base := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	if _, err := coll.InsertMany(ctx, docsOf(append(seriesEvents(30, "a", base), seriesEvents(30, "b", base)...))); err != nil {
		t.Fatal(err)
	}
	filter := bson.D{{Key: "sensorId", Value: "a"}}
	for _, hint := range []any{"sensorId_1_ts_1", bson.D{{Key: "ts", Value: 1}}} {
		n, err := coll.CountDocuments(ctx, filter, options.Count().SetHint(hint))
		if err != nil || n != 30 {
			t.Fatalf("count with hint %v: %d, %v", hint, n, err)
		}
		cur, err := coll.Find(ctx, filter, options.Find().SetHint(hint).SetSort(bson.D{{Key: "sensorId", Value: 1}, {Key: "ts", Value: -1}}))
		if err != nil {
			t.Fatalf("find with hint %v: %v", hint, err)
		}
		var got []bson.M
		if err := cur.All(ctx, &got); err != nil || len(got) != 30 {
			t.Fatalf("find with hint %v: %d events, %v", hint, len(got), err)
		}
	}
	err := coll.Database().RunCommand(ctx, bson.D{{Key: "find", Value: "readings"}, {Key: "hint", Value: 1}}).Err()
	var se mongo.ServerError
	if !errors.As(err, &se) || !se.HasErrorCode(9) || !strings.Contains(err.Error(), "hint must be either a string or nested object") {
		t.Fatalf("find with hint 1: %v, want FailedToParse", err)
	}
}

// TestCountMetaInOr: a count command, countDocuments or distinct whose
// filter has the metaField inside $or or $nor, which FerretDB cannot run on unwound
// events, is counted by the proxy; the same as on a plain collection of
// the same events.
func TestCountMetaInOr(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: readingsRule(db, 100)})
	proxied := connect(t, p.URI()).Database(db)
	plain := direct(t).Database(db)
	base := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	var evs []sentEvent
	for _, s := range []string{"a", "b", "c"} {
		evs = append(evs, seriesEvents(250, s, base)...)
	}
	for _, c := range []*mongo.Collection{proxied.Collection("readings"), plain.Collection("plain")} {
		if _, err := c.InsertMany(ctx, docsOf(evs)); err != nil {
			t.Fatal(err)
		}
	}
	count := func(d *mongo.Database, coll string, f bson.D, paging bson.D) (int64, error) {
		var out struct {
			N int64 `bson:"n"`
		}
		err := d.RunCommand(ctx, append(bson.D{{Key: "count", Value: coll}, {Key: "query", Value: f}}, paging...)).Decode(&out)
		return out.N, err
	}
	for _, f := range []bson.D{
		{{Key: "$or", Value: bson.A{bson.D{{Key: "sensorId", Value: "a"}}, bson.D{{Key: "value", Value: bson.D{{Key: "$lt", Value: 10}}}}}}},
		{{Key: "$nor", Value: bson.A{bson.D{{Key: "sensorId", Value: "b"}}}}, {Key: "ts", Value: bson.D{{Key: "$gte", Value: base.Add(time.Minute)}}}},
	} {
		for _, paging := range []bson.D{nil, {{Key: "skip", Value: 20}, {Key: "limit", Value: 100}}} {
			want, err := count(plain, "plain", f, paging)
			if err != nil {
				t.Fatal(err)
			}
			got, err := count(proxied, "readings", f, paging)
			if err != nil || got != want || want == 0 {
				t.Fatalf("count %v %v: %d (%v), plain %d", f, paging, got, err, want)
			}
		}
		// countDocuments: the driver's aggregate ($match, $skip, $limit,
		// a count $group).
		for _, o := range []*options.CountOptionsBuilder{options.Count(), options.Count().SetSkip(20).SetLimit(100), options.Count().SetSkip(100_000)} {
			want, err := plain.Collection("plain").CountDocuments(ctx, f, o)
			if err != nil {
				t.Fatal(err)
			}
			got, err := proxied.Collection("readings").CountDocuments(ctx, f, o)
			if err != nil || got != want {
				t.Fatalf("countDocuments %v: %d (%v), plain %d", f, got, err, want)
			}
		}
		// distinct, of an event field and of the metaField (without a
		// deadline: FerretDB's distinct refuses maxTimeMS).
		for _, key := range []string{"value", "sensorId"} {
			want, err := connectNoTimeout(t, env.upstreamURI).Database(db).Collection("plain").Distinct(context.Background(), key, f).Raw()
			if err != nil {
				t.Fatal(err)
			}
			got, err := connectNoTimeout(t, p.URI()).Database(db).Collection("readings").Distinct(context.Background(), key, f).Raw()
			if err != nil || got.String() != want.String() || len(want) <= 5 {
				t.Fatalf("distinct %s %v: %v (%v), plain %v", key, f, got, err, want)
			}
		}
		// A find-shaped aggregate: run by the proxy as the same find.
		pipeline := mongo.Pipeline{{{Key: "$match", Value: f}}, {{Key: "$sort", Value: bson.D{{Key: "ts", Value: -1}, {Key: "sensorId", Value: 1}}}}, {{Key: "$skip", Value: 5}}, {{Key: "$limit", Value: 40}}, {{Key: "$project", Value: bson.D{{Key: "_id", Value: 0}, {Key: "sensorId", Value: 1}, {Key: "value", Value: 1}}}}}
		var got, want []bson.D
		for _, side := range []struct {
			c   *mongo.Collection
			out *[]bson.D
		}{{proxied.Collection("readings"), &got}, {plain.Collection("plain"), &want}} {
			cur, err := side.c.Aggregate(ctx, pipeline)
			if err != nil {
				t.Fatalf("aggregate %v on %s: %v", f, side.c.Name(), err)
			}
			if err := cur.All(ctx, side.out); err != nil {
				t.Fatal(err)
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) || len(want) != 40 {
			t.Fatalf("aggregate %v:\nproxy %v\nplain %v", f, got, want)
		}
	}
}
