package rules

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Lifecycle settings of a rule: rollups, retention, sharding.
//
// Rollup collections hold, per series and period of a resolution, the
// count of the acknowledged events and the sum/min/max of each aggregate
// field (schema in RollupCollection's comment and docs/how-it-works.md).

// RollupCollectionInfix joins a rule's collection and a resolution label:
// iot.readings with rollups [1h] keeps iot.readings.rollup_1h.
const RollupCollectionInfix = ".rollup_"

// Lifecycle defaults and bounds.
const (
	// DefaultSweepInterval is how often the proxy's sweeper deletes expired
	// buckets on an upstream without TTL indexes.
	DefaultSweepInterval = time.Minute
	// MinSweepInterval keeps a typo (1ms) from turning the sweeper into a
	// load generator.
	MinSweepInterval = 100 * time.Millisecond
	// MaxRollups bounds the resolutions of one rule: each costs one more
	// upstream update per insert.
	MaxRollups = 8
)

// ParseLifecycleDuration reads a duration as Go does ("90s", "1h30m"),
// plus whole days ("30d", "1d12h" is not accepted: days stand alone).
// "m" is minutes, never months.
func ParseLifecycleDuration(s string) (time.Duration, error) {
	t := strings.TrimSpace(s)
	if n, ok := strings.CutSuffix(t, "d"); ok {
		days, err := strconv.ParseInt(n, 10, 64)
		if err != nil || days <= 0 || days > 365*1000 {
			return 0, fmt.Errorf("%q is not a duration such as 90s, 10m, 1h or 30d", s)
		}
		return time.Duration(days) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(t)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration such as 90s, 10m, 1h or 30d", s)
	}
	return d, nil
}

// DurationLabel writes d in the largest whole unit (d, h, m, s): the
// suffix of a rollup collection's name.
func DurationLabel(d time.Duration) string {
	switch {
	case d%(24*time.Hour) == 0:
		return fmt.Sprintf("%dd", d/(24*time.Hour))
	case d%time.Hour == 0:
		return fmt.Sprintf("%dh", d/time.Hour)
	case d%time.Minute == 0:
		return fmt.Sprintf("%dm", d/time.Minute)
	}
	return fmt.Sprintf("%ds", d/time.Second)
}

// RollupCollection is the collection, in the rule's DB, holding the rollup
// of resolution res. Its documents are
//
//	{_id: ObjectId(period start | hash(rollup namespace, meta, start)),
//	 meta, start: <period start>, count,
//	 sum: {<agg>: n}, min: {<timeField>: date, <agg>: v}, max: {...}}
//
// with one document per (series, period); periods are res-aligned since the
// Unix epoch (UTC days for 1d).
func (r *Rule) RollupCollection(res time.Duration) string {
	return r.Collection + RollupCollectionInfix + DurationLabel(res)
}

// RollupNamespace is "db.<RollupCollection(res)>".
func (r *Rule) RollupNamespace(res time.Duration) string {
	return r.DB + "." + r.RollupCollection(res)
}

// lifecycle decodes rollups, expireAfter, sweepInterval, shardKey and
// partitionBy of the rule at path p.
func (d *decoder) lifecycle(p string, m map[string]any, r *Rule) {
	k := func(name string) string { return p + "." + name }
	r.Rollups = d.rollups(k("rollups"), field(m, "rollups"), r)

	if v := field(m, "expireAfter"); v != nil {
		r.ExpireAfter = d.lifecycleDuration(k("expireAfter"), v)
		if r.ExpireAfter < 0 || (r.ExpireAfter > 0 && r.ExpireAfter%time.Second != 0) {
			d.fail(k("expireAfter"), "%s is not a positive whole number of seconds", show(v))
		} else if r.ExpireAfter == 0 && d.ok(k("expireAfter")) {
			d.fail(k("expireAfter"), "%s is not positive; leave it out to keep buckets forever", show(v))
		}
	}
	if r.ExpireAfter > 0 {
		r.SweepInterval = DefaultSweepInterval
	}
	if v := field(m, "sweepInterval"); v != nil {
		iv := d.lifecycleDuration(k("sweepInterval"), v)
		switch {
		case !d.ok(k("sweepInterval")):
		case r.ExpireAfter == 0 && field(m, "expireAfter") == nil:
			d.fail(k("sweepInterval"), "is set but expireAfter is not; the sweeper only removes expired buckets")
		case iv < MinSweepInterval:
			d.fail(k("sweepInterval"), "%s is less than %s", show(v), MinSweepInterval)
		default:
			r.SweepInterval = iv
		}
	}

	if v := field(m, "shardKey"); v != nil {
		r.ShardKey = d.boolean(k("shardKey"), v)
	}
	// The counter and slots layouts write through their own path, which
	// maintains no rollups and shards nothing: refuse rather than ignore.
	if r.Layout != LayoutEvents {
		for _, name := range []string{"rollups", "shardKey"} {
			if field(m, name) != nil {
				d.fail(k(name), "applies only to layout %s, not %s", LayoutEvents, r.Layout)
			}
		}
	}
}

// lifecycleDuration converts a duration that may be written in days.
func (d *decoder) lifecycleDuration(key string, v any) time.Duration {
	s, ok := v.(string)
	if !ok {
		if dur, isDur := v.(time.Duration); isDur {
			return dur
		}
		d.fail(key, "%s is not a duration such as 90s, 10m, 1h or 30d", show(v))
		return 0
	}
	dur, err := ParseLifecycleDuration(s)
	if err != nil {
		d.fail(key, "%v", err)
		return 0
	}
	return dur
}

// rollups decodes the list of rollup resolutions, sorted finest first.
func (d *decoder) rollups(p string, v any, r *Rule) []time.Duration {
	if v == nil {
		return nil
	}
	items, ok := v.([]any)
	if !ok {
		if s, isStr := v.(string); isStr && s != "" {
			d.fail(p, "must be a list such as [1m, 1h, 1d], not %q", s)
		}
		return nil // other shapes were reported by checkKeys
	}
	if len(items) > MaxRollups {
		d.fail(p, "has %d resolutions; at most %d", len(items), MaxRollups)
		return nil
	}
	seen := map[time.Duration]int{}
	var out []time.Duration
	for i, it := range items {
		key := fmt.Sprintf("%s[%d]", p, i)
		res := d.lifecycleDuration(key, it)
		if !d.ok(key) {
			continue
		}
		switch {
		case res < time.Second || res%time.Second != 0:
			d.fail(key, "%s is not a whole number of seconds, at least 1s", show(it))
			continue
		case seen[res] > 0:
			d.fail(key, "%s repeats %s[%d]", show(it), p, seen[res]-1)
			continue
		}
		seen[res] = i + 1
		out = append(out, res)
		if r.Collection != "" && len(r.RollupNamespace(res)) > MaxNamespaceBytes {
			d.fail(key, "rollup namespace %q is longer than %d bytes", r.RollupNamespace(res), MaxNamespaceBytes)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}
