package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// reporter is what the comparisons of answers need of a test: a
// *testing.T, or a findingsOnly that logs instead of failing.
type reporter interface {
	Helper()
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
}

// findingsOnly reports a plain collection's answer that differs from
// MongoDB's as a finding about the upstream, not a failure of the proxy.
type findingsOnly struct{ t *testing.T }

func (f findingsOnly) Helper() { f.t.Helper() }
func (f findingsOnly) Errorf(format string, args ...any) {
	f.t.Logf("finding (the upstream's own answer differs from MongoDB's): "+format, args...)
}
func (f findingsOnly) Fatalf(format string, args ...any) { f.Errorf(format, args...) }

// plainReference is how the answers of the upstream on a plain collection
// are checked: as MongoDB's, failing the test, where the upstream sums
// as MongoDB does (a MongoDB given by TSPROXY_E2E_UPSTREAM) or is one of
// this run's FerretDBs, whose plain answers these tests already pinned;
// as findings elsewhere (FerretDB 2.x over DocumentDB: naive sums,
// $min over mixed types), where the proxy answers as MongoDB and the
// upstream does not.
func plainReference(t *testing.T) reporter {
	if !env.external || upstreamSumsExact(t) {
		return t
	}
	return findingsOnly{t}
}

var sumsExact struct {
	once  sync.Once
	exact bool
}

// upstreamSumsExact says whether the upstream's $sum of 0.1, 0.2 and 0.3
// is 0.6 to the last bit, as MongoDB's compensated summation gives.
func upstreamSumsExact(t *testing.T) bool {
	sumsExact.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		coll := direct(t).Database("tsproxy_e2e_probe").Collection(fmt.Sprintf("sums_%d", time.Now().UnixNano()))
		defer func() { _ = coll.Drop(ctx) }()
		if _, err := coll.InsertMany(ctx, []any{bson.D{{Key: "v", Value: 0.1}}, bson.D{{Key: "v", Value: 0.2}}, bson.D{{Key: "v", Value: 0.3}}}); err != nil {
			t.Logf("sums not probed: %v", err)
			return
		}
		cur, err := coll.Aggregate(ctx, bson.A{bson.D{{Key: "$group", Value: bson.D{{Key: "_id", Value: nil}, {Key: "s", Value: bson.D{{Key: "$sum", Value: "$v"}}}}}}})
		if err != nil {
			return
		}
		var out []struct{ S float64 }
		if err := cur.All(ctx, &out); err == nil && len(out) == 1 {
			sumsExact.exact = out[0].S == 0.6
		}
	})
	return sumsExact.exact
}

// ttlWait is how long a test waits for expired events to go: within
// wait where the proxy's sweeper removes them (this run's FerretDBs), or
// up to 150 s on an external upstream, where a TTL index may remove them
// and its monitor runs once a minute (MongoDB's; DocumentDB's is a
// pg_cron job of the same period).
func ttlWait(wait time.Duration) time.Duration {
	if env.external {
		return max(wait, 150*time.Second)
	}
	return wait
}

var ferretKind struct {
	once   sync.Once
	ferret bool
}

// leasedWrites says whether the proxy writes buckets under writer leases
// on this run's upstream: on every FerretDB (v1.24: updates not isolated;
// 2.x: no retryable writes, which the proxy probes), not on a MongoDB
// replica set. The test tells a FerretDB by its buildInfo (a test may
// know what it runs on; the proxy probes). A MongoDB standalone, which
// keeps no retryable writes either, is not told apart here.
func leasedWrites(t *testing.T) bool {
	if !env.external {
		return true
	}
	ferretKind.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var info bson.M
		if err := direct(t).Database("admin").RunCommand(ctx, bson.D{{Key: "buildInfo", Value: 1}}).Decode(&info); err != nil {
			return
		}
		_, v1 := info["ferretdbVersion"]
		_, v2 := info["ferretdb"]
		ferretKind.ferret = v1 || v2
	})
	return ferretKind.ferret
}
