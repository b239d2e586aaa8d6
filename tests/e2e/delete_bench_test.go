package e2e

import (
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// TestDeleteBench times deletes through the proxy on buckets against the
// same deletes directly on a plain collection, interleaved in one run, and
// prints medians and their ratio. It runs only with
// TSPROXY_DELETE_BENCH=<runs>: 10 series of 10-second data over 3 hours
// (10,800 events, 30 buckets of 360 events), merged into buckets
// (tsproxyFlush) before the deletes.
func TestDeleteBench(t *testing.T) {
	runs := 0
	fmt.Sscan(os.Getenv("TSPROXY_DELETE_BENCH"), &runs)
	if runs <= 0 {
		t.Skip("set TSPROXY_DELETE_BENCH=<runs> to run")
	}
	ctx := ctxFor(t)
	base := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	at := func(m int) time.Time { return base.Add(time.Duration(m) * time.Minute) }
	ops := []struct {
		name   string
		filter bson.D
		one    bool
	}{
		{"deleteMany meta (3 whole buckets)", bson.D{{Key: "sensorId", Value: "s0"}}, false},
		{"deleteMany 1h range across 2 windows, 9 series (18 partial buckets)", bson.D{{Key: "ts", Value: bson.D{{Key: "$gte", Value: at(30)}, {Key: "$lt", Value: at(90)}}}}, false},
		{"deleteMany residual value<36 (27 partial buckets)", bson.D{{Key: "value", Value: bson.D{{Key: "$lt", Value: 36}}}}, false},
		{"deleteOne by _id, the first after a merge (reads the event-id index whole)", nil, true},
		{"deleteOne by _id, the next (the event-id index kept)", nil, true},
	}
	times := make([][2][]time.Duration, len(ops))
	for run := range runs {
		db := uniqueDB(t)
		p := startProxy(t, proxyOptions{yaml: readingsRule(db, 1000)})
		cols := [2]*mongo.Collection{connect(t, p.URI()).Database(db).Collection("readings"), direct(t).Database(db).Collection("plain")}
		var docs []any
		var oneIDs []bson.ObjectID // the deleteOnes' events, in order
		for s := range 10 {
			for i := range 1080 {
				id := bson.NewObjectID()
				if (s == 5 || s == 7) && i == 1000 {
					oneIDs = append(oneIDs, id)
				}
				docs = append(docs, bson.D{{Key: "_id", Value: id}, {Key: "ts", Value: base.Add(time.Duration(i*10) * time.Second)}, {Key: "sensorId", Value: fmt.Sprintf("s%d", s)}, {Key: "value", Value: float64(i % 360)}})
			}
		}
		for _, c := range cols {
			for i := 0; i < len(docs); i += 1000 {
				if _, err := c.InsertMany(ctx, docs[i:min(i+1000, len(docs))]); err != nil {
					t.Fatal(err)
				}
			}
		}
		// The deletes are timed on complete buckets: a delete of a rule
		// with staged events merges them first, which the first delete
		// timed would pay for all.
		flush(t, ctx, cols[0].Database().Client(), db+".readings")
		ones := 0
		for k, op := range ops {
			var n [2]int64
			for j := range 2 {
				side := (j + run) % 2 // alternate which side goes first
				t0 := time.Now()
				var res *mongo.DeleteResult
				var err error
				if op.one {
					res, err = cols[side].DeleteOne(ctx, bson.D{{Key: "_id", Value: oneIDs[ones]}})
				} else {
					res, err = cols[side].DeleteMany(ctx, op.filter)
				}
				if err != nil {
					t.Fatalf("%s: %v", op.name, err)
				}
				times[k][side] = append(times[k][side], time.Since(t0))
				n[side] = res.DeletedCount
			}
			if n[0] != n[1] || (op.one && n[0] != 1) {
				t.Fatalf("%s: proxy deleted %d, direct %d", op.name, n[0], n[1])
			}
			if op.one {
				ones++
			}
		}
		for _, c := range cols {
			if err := c.Drop(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	med := func(d []time.Duration) time.Duration {
		s := slices.Clone(d)
		slices.Sort(s)
		return s[len(s)/2]
	}
	fmt.Printf("| delete | proxy ms | direct ms | proxy/direct |\n|---|---:|---:|---:|\n")
	for k, op := range ops {
		pm, dm := med(times[k][0]), med(times[k][1])
		fmt.Printf("| %s | %.1f | %.1f | %.2f |\n", op.name, float64(pm.Microseconds())/1000, float64(dm.Microseconds())/1000, float64(pm)/float64(dm))
	}
}
