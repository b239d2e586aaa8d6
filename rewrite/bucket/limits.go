package bucket

import (
	"fmt"
	"slices"
	"strings"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
)

// Limits are a rule's bucket settings with defaults applied.
type Limits struct {
	SpanMillis int64
	MaxEvents  int
	MaxBytes   int64
	Threshold  int      // chunks with at least this many events are inserted whole
	Aggregates []string // deduplicated
	// NumbersOnly: the aggregate fields must hold numbers (a rule with
	// rollups, whose documents keep only summaries). Elsewhere an event
	// may hold anything there; its bucket is marked mixed (FieldMixed).
	NumbersOnly bool
	// Packed: buckets written whole keep their events in FieldPacked
	// (caps.Upstream.PackedEvents); the caller sets it.
	Packed bool
	// Compress: packed values (of buckets and staged documents) are
	// written compressed; the rule's bucket.compression.
	Compress bool
}

// LimitsOf rejects a rule the write path cannot apply safely (rules/
// validation should already have), and applies defaults to zero settings.
func LimitsOf(rule *rules.Rule) (Limits, error) {
	if rule == nil {
		return Limits{}, mongoerr.Errorf(mongoerr.InternalError, "no rule")
	}
	bad := func(format string, args ...any) (Limits, error) {
		return Limits{}, mongoerr.Errorf(mongoerr.InternalError, "tsproxy rule %s: %s", rule.Namespace, fmt.Sprintf(format, args...))
	}
	if rule.TimeField == "" {
		return bad("no timeField")
	}
	for _, fields := range [][]string{{rule.TimeField, rule.MetaField}, rule.Aggregates} {
		for _, f := range fields {
			if strings.Contains(f, ".") || strings.HasPrefix(f, "$") || strings.ContainsRune(f, 0) {
				return bad("field name %q: dotted, $-prefixed or NUL names are not supported", f)
			}
		}
	}
	if rule.TimeField == "_id" || rule.MetaField == "_id" || rule.MetaField == rule.TimeField {
		return bad("timeField %q and metaField %q must be distinct and not _id", rule.TimeField, rule.MetaField)
	}
	lim := Limits{
		SpanMillis:  rules.DefaultSpan.Milliseconds(),
		MaxEvents:   rule.MaxEvents,
		MaxBytes:    rule.MaxBytes,
		Threshold:   rule.InsertThreshold,
		NumbersOnly: len(rule.Rollups) > 0,
		Compress:    rule.Compression != rules.CompressionNone,
	}
	if rule.Span != 0 {
		lim.SpanMillis = rule.SpanMillis()
	}
	if lim.SpanMillis <= 0 {
		return bad("span %v is not a positive whole number of milliseconds", rule.Span)
	}
	if lim.MaxEvents <= 0 {
		lim.MaxEvents = rules.DefaultMaxEvents
	}
	if lim.MaxBytes <= 0 {
		lim.MaxBytes = rules.DefaultMaxBytes
	}
	lim.MaxBytes = min(lim.MaxBytes, rules.MaxBucketBytes)
	// Every insert computes its rule's limits: the rule's own slice when
	// it names no aggregate twice (nothing writes to lim.Aggregates),
	// and no map for the few names a rule has.
	dup := false
	for i, a := range rule.Aggregates {
		if a == "" || a == rule.TimeField || (a == rule.MetaField) {
			return bad("aggregate %q must be a field other than the timeField and metaField", a)
		}
		dup = dup || slices.Contains(rule.Aggregates[:i], a)
	}
	lim.Aggregates = rule.Aggregates
	if dup {
		lim.Aggregates = nil
		for _, a := range rule.Aggregates {
			if !slices.Contains(lim.Aggregates, a) {
				lim.Aggregates = append(lim.Aggregates, a)
			}
		}
	}
	return lim, nil
}
