package rules

import (
	"slices"
	"time"
)

// Rules made by the application: a create with MongoDB's "timeseries"
// option (package rewrite/admin validates it, the proxy's catalog keeps
// the rules in the upstream's catalog collection).

// Where a created rule is kept: one document per namespace in
// CatalogDB.CatalogCollection of the upstream, read by every proxy.
const (
	CatalogDB         = "tsproxy"
	CatalogCollection = "catalog"
)

// Values of Config.CreateTimeseries.
const (
	CreateTimeseriesAuto     = "auto"     // upstream if it has them, else proxy
	CreateTimeseriesProxy    = "proxy"    // the proxy's catalog, always
	CreateTimeseriesUpstream = "upstream" // passed through, always
)

// Granularity buckets: MongoDB's granularity names, the bucketMaxSpanSeconds
// and bucketRoundingSeconds each stands for, finest first.
var granularitySteps = []struct {
	name           string
	span, rounding int64 // seconds
}{
	{"seconds", 3600, 60},
	{"minutes", 86400, 3600},
	{"hours", 2592000, 86400},
}

// GranularitySpan returns the bucketMaxSpanSeconds and bucketRoundingSeconds
// MongoDB gives granularity g, and whether g is a granularity.
func GranularitySpan(g string) (span, rounding int64, ok bool) {
	for _, s := range granularitySteps {
		if s.name == g {
			return s.span, s.rounding, true
		}
	}
	return 0, 0, false
}

// GranularityRank orders granularities finest first (-1 for none), so a
// collMod can tell coarser from finer.
func GranularityRank(g string) int {
	for i, s := range granularitySteps {
		if s.name == g {
			return i
		}
	}
	return -1
}

// Timeseries is what an application declared of a time-series collection,
// as listCollections shows it: a granularity, or (Granularity empty) equal
// bucketMaxSpanSeconds and bucketRoundingSeconds. A rule keeps its Span
// (the windows its buckets are stored by) when a collMod makes the
// declared granularity coarser: the proxy finds buckets by window, so
// existing buckets must stay where they are; MongoDB too treats the
// granularity as a bucketing hint, invisible in the events.
type Timeseries struct {
	Granularity           string
	BucketMaxSpanSeconds  int64
	BucketRoundingSeconds int64
	// EmptyMetaField: metaField "" was declared, which MongoDB 8.0
	// accepts. It is listed as declared; the rule has no metaField (its
	// "" field is stored in each event like any other field).
	EmptyMetaField bool
}

// TimeseriesOf returns how listCollections shows r: its declared options
// for a created rule; for a config rule, the granularity whose span is its
// span, else its span as bucketMaxSpanSeconds and bucketRoundingSeconds.
func (r *Rule) TimeseriesOf() Timeseries {
	if r.Declared != nil {
		ts := *r.Declared
		if ts.Granularity != "" {
			ts.BucketMaxSpanSeconds, ts.BucketRoundingSeconds, _ = GranularitySpan(ts.Granularity)
		}
		return ts
	}
	secs := int64(r.Span / time.Second)
	for _, s := range granularitySteps {
		if s.span == secs {
			return Timeseries{Granularity: s.name, BucketMaxSpanSeconds: s.span, BucketRoundingSeconds: s.rounding}
		}
	}
	return Timeseries{BucketMaxSpanSeconds: secs, BucketRoundingSeconds: secs}
}

// Created is a rule made by a create command; see NewCreatedRule.
type Created struct {
	DB, Collection string
	TimeField      string
	MetaField      string
	Declared       Timeseries
	// Span is the window of the rule's buckets, in seconds: the declared
	// bucketMaxSpanSeconds at create time (see Timeseries).
	SpanSeconds int64
	// ExpireAfterSeconds: events expire this long after their bucket's
	// window ended; 0 keeps them for ever unless ExpireAtWindowEnd.
	ExpireAfterSeconds int64
	// ExpireAtWindowEnd: expireAfterSeconds 0 was given (MongoDB's "once
	// the bucket's whole time range has passed"), with ExpireAfterSeconds 0.
	ExpireAtWindowEnd bool
	// Aggregates are the measurements an index was created on: every
	// bucket written since keeps their min and max (MongoDB keeps
	// control.min/max of every field).
	Aggregates []string
}

// Expires reports whether c's events expire at all.
func (c Created) Expires() bool { return c.ExpireAfterSeconds > 0 || c.ExpireAtWindowEnd }

// NewCreatedRule is the rule of a created time-series collection: the
// events layout with the rule defaults (auto ingest, 1000 events a
// bucket), MongoDB's metaField and timeField, buckets of SpanSeconds.
func NewCreatedRule(c Created) Rule {
	declared := c.Declared
	if declared.Granularity != "" {
		declared.BucketMaxSpanSeconds, declared.BucketRoundingSeconds, _ = GranularitySpan(declared.Granularity)
	}
	r := Rule{
		DB:          c.DB,
		Collection:  c.Collection,
		Namespace:   c.DB + "." + c.Collection,
		TimeField:   c.TimeField,
		MetaField:   c.MetaField,
		Span:        time.Duration(c.SpanSeconds) * time.Second,
		Ingest:      DefaultIngest,
		MergeAfter:  DefaultMergeAfter,
		MaxStaged:   DefaultMaxStaged,
		ExpireAfter: time.Duration(c.ExpireAfterSeconds) * time.Second,
		Declared:    &declared,
		Aggregates:  slices.Clone(c.Aggregates),
	}
	r.ExpireAtWindowEnd = c.ExpireAtWindowEnd && r.ExpireAfter == 0
	if r.Expires() {
		r.SweepInterval = DefaultSweepInterval
	}
	fillDefaults(&r)
	return r
}

// CreatedOf is the Created a created rule was made of (rule.Declared set).
func (r *Rule) CreatedOf() Created {
	c := Created{
		DB: r.DB, Collection: r.Collection,
		TimeField: r.TimeField, MetaField: r.MetaField,
		SpanSeconds:        int64(r.Span / time.Second),
		ExpireAfterSeconds: int64(r.ExpireAfter / time.Second),
		ExpireAtWindowEnd:  r.ExpireAtWindowEnd && r.ExpireAfter == 0,
		Aggregates:         slices.Clone(r.Aggregates),
	}
	if r.Declared != nil {
		c.Declared = *r.Declared
	}
	return c
}

// WithRules returns a Set of s's rules followed by extra (a namespace s
// already has keeps s's rule).
func (s *Set) WithRules(extra []Rule) *Set {
	all := make([]Rule, 0, s.Len()+len(extra))
	all = append(all, s.All()...)
	all = append(all, extra...)
	return NewSet(all)
}
