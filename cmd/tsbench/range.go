package main

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"math"
	"os"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/tsproxy/tsproxy/cmd/tsbench/internal/benchenv"
	"github.com/tsproxy/tsproxy/rules"
)

// rangeOptions is the scale of `tsbench range`.
type rangeOptions struct {
	series int
	days   int
	every  time.Duration
	span   time.Duration
	runs   int
}

// addRangeFlags registers the range mode's flags.
func addRangeFlags(fs *flag.FlagSet) *rangeOptions {
	o := &rangeOptions{}
	fs.IntVar(&o.series, "series", 100, "range: number of series")
	fs.IntVar(&o.days, "days", 7, "range: days of data")
	fs.DurationVar(&o.every, "every", time.Minute, "range: time between two events of a series (1s data at 100 series x 7 days is 60M events: too many to load here)")
	fs.DurationVar(&o.span, "span", 6*time.Hour, "range: the rule's bucket span")
	return o
}

var rangeBase = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// rangeRules buckets tsbench.events with the given span.
func rangeRules(span time.Duration) ([]rules.Rule, error) {
	yaml := fmt.Sprintf(`rules:
  - namespace: tsbench.events
    timeField: ts
    metaField: sensor
    bucket: {span: %s, maxEvents: 3600}
    aggregates: [value]
`, span)
	return benchenv.RulesFromYAML(yaml)
}

type rangeQuery struct {
	name   string
	filter bson.D
	// bucketFilter selects, on the bucket collection, the buckets the
	// proxy reads for this query (to report them).
	bucketFilter bson.D
	// one makes the query a findOne (limit 1, no sort), as drivers and
	// ODMs read a document back by its _id.
	one bool
}

func rangeQueries(o *rangeOptions) []rangeQuery {
	series := fmt.Sprintf("s%03d", o.series/2)
	mid := rangeBase.Add(time.Duration(o.days) * 24 * time.Hour / 2).Truncate(time.Hour)
	one := func(name string, from time.Time, d time.Duration) rangeQuery {
		to := from.Add(d)
		return rangeQuery{
			name:         name,
			filter:       bson.D{{Key: "sensor", Value: series}, {Key: "ts", Value: bson.D{{Key: "$gte", Value: from}, {Key: "$lt", Value: to}}}},
			bucketFilter: bson.D{{Key: "meta", Value: series}, {Key: "start", Value: bson.D{{Key: "$gte", Value: from.Truncate(o.span)}, {Key: "$lt", Value: to}}}},
		}
	}
	day := mid.Truncate(24 * time.Hour)
	dayRange := bson.D{{Key: "ts", Value: bson.D{{Key: "$gte", Value: day}, {Key: "$lt", Value: day.Add(24 * time.Hour)}}}}
	qs := []rangeQuery{
		one("1 hour, 1 series", mid, time.Hour),
		one("1 day, 1 series", mid, 24*time.Hour),
		one(fmt.Sprintf("%d days, 1 series", o.days), rangeBase, time.Duration(o.days)*24*time.Hour),
		{
			name:         "whole-day scan, all series",
			filter:       dayRange,
			bucketFilter: bson.D{{Key: "start", Value: bson.D{{Key: "$gte", Value: day}, {Key: "$lt", Value: day.Add(24 * time.Hour)}}}},
		},
		{
			// The same query through the aggregate path, for comparison in
			// the same run: a $type on the timeField is no time bound, so
			// the scan plan leaves it to the aggregate (same results: every
			// stored time is a date).
			name:         "same, aggregate path",
			filter:       bson.D{{Key: "$and", Value: bson.A{dayRange, bson.D{{Key: "ts", Value: bson.D{{Key: "$type", Value: "date"}}}}}}},
			bucketFilter: bson.D{}, // the aggregate path decodes every bucket on FerretDB
		},
		{
			// A measurement filter, with an index on it on both sides
			// (createIndex({value: 1}): on the buckets' min and max of
			// value through the proxy), which reads only the buckets
			// whose min and max admit a match.
			name:         "value ≥ 89 over a day, all series",
			filter:       append(bson.D{{Key: "value", Value: bson.D{{Key: "$gte", Value: 89.0}}}}, dayRange...),
			bucketFilter: bson.D{{Key: "start", Value: bson.D{{Key: "$gte", Value: day}, {Key: "$lt", Value: day.Add(24 * time.Hour)}}}, {Key: "max.value", Value: bson.D{{Key: "$gte", Value: 89.0}}}},
		},
		{
			name:         "findOne by event _id",
			filter:       bson.D{{Key: "_id", Value: rangeEventID(o.series/2, int(mid.Sub(rangeBase)/o.every), mid)}},
			bucketFilter: bson.D{{Key: "meta", Value: series}, {Key: "start", Value: mid.Truncate(o.span)}},
			one:          true,
		},
	}
	return qs
}

// benchRange loads the same events into a plain collection directly and
// into buckets through the proxy, then times each range query on both,
// interleaved, and reports medians, ratios and documents examined.
func benchRange(e *benchenv.Env, o *rangeOptions) error {
	ctx := context.Background()
	cs, err := e.ConnectBoth(30*time.Minute, 0)
	if err != nil {
		return err
	}
	defer cs.Close()
	db := cs.Direct.Database("tsbench")
	r := &rangeRun{
		o: o, proxyC: cs.Proxy, db: db,
		plain: db.Collection("plain"), buckets: db.Collection("events.buckets"),
		proxied: cs.Proxy.Database("tsbench").Collection("events"),
		qs:      rangeQueries(o),
	}
	if err := r.load(ctx); err != nil {
		return err
	}
	if err := r.time(ctx); err != nil {
		return err
	}
	return r.report(ctx)
}

// rangeRun is one range benchmark: the same events loaded plain and
// through the proxy, the same queries timed on both, interleaved.
type rangeRun struct {
	o                       *rangeOptions
	proxyC                  *mongo.Client
	db                      *mongo.Database
	plain, buckets, proxied *mongo.Collection
	qs                      []rangeQuery
	nPlain, nBuckets        int64
	proxyMS, directMS       [][]float64
	counts                  [][2]int
}

func (r *rangeRun) load(ctx context.Context) error {
	o := r.o
	_ = r.plain.Drop(ctx)
	_ = r.proxied.Drop(ctx)
	perSeries := int(time.Duration(o.days) * 24 * time.Hour / o.every)
	total := perSeries * o.series
	fmt.Printf("scale: %d series x %d days at one event per %s = %d events per layout; rule span %s, maxEvents 3600; batch-1000 insertMany, series by series\n",
		o.series, o.days, o.every, total, o.span)
	for _, l := range []struct {
		name string
		coll *mongo.Collection
	}{{"direct (plain)", r.plain}, {"proxy (buckets)", r.proxied}} {
		t0 := time.Now()
		if err := loadRange(ctx, l.coll, o, perSeries); err != nil {
			return fmt.Errorf("load %s: %w", l.name, err)
		}
		if l.coll == r.proxied {
			// Settled before the reads, as the plain side is: the first
			// read would otherwise merge what the load left staged.
			if _, _, err := tsproxyFlush(ctx, l.coll.Database().Client()); err != nil {
				return fmt.Errorf("load %s: %w", l.name, err)
			}
		}
		fmt.Printf("loaded %s in %.1f s (%.0f events/s)\n", l.name, time.Since(t0).Seconds(), float64(total)/time.Since(t0).Seconds())
	}
	var err error
	if r.nPlain, err = r.plain.EstimatedDocumentCount(ctx); err != nil {
		return err
	}
	if r.nBuckets, err = r.buckets.CountDocuments(ctx, bson.D{}); err != nil {
		return err
	}
	for _, c := range []*mongo.Collection{r.plain, r.proxied} {
		if _, err := c.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: "value", Value: 1}}}); err != nil {
			return fmt.Errorf("createIndex({value: 1}) on %s: %w", c.Name(), err)
		}
	}
	fmt.Printf("stored: %d plain documents, %d buckets; both indexed on {value: 1}\n", r.nPlain, r.nBuckets)
	return nil
}

// time runs every query o.runs times on both paths, alternating which
// goes first, and checks both return the same number of documents.
func (r *rangeRun) time(ctx context.Context) error {
	r.proxyMS = make([][]float64, len(r.qs))
	r.directMS = make([][]float64, len(r.qs))
	r.counts = make([][2]int, len(r.qs))
	for run := 0; run < r.o.runs; run++ {
		for i, q := range r.qs {
			paths := []string{"proxy", "direct"}
			if run%2 == 1 {
				paths = []string{"direct", "proxy"}
			}
			for _, path := range paths {
				n, ms, err := r.timeFind(ctx, path, q)
				if err != nil {
					return err
				}
				if path == "proxy" {
					r.proxyMS[i] = append(r.proxyMS[i], ms)
					r.counts[i][0] = n
				} else {
					r.directMS[i] = append(r.directMS[i], ms)
					r.counts[i][1] = n
				}
				fmt.Fprintf(os.Stderr, "  run %d %-28s %-6s %6d docs %9.1f ms\n", run+1, q.name, path, n, ms)
			}
			if r.counts[i][0] != r.counts[i][1] {
				return fmt.Errorf("%s: proxy returned %d documents, direct %d", q.name, r.counts[i][0], r.counts[i][1])
			}
		}
	}
	return nil
}

func (r *rangeRun) timeFind(ctx context.Context, path string, q rangeQuery) (int, float64, error) {
	coll := r.proxied
	if path == "direct" {
		coll = r.plain
	}
	t0 := time.Now()
	if q.one {
		err := coll.FindOne(ctx, q.filter).Err()
		if err != nil {
			return 0, 0, fmt.Errorf("%s %s: %w", path, q.name, err)
		}
		return 1, float64(time.Since(t0).Microseconds()) / 1000, nil
	}
	cur, err := coll.Find(ctx, q.filter, options.Find().SetSort(bson.D{{Key: "ts", Value: 1}}))
	if err != nil {
		return 0, 0, fmt.Errorf("%s %s: %w", path, q.name, err)
	}
	var docs []bson.Raw
	if err := cur.All(ctx, &docs); err != nil {
		return 0, 0, fmt.Errorf("%s %s: %w", path, q.name, err)
	}
	return len(docs), float64(time.Since(t0).Microseconds()) / 1000, nil
}

func (r *rangeRun) report(ctx context.Context) error {
	fmt.Printf("\nmedians of %d runs, interleaved; find(filter).sort({ts: 1}), whole cursor read; embedded FerretDB/SQLite unless -upstream\n\n", r.o.runs)
	fmt.Println("| query | docs returned | direct ms | proxy ms | direct/proxy | direct docs examined | proxy buckets read (lookups) | proxy plan |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|---|")
	for i, q := range r.qs {
		d, p := benchenv.Median(r.directMS[i]), benchenv.Median(r.proxyMS[i])
		read, lookups, plan, err := proxyExamined(ctx, r.proxyC, r.buckets, q, r.nBuckets)
		if err != nil {
			return err
		}
		direct, err := directExamined(ctx, r.db, q, r.nPlain)
		if err != nil {
			return err
		}
		fmt.Printf("| %s | %d | %.1f | %.1f | %.1fx | %s | %d (%s) | %s |\n", q.name, r.counts[i][0], d, p, d/p, direct, read, lookups, plan)
	}
	return nil
}

// loadRange writes every series' events in time order, series by series,
// in batches of 1000.
func loadRange(ctx context.Context, coll *mongo.Collection, o *rangeOptions, perSeries int) error {
	batch := make([]any, 0, 1000)
	for s := 0; s < o.series; s++ {
		sensor := fmt.Sprintf("s%03d", s)
		for i := 0; i < perSeries; i++ {
			ts := rangeBase.Add(time.Duration(i) * o.every)
			batch = append(batch, bson.D{
				{Key: "_id", Value: rangeEventID(s, i, ts)},
				{Key: "ts", Value: ts},
				{Key: "sensor", Value: sensor},
				{Key: "value", Value: rangeValue(s, i, o)},
			})
			if len(batch) == cap(batch) {
				if _, err := coll.InsertMany(ctx, batch); err != nil {
					return err
				}
				batch = batch[:0]
			}
		}
	}
	if len(batch) > 0 {
		_, err := coll.InsertMany(ctx, batch)
		return err
	}
	return nil
}

// rangeValue is the i-th reading of series s: a daily cycle between 10
// and 90, each series' shifted, with a little noise, as temperatures or
// loads go; a filter on high values selects some hours of each series'
// day.
func rangeValue(s, i int, o *rangeOptions) float64 {
	day := float64(24 * time.Hour / o.every)
	phase := float64(i)/day + float64(s)/float64(o.series)
	return math.Round((50+40*math.Sin(2*math.Pi*phase)+float64((i*7+s)%10)/10)*10) / 10
}

// rangeEventID is the _id a driver would have given the i-th event of
// series s had it been inserted live: an ObjectID whose time is the
// event's, unique per event, the same on both paths.
func rangeEventID(s, i int, ts time.Time) bson.ObjectID {
	var id bson.ObjectID
	binary.BigEndian.PutUint32(id[0:4], uint32(ts.Unix()))
	binary.BigEndian.PutUint32(id[4:8], uint32(s))
	binary.BigEndian.PutUint32(id[8:12], uint32(i))
	return id
}

// proxyExamined is what the proxy read for a query: the buckets its plan
// fetches (counted directly on the bucket collection) and how it read them.
func proxyExamined(ctx context.Context, proxyC *mongo.Client, buckets *mongo.Collection, q rangeQuery, nBuckets int64) (int64, string, string, error) {
	var ex bson.Raw
	err := proxyC.Database("tsbench").RunCommand(ctx, bson.D{{Key: "explain", Value: bson.D{{Key: "find", Value: "events"}, {Key: "filter", Value: q.filter}, {Key: "sort", Value: bson.D{{Key: "ts", Value: 1}}}}}}).Decode(&ex)
	if err != nil {
		return 0, "", "", fmt.Errorf("explain %s: %w", q.name, err)
	}
	stage, _ := ex.Lookup("queryPlanner", "winningPlan", "stage").StringValueOK()
	if stage == "TSPROXY_EVENT_ID_INDEX" {
		n, err := buckets.CountDocuments(ctx, q.bucketFilter)
		if err != nil {
			return 0, "", "", err
		}
		return n, "1 find of the whole event-id index, then _id lookups of the buckets its Bloom filters name", "event-id index", nil
	}
	if stage == "TSPROXY_BUCKET_SCAN" {
		n, err := buckets.CountDocuments(ctx, q.bucketFilter)
		if err != nil {
			return 0, "", "", err
		}
		return n, "1 find sorted by start, then getMores; FerretDB decodes every bucket once", "bucket scan", nil
	}
	if stage != "TSPROXY_BUCKET_ID_LOOKUPS" {
		// The aggregate path: FerretDB decodes every bucket.
		return nBuckets, "scans: a meta prefetch find and the aggregate, each decoding every bucket on FerretDB", "aggregate ($match, $unwind, $match, $sort)", nil
	}
	keys, _ := ex.Lookup("queryPlanner", "winningPlan", "keys").AsInt64OK()
	n, err := buckets.CountDocuments(ctx, q.bucketFilter)
	if err != nil {
		return 0, "", "", err
	}
	// One lookup per bucket found, and one per key that finds none.
	return n, fmt.Sprintf("%d _id lookups", n+keys), "_id point lookups", nil
}

// directExamined: FerretDB reports no executionStats; without pushdown it
// decodes the whole collection.
func directExamined(ctx context.Context, db *mongo.Database, q rangeQuery, nPlain int64) (string, error) {
	var ex bson.Raw
	err := db.RunCommand(ctx, bson.D{{Key: "explain", Value: bson.D{{Key: "find", Value: "plain"}, {Key: "filter", Value: q.filter}, {Key: "sort", Value: bson.D{{Key: "ts", Value: 1}}}}}, {Key: "verbosity", Value: "executionStats"}}).Decode(&ex)
	if err != nil {
		return "", fmt.Errorf("explain direct %s: %w", q.name, err)
	}
	if n, ok := ex.Lookup("executionStats", "totalDocsExamined").AsInt64OK(); ok {
		return fmt.Sprint(n), nil
	}
	push, _ := ex.Lookup("filterPushdown").BooleanOK()
	if push {
		return "? (pushdown)", nil
	}
	return fmt.Sprintf("%d (no pushdown: all)", nPlain), nil
}
