package rules

import (
	"reflect"
	"testing"
	"time"
)

func TestGranularity(t *testing.T) {
	for _, c := range []struct {
		g              string
		span, rounding int64
		rank           int
	}{
		{"seconds", 3600, 60, 0},
		{"minutes", 86400, 3600, 1},
		{"hours", 2592000, 86400, 2},
	} {
		span, rounding, ok := GranularitySpan(c.g)
		if !ok || span != c.span || rounding != c.rounding || GranularityRank(c.g) != c.rank {
			t.Errorf("%s: %d %d %v rank %d", c.g, span, rounding, ok, GranularityRank(c.g))
		}
	}
	if _, _, ok := GranularitySpan("days"); ok || GranularityRank("days") != -1 {
		t.Error("days is no granularity")
	}
}

func TestTimeseriesOf(t *testing.T) {
	config := func(span time.Duration) *Rule { return &Rule{Span: span} }
	cases := []struct {
		rule *Rule
		want Timeseries
	}{
		{config(time.Hour), Timeseries{Granularity: "seconds", BucketMaxSpanSeconds: 3600, BucketRoundingSeconds: 60}},
		{config(24 * time.Hour), Timeseries{Granularity: "minutes", BucketMaxSpanSeconds: 86400, BucketRoundingSeconds: 3600}},
		{config(10 * time.Minute), Timeseries{BucketMaxSpanSeconds: 600, BucketRoundingSeconds: 600}},
		// A created rule shows what was declared, its stored span aside
		// (a collMod made it coarser).
		{&Rule{Span: time.Hour, Declared: &Timeseries{Granularity: "hours"}}, Timeseries{Granularity: "hours", BucketMaxSpanSeconds: 2592000, BucketRoundingSeconds: 86400}},
	}
	for _, c := range cases {
		if got := c.rule.TimeseriesOf(); got != c.want {
			t.Errorf("span %s: %+v, want %+v", c.rule.Span, got, c.want)
		}
	}
}

func TestNewCreatedRule(t *testing.T) {
	c := Created{DB: "db", Collection: "w", TimeField: "ts", MetaField: "m", Declared: Timeseries{Granularity: "minutes"}, SpanSeconds: 86400, ExpireAfterSeconds: 60}
	r := NewCreatedRule(c)
	if r.Namespace != "db.w" || r.Layout != LayoutEvents || r.BucketCollection != "w.buckets" || r.Span != 24*time.Hour ||
		r.ExpireAfter != time.Minute || r.SweepInterval != DefaultSweepInterval || r.Ingest != DefaultIngest || r.Declared == nil {
		t.Fatalf("%+v", r)
	}
	back := r.CreatedOf()
	c.Declared.BucketMaxSpanSeconds, c.Declared.BucketRoundingSeconds = 86400, 3600
	if !reflect.DeepEqual(back, c) {
		t.Fatalf("CreatedOf: %+v, want %+v", back, c)
	}
	// Config rules come first: a created rule of the same name is not
	// routed by.
	set := NewSet([]Rule{{DB: "db", Collection: "w", Namespace: "db.w", TimeField: "time"}}).WithRules([]Rule{r})
	if got := set.Lookup("db", "w"); got == nil || got.Declared != nil {
		t.Fatalf("Lookup after WithRules: %+v", got)
	}
}
