package admin

import (
	"strings"
	"testing"
	"time"

	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
)

// MongoDB refuses a time-series (clustered) collection's expireAfterSeconds
// greater than the seconds since the epoch (index_key_validate.cpp,
// validateExpireAfterSeconds: InvalidOptions "TTL index 'expireAfterSeconds'
// option must be within an acceptable range, try a lower number";
// jstests/core/timeseries/timeseries_create_collection.js:
// NumberLong("4611686018427387904") -> InvalidOptions). The proxy accepted
// any int64, and the rule's time.Duration overflowed. The bound is pinned
// from both sides: a day past now is refused, a day before it taken.
func TestCreateHugeExpireAfterSeconds(t *testing.T) {
	now := time.Now().Unix()
	ok := rwtest.Doc(t, D{{Key: "create", Value: "w"}, {Key: "timeseries", Value: D{{Key: "timeField", Value: "t"}}}, {Key: "expireAfterSeconds", Value: now - 86400}})
	if c, err := ParseTimeseriesCreate(ok, "db"); err != nil || c.ExpireAfterSeconds != now-86400 {
		t.Fatalf("expireAfterSeconds a day under the bound: %+v, %v", c, err)
	}
	for _, n := range []int64{4611686018427387904, 36028797018967568, 10_000_000_000, now + 86400} {
		body := rwtest.Doc(t, D{{Key: "create", Value: "w"}, {Key: "timeseries", Value: D{{Key: "timeField", Value: "t"}}}, {Key: "expireAfterSeconds", Value: n}})
		c, err := ParseTimeseriesCreate(body, "db")
		if err == nil {
			rule := rules.NewCreatedRule(c)
			t.Errorf("expireAfterSeconds %d accepted; the rule expires events after %v (listed as %d)", n, rule.ExpireAfter, int64(rule.ExpireAfter/time.Second))
			continue
		}
		if codeOf(err) != mongoerr.InvalidOptions || !strings.Contains(err.Error(), "acceptable range") {
			t.Errorf("expireAfterSeconds %d: %v, want InvalidOptions (acceptable range)", n, err)
		}
	}
}

// The same bound for collMod (coll_mod.idl: safeInt64, validated with
// validateExpireAfterSeconds for clustered collections).
func TestCollModHugeExpireAfterSeconds(t *testing.T) {
	rule := rules.NewCreatedRule(rules.Created{DB: "db", Collection: "w", TimeField: "t", Declared: rules.Timeseries{Granularity: "seconds"}, SpanSeconds: 3600})
	body := rwtest.Doc(t, D{{Key: "collMod", Value: "w"}, {Key: "expireAfterSeconds", Value: int64(36028797018967568)}})
	c, err := ParseTimeseriesCollMod(body, &rule)
	if err == nil {
		r := rules.NewCreatedRule(c)
		t.Fatalf("collMod expireAfterSeconds 36028797018967568 accepted; the rule expires events after %v", r.ExpireAfter)
	}
	if codeOf(err) != mongoerr.InvalidOptions || !strings.Contains(err.Error(), "acceptable range") {
		t.Fatalf("collMod expireAfterSeconds 36028797018967568: %v, want InvalidOptions (acceptable range)", err)
	}
}

// MongoDB 6.3+ (timeseries_options.cpp, isTimeseriesGranularityValidAndUnchanged):
// a collection with custom bucketing may take a granularity whose
// bucketMaxSpanSeconds is not shorter than its own (600 s -> "seconds",
// 3600 s); only a shorter span is refused ("needs to be equal or greater
// to transition").
func TestCollModCustomToGranularity(t *testing.T) {
	custom := rules.NewCreatedRule(rules.Created{DB: "db", Collection: "w", TimeField: "t",
		Declared: rules.Timeseries{BucketMaxSpanSeconds: 600, BucketRoundingSeconds: 600}, SpanSeconds: 600})
	body := rwtest.Doc(t, D{{Key: "collMod", Value: "w"}, {Key: "timeseries", Value: D{{Key: "granularity", Value: "seconds"}}}})
	got, err := ParseTimeseriesCollMod(body, &custom)
	want := rules.Timeseries{Granularity: "seconds", BucketMaxSpanSeconds: 3600, BucketRoundingSeconds: 60}
	if err != nil || got.Declared != want {
		t.Fatalf("collMod {granularity: seconds} of a 600 s custom collection: %+v, %v; MongoDB accepts it", got.Declared, err)
	}
}
