package main

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/tsproxy/tsproxy/cmd/tsbench/internal/benchenv"
)

type latencyResult struct{ p50, p99 []float64 } // microseconds, one per run

// benchPassthrough measures ping and a small find (one document by a string
// _id, which FerretDB answers with an indexed lookup)
// direct and through the proxy, runs interleaved so that both see the same
// machine load.
func benchPassthrough(e *benchenv.Env, runs, n int, dur time.Duration) error {
	ctx := context.Background()
	clients := map[string]*mongo.Client{}
	for name, uri := range map[string]string{"direct": e.UpstreamURI, "proxy": e.ProxyURI} {
		c, err := mongo.Connect(options.Client().ApplyURI(uri).SetMaxPoolSize(64))
		if err != nil {
			return err
		}
		defer c.Disconnect(ctx)
		clients[name] = c
	}
	coll := clients["direct"].Database("tsbench").Collection("small")
	_ = coll.Drop(ctx)
	docs := make([]any, 100)
	for i := range docs {
		docs[i] = bson.D{{Key: "_id", Value: fmt.Sprintf("k%03d", i)}, {Key: "name", Value: fmt.Sprintf("doc-%d", i)}, {Key: "v", Value: i * 3}}
	}
	if _, err := coll.InsertMany(ctx, docs); err != nil {
		return err
	}
	ops := map[string]func(c *mongo.Client, i int) error{
		"ping": func(c *mongo.Client, _ int) error {
			return c.Database("admin").RunCommand(ctx, bson.D{{Key: "ping", Value: 1}}).Err()
		},
		"find": func(c *mongo.Client, i int) error {
			return c.Database("tsbench").Collection("small").FindOne(ctx, bson.D{{Key: "_id", Value: fmt.Sprintf("k%03d", i%100)}}).Err()
		},
	}
	targets := []string{"direct", "proxy"}
	lat := map[string]*latencyResult{}
	thr := map[string][]float64{}
	for _, op := range []string{"ping", "find"} {
		for _, t := range targets {
			lat[op+"/"+t] = &latencyResult{}
			for i := 0; i < 500; i++ { // warm up pools and caches
				if err := ops[op](clients[t], i); err != nil {
					return fmt.Errorf("%s %s: %w", t, op, err)
				}
			}
		}
	}
	for r := 0; r < runs; r++ {
		for _, op := range []string{"ping", "find"} {
			for _, t := range targets {
				p50, p99, err := measureLatency(clients[t], ops[op], n)
				if err != nil {
					return fmt.Errorf("%s %s: %w", t, op, err)
				}
				lat[op+"/"+t].p50 = append(lat[op+"/"+t].p50, p50)
				lat[op+"/"+t].p99 = append(lat[op+"/"+t].p99, p99)
				ops16, err := measureThroughput(clients[t], ops[op], 16, dur)
				if err != nil {
					return fmt.Errorf("%s %s: %w", t, op, err)
				}
				thr[op+"/"+t] = append(thr[op+"/"+t], ops16)
			}
		}
		fmt.Printf("run %d/%d done\n", r+1, runs)
	}
	fmt.Printf("\nmedians of %d runs; latency over %d sequential ops; throughput with 16 concurrent clients for %s\n\n", runs, n, dur)
	fmt.Println("| op | path | p50 µs | p99 µs | ops/s (16 clients) |")
	fmt.Println("|---|---|---:|---:|---:|")
	for _, op := range []string{"ping", "find"} {
		for _, t := range targets {
			k := op + "/" + t
			fmt.Printf("| %s | %s | %.0f | %.0f | %.0f |\n", op, t, benchenv.Median(lat[k].p50), benchenv.Median(lat[k].p99), benchenv.Median(thr[k]))
		}
	}
	fmt.Println()
	fmt.Println("| op | added p50 µs | added p99 µs | throughput proxy/direct |")
	fmt.Println("|---|---:|---:|---:|")
	for _, op := range []string{"ping", "find"} {
		d, p := lat[op+"/direct"], lat[op+"/proxy"]
		fmt.Printf("| %s | %+.0f | %+.0f | %.2f |\n", op, benchenv.Median(p.p50)-benchenv.Median(d.p50), benchenv.Median(p.p99)-benchenv.Median(d.p99),
			benchenv.Median(thr[op+"/proxy"])/benchenv.Median(thr[op+"/direct"]))
	}
	return nil
}

func measureLatency(c *mongo.Client, op func(*mongo.Client, int) error, n int) (p50, p99 float64, err error) {
	ds := make([]time.Duration, n)
	for i := 0; i < n; i++ {
		t0 := time.Now()
		if err := op(c, i); err != nil {
			return 0, 0, err
		}
		ds[i] = time.Since(t0)
	}
	sort.Slice(ds, func(a, b int) bool { return ds[a] < ds[b] })
	return float64(benchenv.Percentile(ds, 0.50).Microseconds()), float64(benchenv.Percentile(ds, 0.99).Microseconds()), nil
}

func measureThroughput(c *mongo.Client, op func(*mongo.Client, int) error, conc int, dur time.Duration) (float64, error) {
	var count atomic.Int64
	var firstErr atomic.Value
	deadline := time.Now().Add(dur)
	var wg sync.WaitGroup
	for g := 0; g < conc; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := g; time.Now().Before(deadline); i += conc {
				if err := op(c, i); err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				count.Add(1)
			}
		}(g)
	}
	wg.Wait()
	if err, ok := firstErr.Load().(error); ok {
		return 0, err
	}
	return float64(count.Load()) / dur.Seconds(), nil
}
