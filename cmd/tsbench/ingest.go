package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/tsproxy/tsproxy/rules"
)

// ingestRules buckets tsbench.events: 1-second data in 1-hour buckets;
// threshold is the insertThreshold (0: the default).
func ingestRules(threshold int) ([]rules.Rule, error) {
	yaml := `rules:
  - namespace: tsbench.events
    timeField: ts
    metaField: sensor
    bucket: {span: 1h, maxEvents: 3600%s}
    aggregates: [value]
`
	if threshold > 0 {
		yaml = fmt.Sprintf(yaml, fmt.Sprintf(", insertThreshold: %d", threshold))
	} else {
		yaml = fmt.Sprintf(yaml, "")
	}
	return rulesFromYAML(yaml)
}

type ingestCase struct{ batch, conc int }

var allIngestCases = []ingestCase{{1000, 1}, {1000, 16}, {100, 1}, {100, 16}, {1, 1}, {1, 16}}

// parseCases reads "batch/clients,..." ("" is every case).
func parseCases(s string) ([]ingestCase, error) {
	if s == "" {
		return allIngestCases, nil
	}
	var cs []ingestCase
	for _, part := range strings.Split(s, ",") {
		var c ingestCase
		if _, err := fmt.Sscanf(part, "%d/%d", &c.batch, &c.conc); err != nil || c.batch < 1 || c.conc < 1 {
			return nil, fmt.Errorf("-cases: %q is not batch/clients (e.g. 1000/16)", part)
		}
		cs = append(cs, c)
	}
	return cs, nil
}

// benchIngest inserts the same events through the proxy into buckets and
// directly as plain documents, for each batch size and concurrency, and
// reports events/s and what each layout stores.
func benchIngest(e *benchEnv, runs, events int, only string) error {
	cases, err := parseCases(only)
	if err != nil {
		return err
	}
	ctx := context.Background()
	cs, err := e.connectBoth(10*time.Minute, 32)
	if err != nil {
		return err
	}
	defer cs.close()
	proxyC, directC := cs.proxy, cs.direct
	type key struct {
		c    ingestCase
		path string
	}
	rates := map[key][]float64{}
	cpus := map[key][]float64{}
	var lastStats map[string]collStats
	for r := 0; r < runs; r++ {
		for _, c := range cases {
			n := events
			if c.batch == 1 {
				n = min(events, 2000*c.conc) // batch 1 is slow by nature; see README
			}
			for _, path := range []string{"direct", "proxy"} {
				client, coll := directC, "plain"
				if path == "proxy" {
					client, coll = proxyC, "events"
				}
				dropIngest(ctx, directC, proxyC)
				cpu0 := processCPU()
				rate, err := ingest(ctx, client.Database("tsbench").Collection(coll), n, c)
				if err != nil {
					return fmt.Errorf("%s batch %d conc %d: %w", path, c.batch, c.conc, err)
				}
				cpu := float64((processCPU() - cpu0).Nanoseconds()) / 1e3 / float64(n)
				rates[key{c, path}] = append(rates[key{c, path}], rate)
				cpus[key{c, path}] = append(cpus[key{c, path}], cpu)
				fmt.Fprintf(os.Stderr, "  %s batch %d clients %d: %d events, %.0f events/s, %.1f CPU µs/event\n", path, c.batch, c.conc, n, rate, cpu)
			}
		}
		fmt.Printf("run %d/%d done\n", r+1, runs)
	}
	// Storage, measured once on the full event count with batch 1000.
	dropIngest(ctx, directC, proxyC)
	if _, err := ingest(ctx, directC.Database("tsbench").Collection("plain"), events, ingestCase{1000, 1}); err != nil {
		return err
	}
	if _, err := ingest(ctx, proxyC.Database("tsbench").Collection("events"), events, ingestCase{1000, 1}); err != nil {
		return err
	}
	lastStats = map[string]collStats{}
	for _, coll := range []string{"plain", "events.buckets"} {
		st, err := stats(ctx, directC.Database("tsbench"), coll)
		if err != nil {
			return err
		}
		lastStats[coll] = st
	}
	fmt.Printf("\nmedians of %d runs; %d events per case (batch 1: %d per client), 1-second data, 10 series; the clients take batches of consecutive events from one queue\n\n", runs, events, 2000)
	fmt.Println("CPU µs/event: CPU time of the whole process (clients, proxy and embedded upstream) per event, less sensitive than events/s to other load on the machine")
	fmt.Println()
	fmt.Println("| batch | clients | direct events/s | proxy events/s | proxy/direct | direct CPU µs/event | proxy CPU µs/event |")
	fmt.Println("|---:|---:|---:|---:|---:|---:|---:|")
	for _, c := range cases {
		d, p := median(rates[key{c, "direct"}]), median(rates[key{c, "proxy"}])
		dc, pc := median(cpus[key{c, "direct"}]), median(cpus[key{c, "proxy"}])
		fmt.Printf("| %d | %d | %.0f | %.0f | %.2f | %.1f | %.1f |\n", c.batch, c.conc, d, p, p/d, dc, pc)
	}
	pl, bu := lastStats["plain"], lastStats["events.buckets"]
	fmt.Printf("\n%d events, collStats:\n\n", events)
	fmt.Println("| layout | documents | data bytes | index bytes |")
	fmt.Println("|---|---:|---:|---:|")
	fmt.Printf("| plain (direct) | %d | %d | %d |\n", pl.count, pl.size, pl.indexSize)
	fmt.Printf("| buckets (proxy) | %d | %d | %d |\n", bu.count, bu.size, bu.indexSize)
	fmt.Printf("| ratio plain/buckets | %.0fx | %.1fx | %.1fx |\n", ratio(pl.count, bu.count), ratio(pl.size, bu.size), ratio(pl.indexSize, bu.indexSize))
	return nil
}

func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// dropIngest empties both layouts; the bucketed one through the proxy,
// as an app would, so the proxy also forgets what it knew of its buckets.
func dropIngest(ctx context.Context, direct, proxied *mongo.Client) {
	_ = direct.Database("tsbench").Collection("plain").Drop(ctx)
	_ = proxied.Database("tsbench").Collection("events").Drop(ctx)
}

// ingest writes n events of 10 series at 1-second cadence in batches of
// c.batch events, consecutive in time, that c.conc clients take in turn
// from a shared queue (as concurrent writers of one stream of events
// would); it returns events per second. Every batch but the last holds
// exactly c.batch events, on both paths.
func ingest(ctx context.Context, coll *mongo.Collection, n int, c ingestCase) (float64, error) {
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	batches := (n + c.batch - 1) / c.batch
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, c.conc)
	t0 := time.Now()
	for g := 0; g < c.conc; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			batch := make([]any, 0, c.batch)
			for {
				b := int(next.Add(1) - 1)
				if b >= batches {
					return
				}
				batch = batch[:0]
				for k := b * c.batch; k < min(n, (b+1)*c.batch); k++ {
					// series = k%10, one event per second per series
					batch = append(batch, bson.D{
						{Key: "ts", Value: base.Add(time.Duration(k/10) * time.Second)},
						{Key: "sensor", Value: fmt.Sprintf("s%02d", k%10)},
						{Key: "value", Value: float64(k%1000) / 10},
					})
				}
				var err error
				if len(batch) == 1 {
					_, err = coll.InsertOne(ctx, batch[0])
				} else {
					_, err = coll.InsertMany(ctx, batch)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return 0, err
	}
	return float64(n) / time.Since(t0).Seconds(), nil
}

type collStats struct{ count, size, indexSize int64 }

func stats(ctx context.Context, db *mongo.Database, coll string) (collStats, error) {
	var r bson.Raw
	if err := db.RunCommand(ctx, bson.D{{Key: "collStats", Value: coll}}).Decode(&r); err != nil {
		return collStats{}, fmt.Errorf("collStats %s: %w", coll, err)
	}
	get := func(k string) int64 { v, _ := r.Lookup(k).AsInt64OK(); return v }
	return collStats{count: get("count"), size: get("size"), indexSize: get("totalIndexSize")}, nil
}

// processCPU is the user and system CPU time the process has used so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
