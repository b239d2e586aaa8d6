package rules

import (
	"time"
)

// Layouts a rule may choose (Layout says what each stores).
const (
	LayoutEvents = "events"
)

// LeaseCollection holds, in each database with bucketed namespaces, the
// proxies' writer leases on upstreams whose updates are not isolated;
// listCollections through the proxy hides it.
const LeaseCollection = "tsproxy_leases"

// Defaults for a rule's bucket settings.
const (
	DefaultSpan      = time.Hour
	DefaultMaxEvents = 1000
	DefaultMaxBytes  = 1 << 20 // 1 MiB
	// MaxBucketBytes is the largest maxBytes a rule may ask for: well under
	// the upstream's 16 MiB document limit, leaving room for the summaries.
	MaxBucketBytes = 8 << 20
	// MinBucketBytes is the smallest: an event over maxBytes is refused,
	// so a bucket must hold at least a small one.
	MinBucketBytes = 1 << 10
	// BucketCollectionSuffix names the default bucket collection:
	// iot.readings is stored in iot.readings.buckets.
	BucketCollectionSuffix = ".buckets"
)

// Rule says how one namespace is bucketed.
type Rule struct {
	// Namespace is "db.collection", the namespace applications use.
	Namespace string
	// DB and Collection are Namespace split at its first dot.
	DB         string
	Collection string

	// TimeField names the event's BSON date field. Required.
	TimeField string
	// MetaField names the event field that identifies the series; empty
	// when the rule has none (all events share the null series).
	MetaField string

	// Span is the bucket window: an event at time t goes to the bucket
	// whose start is t floored to a multiple of Span since the Unix epoch.
	Span time.Duration
	// MaxEvents bounds the events in one bucket.
	MaxEvents int
	// MaxBytes bounds the summed BSON size of the events in one bucket.
	MaxBytes int64
	// InsertThreshold: a group of at least this many events (same series,
	// same window) in one insert batch is written as a complete bucket
	// document with a plain insert; smaller groups join an open bucket with
	// an upsert. See DESIGN.md for why (update cost on the embedded upstream).
	InsertThreshold int
	// Compression of the events the proxy packs into one binary value
	// (FerretDB's buckets, every staged document): CompressionZstd (also
	// when empty) or CompressionNone, which writes what proxies older
	// than compression read. Readers take both.
	Compression string

	// Aggregates are event fields that get sum/min/max in the bucket.
	Aggregates []string

	// BucketCollection is the collection, in DB, that holds the buckets.
	BucketCollection string

	// Layout is the bucket layout; LayoutEvents unless configured.
	Layout string
	// LayoutOptions are the settings of the counter and slots layouts.
	LayoutOptions LayoutOptions

	// Lifecycle.

	// Rollups are the resolutions, finest first, of the rollup collections
	// maintained on each write (see RollupCollection).
	Rollups []time.Duration
	// ExpireAfter, when positive, removes buckets (and rollup documents)
	// whose window ended more than this long ago.
	ExpireAfter time.Duration
	// ExpireAtWindowEnd, with ExpireAfter 0, removes buckets once their
	// window ended: a created collection's expireAfterSeconds 0, as
	// MongoDB expires a bucket once its whole time range has passed.
	ExpireAtWindowEnd bool
	// SweepInterval is how often the proxy deletes expired buckets on an
	// upstream without TTL indexes.
	SweepInterval time.Duration
	// ShardKey shards the bucket collection on {meta: 1, start: 1} when the
	// upstream is a mongos.
	ShardKey bool
	// PartitionBy, when set (PartitionMonth or PartitionDay), writes the
	// buckets into one collection per period.
	PartitionBy string

	// Ingest is the rule's ingest mode: IngestAuto
	// unless configured.
	Ingest string
	// MergeAfter is how long a staging collection takes no new event
	// before the proxy merges it into buckets.
	MergeAfter time.Duration
	// MaxStaged bounds the events one proxy holds staged for the rule
	// before its inserts wait for a merge.
	MaxStaged int

	// Declared, set on a rule an application created with MongoDB's
	// timeseries option, is what it declared; nil on
	// a config.yaml rule.
	Declared *Timeseries

	// stagePrefix caches StagePrefix for the bucket collection named in
	// stagePrefixOf (NewSet fills it): every staged insert names its
	// collection from it, and a copy of the rule given another bucket
	// collection (a partition's) must not take it.
	stagePrefix, stagePrefixOf string
}

// Expires reports whether r's buckets expire: ExpireAfter after their
// window ended, or at its end (ExpireAtWindowEnd).
func (r *Rule) Expires() bool { return r.ExpireAfter > 0 || r.ExpireAtWindowEnd }

// BucketNamespace is "db.bucketCollection".
func (r *Rule) BucketNamespace() string { return r.DB + "." + r.BucketCollection }

// SpanMillis is Span in milliseconds.
func (r *Rule) SpanMillis() int64 { return r.Span.Milliseconds() }

// WindowStartMillis returns the start, in milliseconds since the Unix epoch,
// of the window that holds the instant ms. It floors toward negative
// infinity so that dates before 1970 fall into the right window too.
func (r *Rule) WindowStartMillis(ms int64) int64 {
	return FloorMillis(ms, r.SpanMillis())
}

// FloorMillis floors ms to a multiple of span (span > 0), toward negative
// infinity.
func FloorMillis(ms, span int64) int64 {
	q := ms / span
	if ms%span != 0 && ms < 0 {
		q--
	}
	return q * span
}
