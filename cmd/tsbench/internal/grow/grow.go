// Package grow is `tsbench grow` (issue 59): does a cost of the proxy grow
// with what the rule holds?
package grow

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/tsproxy/tsproxy/cmd/tsbench/internal/benchenv"
	"github.com/tsproxy/tsproxy/rules"
)

// `tsbench grow` (issue 59): does a cost of the proxy grow with what the
// rule holds? 20 series of 1-second data go into a rule and into a plain
// collection indexed {sensor: 1, ts: 1}, the same events, round after
// round of later time, until each size of -sizes; at each size it times,
// on both sides and interleaved, a sustained ingest segment at batch 100
// from 4 clients (its merge, tsproxyFlush, counted in the proxy's time)
// and at batch 1 from one client, then reads: the latest event of a
// series, a find by event _id, a 1-hour range of one series. One row a
// size.

const (
	growSeries  = 20
	growTimed   = 20_000 // events of the timed batch-100 segment
	growTimed1  = 1_000  // events of the timed batch-1 segment
	growLoadBat = 1_000
	growReads   = 5
)

var growBase = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// Rules are the rule the run writes through the proxy.
func Rules() ([]rules.Rule, error) {
	return benchenv.RulesFromYAML(`rules:
  - namespace: tsbench.grow
    timeField: ts
    metaField: sensor
    bucket: {span: 1h, maxEvents: 1000}
`)
}

// ParseSizes reads -sizes: event counts, ascending, with k and M
// suffixes.
func ParseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		mul := 1
		switch {
		case strings.HasSuffix(f, "M"):
			mul, f = 1_000_000, strings.TrimSuffix(f, "M")
		case strings.HasSuffix(f, "k"):
			mul, f = 1_000, strings.TrimSuffix(f, "k")
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("-sizes: %q is not a count of events", f)
		}
		if len(out) > 0 && n*mul <= out[len(out)-1] {
			return nil, fmt.Errorf("-sizes: %s is not above the size before it", f)
		}
		out = append(out, n*mul)
	}
	return out, nil
}

// growRun is the state of one grow benchmark: the next event of each
// series continues its 1-second data.
type growRun struct {
	proxied, plain *mongo.Collection
	proxyC         *mongo.Client
	next           int // events written so far on each side
	// directReadsUpTo: past it, only the proxy's reads are timed.
	directReadsUpTo int
}

// growID is the _id of the i-th event (both sides get the same).
func growID(i int) bson.ObjectID {
	var id bson.ObjectID
	binary.BigEndian.PutUint32(id[0:4], uint32(growBase.Unix())+uint32(i/growSeries))
	binary.BigEndian.PutUint64(id[4:12], uint64(i))
	return id
}

// growEvent is the i-th event: series i%20, second i/20.
func growEvent(i int) bson.D {
	return bson.D{{Key: "_id", Value: growID(i)}, {Key: "ts", Value: growBase.Add(time.Duration(i/growSeries) * time.Second)},
		{Key: "sensor", Value: fmt.Sprintf("s%02d", i%growSeries)}, {Key: "value", Value: float64(i % 1000)}}
}

// Run loads the rule and the plain collection up to each of sizes in
// turn and prints a row of timings at each.
//
// Past directReadsUpTo events the plain collection's reads are not
// timed (FerretDB v1.24 scans it for each: 46 s for the latest event of
// a series at 1,000,000 events): the row says "–".
func Run(e *benchenv.Env, sizes []int, directReadsUpTo int) error {
	ctx := context.Background()
	cs, err := e.ConnectBoth(time.Hour, 0)
	if err != nil {
		return err
	}
	defer cs.Close()
	r := &growRun{proxied: cs.Proxy.Database("tsbench").Collection("grow"), plain: cs.Direct.Database("tsbench").Collection("growplain"), proxyC: cs.Proxy, directReadsUpTo: directReadsUpTo}
	_ = r.proxied.Drop(ctx)
	_ = r.plain.Drop(ctx)
	if _, err := r.plain.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: "sensor", Value: 1}, {Key: "ts", Value: 1}}}); err != nil {
		return err
	}
	fmt.Printf("tsbench grow: %d series of 1-second data, upstream %s; per size: %d events at batch 100 × 4 clients and %d at batch 1 (proxy time includes their merge), reads median of %d\n\n",
		growSeries, e.UpstreamURI, growTimed, growTimed1, growReads)
	fmt.Println("| events in the rule | batch 100 ×4 proxy ev/s | direct ev/s | proxy / direct | batch 1 proxy / direct | latest of a series ms (proxy / direct) | by _id ms | 1-hour range ms | buckets | load s |")
	fmt.Println("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, size := range sizes {
		loadStart := time.Now()
		if err := r.load(ctx, size-growTimed-growTimed1); err != nil {
			return err
		}
		if _, _, err := benchenv.Flush(ctx, r.proxyC); err != nil {
			return err
		}
		load := time.Since(loadStart)
		row, err := r.timeSize(ctx)
		if err != nil {
			return fmt.Errorf("at %d events: %w", size, err)
		}
		buckets, _ := cs.Direct.Database("tsbench").Collection("grow" + rules.BucketCollectionSuffix).EstimatedDocumentCount(ctx)
		fmt.Printf("| %d | %.0f | %.0f | %.2fx | %.2fx | %s | %s | %s | %d | %.0f |\n", r.next,
			row.proxyRate, row.directRate, row.proxyRate/row.directRate, row.batch1,
			pair(row.latest), pair(row.byID), pair(row.hour), buckets, load.Seconds())
	}
	return nil
}

// load writes events on both sides, untimed, until each holds upTo.
func (r *growRun) load(ctx context.Context, upTo int) error {
	for r.next < upTo {
		n := min(growLoadBat*4, upTo-r.next)
		for _, c := range []*mongo.Collection{r.proxied, r.plain} {
			if err := insertParallel(ctx, c, r.next, n, growLoadBat, 4); err != nil {
				return fmt.Errorf("load %s: %w", c.Name(), err)
			}
		}
		r.next += n
	}
	return nil
}

// insertParallel inserts events from..from+n at batch from clients.
func insertParallel(ctx context.Context, c *mongo.Collection, from, n, batch, clients int) error {
	var wg sync.WaitGroup
	errs := make([]error, clients)
	for k := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for start := from + k*batch; start < from+n; start += clients * batch {
				docs := make([]any, 0, batch)
				for i := start; i < min(start+batch, from+n); i++ {
					docs = append(docs, growEvent(i))
				}
				if _, err := c.InsertMany(ctx, docs); err != nil {
					errs[k] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

type growRow struct {
	proxyRate, directRate float64
	batch1                float64
	latest, byID, hour    [2]float64 // ms: proxy, direct
}

// timeSize times the ingest segments and the reads at the current size.
func (r *growRun) timeSize(ctx context.Context) (growRow, error) {
	var row growRow
	from := r.next
	t := time.Now()
	if err := insertParallel(ctx, r.plain, from, growTimed, 100, 4); err != nil {
		return row, err
	}
	direct := time.Since(t)
	t = time.Now()
	if err := insertParallel(ctx, r.proxied, from, growTimed, 100, 4); err != nil {
		return row, err
	}
	if _, _, err := benchenv.Flush(ctx, r.proxyC); err != nil {
		return row, err
	}
	proxy := time.Since(t)
	row.proxyRate, row.directRate = float64(growTimed)/proxy.Seconds(), float64(growTimed)/direct.Seconds()
	from += growTimed
	t = time.Now()
	if err := insertParallel(ctx, r.plain, from, growTimed1, 1, 1); err != nil {
		return row, err
	}
	direct1 := time.Since(t)
	t = time.Now()
	if err := insertParallel(ctx, r.proxied, from, growTimed1, 1, 1); err != nil {
		return row, err
	}
	if _, _, err := benchenv.Flush(ctx, r.proxyC); err != nil {
		return row, err
	}
	row.batch1 = direct1.Seconds() / time.Since(t).Seconds()
	r.next = from + growTimed1
	series := fmt.Sprintf("s%02d", growSeries/2)
	end := growBase.Add(time.Duration(r.next/growSeries) * time.Second)
	reads := []struct {
		out *[2]float64
		run func(c *mongo.Collection) error
	}{
		{&row.latest, func(c *mongo.Collection) error {
			return c.FindOne(ctx, bson.D{{Key: "sensor", Value: series}}, options.FindOne().SetSort(bson.D{{Key: "ts", Value: -1}})).Err()
		}},
		{&row.byID, func(c *mongo.Collection) error {
			return c.FindOne(ctx, bson.D{{Key: "_id", Value: growID(r.next / 2)}}).Err()
		}},
		{&row.hour, func(c *mongo.Collection) error {
			cur, err := c.Find(ctx, bson.D{{Key: "sensor", Value: series}, {Key: "ts", Value: bson.D{{Key: "$gte", Value: end.Add(-90 * time.Minute)}, {Key: "$lt", Value: end.Add(-30 * time.Minute)}}}})
			if err != nil {
				return err
			}
			var docs []bson.Raw
			return cur.All(ctx, &docs)
		}},
	}
	sides := []*mongo.Collection{r.proxied, r.plain}
	if r.next > r.directReadsUpTo {
		sides = sides[:1] // the plain collection's reads scan it: minutes each past a few million
	}
	for _, q := range reads {
		var ms [2][]float64
		for range growReads {
			for side, c := range sides {
				t := time.Now()
				if err := q.run(c); err != nil {
					return row, err
				}
				ms[side] = append(ms[side], float64(time.Since(t).Microseconds())/1000)
			}
		}
		for side := range ms {
			if len(ms[side]) == 0 {
				q.out[side] = math.NaN() // not timed
				continue
			}
			slices.Sort(ms[side])
			q.out[side] = benchenv.Median(ms[side])
		}
	}
	fmt.Fprintf(os.Stderr, "tsbench grow: %d events measured\n", r.next)
	return row, nil
}

// pair prints proxy / direct ms, "–" for a side not timed.
func pair(ms [2]float64) string {
	side := func(v float64) string {
		if math.IsNaN(v) {
			return "–"
		}
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return side(ms[0]) + " / " + side(ms[1])
}
