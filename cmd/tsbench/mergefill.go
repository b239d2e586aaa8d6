package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/cmd/tsbench/internal/benchenv"
)

// mergeFills are the slots per series written before the timed merge: an
// empty window, a quarter, half, and all but the last 10 of an hour.
var mergeFills = []int{0, 900, 1800, 3590}

// benchMergeFill times the merge of a few events (one per series) into
// windows already filled to mergeFills, for the slots layouts
// (layoutCases) and a counter of 1-hour windows: on an upstream that
// rewrites a whole document on every update, a merge that rewrites the
// stored window costs more the fuller it is, and a merge runs before every read of a staged rule, so a
// dashboard reading while events arrive pays it on every read.
func benchMergeFill(e *benchenv.Env, runs int) error {
	ctx := context.Background()
	cs, err := e.ConnectBoth(10*time.Minute, 0)
	if err != nil {
		return err
	}
	defer cs.Close()
	db := cs.Proxy.Database("tsbench")
	const probe = 10 // one event per host
	var cases []layoutCase
	for _, lc := range layoutCases {
		if lc.coll != "hits" {
			cases = append(cases, lc)
		}
	}
	// A counter of 1-hour windows: one hit a second on each of 10 pages,
	// so a window holds as many counters a page as slots a host above.
	cases = append(cases, layoutCase{name: "counter, 1-hour window (10 pages, 1 hit/s each)", coll: "hitshour",
		event: func(k int) bson.D {
			return bson.D{{Key: "page", Value: fmt.Sprintf("/p%d", k%10)}, {Key: "ts", Value: layoutBase.Add(time.Duration(k/10) * time.Second)}}
		}})
	took := map[string][]float64{} // ms
	for r := 0; r < runs; r++ {
		for _, lc := range cases {
			for _, fill := range mergeFills {
				coll := db.Collection(lc.coll)
				if err := coll.Drop(ctx); err != nil {
					return err
				}
				from := fill * probe
				if from > 0 {
					if _, err := insertLayout(ctx, coll, lc, 0, from, 1000); err != nil {
						return fmt.Errorf("%s: fill: %w", lc.name, err)
					}
					if _, _, err := tsproxyFlush(ctx, cs.Proxy); err != nil {
						return fmt.Errorf("%s: tsproxyFlush: %w", lc.name, err)
					}
				}
				if _, err := insertLayout(ctx, coll, lc, from, from+probe, 1); err != nil {
					return fmt.Errorf("%s: probe: %w", lc.name, err)
				}
				fr, d, err := tsproxyFlush(ctx, cs.Proxy)
				if err != nil {
					return fmt.Errorf("%s: tsproxyFlush: %w", lc.name, err)
				}
				if fr.events != probe {
					return fmt.Errorf("%s at fill %d: the flush merged %d events, want %d", lc.name, fill, fr.events, probe)
				}
				key := fmt.Sprintf("%s/%d", lc.coll, fill)
				took[key] = append(took[key], float64(d.Microseconds())/1000)
				fmt.Fprintf(os.Stderr, "  %s, fill %d: flush %.1f ms\n", lc.name, fill, float64(d.Microseconds())/1000)
			}
		}
		fmt.Printf("run %d/%d done\n", r+1, runs)
	}
	fmt.Printf("\nmedians of %d runs: tsproxyFlush's ms to merge %d events (one per host, inserted one at a time) into windows holding that many slots per host already\n\n", runs, probe)
	fmt.Print("| layout |")
	for _, f := range mergeFills {
		fmt.Printf(" %d slots |", f)
	}
	fmt.Print("\n|---|")
	for range mergeFills {
		fmt.Print("---:|")
	}
	fmt.Println()
	for _, lc := range cases {
		fmt.Printf("| %s |", lc.name)
		for _, f := range mergeFills {
			fmt.Printf(" %.1f |", benchenv.Median(took[fmt.Sprintf("%s/%d", lc.coll, f)]))
		}
		fmt.Println()
	}
	return nil
}
