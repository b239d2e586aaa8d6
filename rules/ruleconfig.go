package rules

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"
)

// Granularities maps MongoDB's time-series granularity names, accepted as
// bucket.granularity, to the bucket span they stand for (MongoDB's
// bucketMaxSpanSeconds).
var Granularities = map[string]time.Duration{
	"seconds": time.Hour,
	"minutes": 24 * time.Hour,
	"hours":   720 * time.Hour,
}

// MaxNamespaceBytes is the longest namespace (application's or bucket's)
// a rule may use: MongoDB's limit for "db.collection".
const MaxNamespaceBytes = 255

// maxDBNameBytes is MongoDB's limit on a database name.
const maxDBNameBytes = 63

// The values of bucket.compression (Rule.Compression).
const (
	CompressionZstd = "zstd"
	CompressionNone = "none"
)

// DefaultInsertThreshold is the insertThreshold of a rule that sets none:
// a tenth of maxEvents, at most 100. A batch group this large is inserted
// as a bucket of its own; on the embedded upstream that costs a fraction of
// joining an open bucket (an update there rewrites the whole bucket, about
// 75 µs per stored event, measured with tsbench ingest), and 100 events per
// bucket still stores 1-second data in 100x fewer documents.
func DefaultInsertThreshold(maxEvents int) int { return min(100, max(1, maxEvents/10)) }

// field returns m[name], matching the name ignoring case as viper does.
func field(m map[string]any, name string) any {
	if v, ok := m[strings.ToLower(name)]; ok {
		return v
	}
	for k, v := range m {
		if strings.EqualFold(k, name) {
			return v
		}
	}
	return nil
}

// rules decodes the rules list and checks the rules against each other.
func (d *decoder) rules(v any) []Rule {
	if v == nil {
		return nil
	}
	items, ok := v.([]any)
	if !ok {
		// A mapping or a scalar in the file was reported by checkKeys;
		// from the environment, it lands here.
		if _, isMap := v.(map[string]any); !isMap {
			d.fail("rules", "must be a list of rules in the config file, not %s", show(v))
		}
		return nil
	}
	out := make([]Rule, 0, len(items))
	var at []int // at[j] is the index in the file of out[j]
	for i, it := range items {
		p := fmt.Sprintf("rules[%d]", i)
		m, ok := it.(map[string]any)
		if !ok {
			if it == nil {
				d.fail(p, "is empty; a rule needs at least namespace and timeField")
			} // otherwise checkKeys reported it
			continue
		}
		if r, ok := d.rule(p, m); ok {
			out = append(out, r)
			at = append(at, i)
		}
	}
	d.crossCheck(out, at)
	if len(out) == 0 {
		return nil
	}
	return out
}

// crossCheck reports rules that name the same namespace twice, or whose
// bucket collections collide with another rule's bucket collection or
// namespace.
func (d *decoder) crossCheck(rs []Rule, at []int) {
	ns := map[string]int{}
	dup := make([]bool, len(rs))
	for j, r := range rs {
		if first, ok := ns[r.Namespace]; ok {
			d.fail(fmt.Sprintf("rules[%d].namespace", at[j]), "%q repeats rules[%d]", r.Namespace, first)
			dup[j] = true
			continue
		}
		ns[r.Namespace] = at[j]
	}
	bns := map[string]int{}
	for j, r := range rs {
		if dup[j] {
			continue // reported above
		}
		key := fmt.Sprintf("rules[%d].collection", at[j])
		b := r.BucketNamespace()
		if i, ok := ns[b]; ok {
			d.fail(key, "bucket namespace %q is the namespace of rules[%d]", b, i)
			continue
		}
		if first, ok := bns[b]; ok {
			d.fail(key, "bucket namespace %q is also the bucket namespace of rules[%d]", b, first)
			continue
		}
		bns[b] = at[j]
	}
	d.checkWrites(rs, at, dup)
}

// checkWrites reports a collection two rules would write (a rollup, a
// partition) or that the proxy keeps for itself (its writer leases, its
// staging tier's names, its catalog of created collections).
func (d *decoder) checkWrites(rs []Rule, at []int, dup []bool) {
	claims := map[string]string{} // namespace: what takes it
	for j, r := range rs {
		if dup[j] {
			continue
		}
		for _, c := range []struct{ ns, key, what string }{
			{r.Namespace, "namespace", "namespace"},
			{r.BucketNamespace(), "collection", "bucket namespace"},
		} {
			key := fmt.Sprintf("rules[%d].%s", at[j], c.key)
			db, coll, _ := strings.Cut(c.ns, ".")
			switch {
			case coll == LeaseCollection || strings.HasPrefix(coll, StagePrefix):
				d.fail(key, "%s %q is a name the proxy keeps for itself (%s, %s...)", c.what, c.ns, LeaseCollection, StagePrefix)
			case db == CatalogDB:
				d.fail(key, "%s %q is in the database the proxy keeps its catalog in (%s)", c.what, c.ns, CatalogDB)
			}
			claims[c.ns] = fmt.Sprintf("%s of rules[%d]", c.what, at[j])
		}
	}
	for j, r := range rs {
		if dup[j] {
			continue
		}
		for _, res := range r.Rollups {
			ns := r.RollupNamespace(res)
			if who, ok := claims[ns]; ok {
				d.fail(fmt.Sprintf("rules[%d].rollups", at[j]), "rollup collection %q is the %s", ns, who)
				continue
			}
			claims[ns] = fmt.Sprintf("rollup collection of rules[%d]", at[j])
		}
	}
	names := slices.Sorted(maps.Keys(claims))
	for j, r := range rs {
		if dup[j] || !r.Partitioned() {
			continue
		}
		for _, ns := range names {
			if db, coll, _ := strings.Cut(ns, "."); db == r.DB {
				if _, ok := r.ParsePartition(coll); ok {
					d.fail(fmt.Sprintf("rules[%d].partitionBy", at[j]), "a partition of the rule would be %q, the %s", ns, claims[ns])
				}
			}
		}
	}
}

// rule decodes and checks one rule at path p; ok is false when its
// namespace is unusable (other problems are reported but the rule is kept
// for the cross checks).
func (d *decoder) rule(p string, m map[string]any) (Rule, bool) {
	var r Rule
	k := func(name string) string { return p + "." + name }

	// namespace
	r.Namespace = d.str(k("namespace"), field(m, "namespace"))
	nsOK := false
	if r.Namespace == "" {
		if d.ok(k("namespace")) {
			d.fail(k("namespace"), "is missing; write the namespace apps use, as db.collection")
		}
	} else if err := checkNamespace(r.Namespace); err != nil {
		d.fail(k("namespace"), "%v", err)
	} else {
		r.DB, r.Collection, _ = strings.Cut(r.Namespace, ".")
		nsOK = true
	}

	// timeField, metaField
	r.TimeField = d.str(k("timeField"), field(m, "timeField"))
	if r.TimeField == "" {
		if d.ok(k("timeField")) {
			d.fail(k("timeField"), "is missing; name the event field that holds the BSON date")
		}
	} else if err := checkFieldName(r.TimeField); err != nil {
		d.fail(k("timeField"), "%q %v", r.TimeField, err)
	}
	r.MetaField = d.str(k("metaField"), field(m, "metaField"))
	if r.MetaField != "" {
		if err := checkFieldName(r.MetaField); err != nil {
			d.fail(k("metaField"), "%q %v", r.MetaField, err)
		} else if r.MetaField == r.TimeField {
			d.fail(k("metaField"), "%q is also the timeField", r.MetaField)
		}
	}

	// bucket
	b, _ := field(m, "bucket").(map[string]any) // another shape was reported by checkKeys
	d.bucket(p+".bucket", b, &r)

	// aggregates
	r.Aggregates = d.aggregates(k("aggregates"), field(m, "aggregates"), &r)

	// layout: after bucket, whose span a window replaces
	d.layout(p, m, &r)
	d.lifecycle(p, m, &r)

	// collection
	r.BucketCollection = d.str(k("collection"), field(m, "collection"))
	if v := field(m, "collection"); v != nil && r.BucketCollection == "" && d.ok(k("collection")) {
		d.fail(k("collection"), "is empty; leave it out for the default %s", "<collection>"+BucketCollectionSuffix)
	}
	if r.BucketCollection == "" && nsOK {
		r.BucketCollection = r.Collection + BucketCollectionSuffix
	} else if r.BucketCollection != "" {
		if err := checkCollection(r.BucketCollection); err != nil {
			d.fail(k("collection"), "%v", err)
		} else if nsOK && r.BucketCollection == r.Collection {
			d.fail(k("collection"), "%q is the rule's own collection; buckets need a collection of their own", r.BucketCollection)
		}
	}
	if nsOK && len(r.BucketNamespace()) > MaxNamespaceBytes {
		d.fail(k("collection"), "bucket namespace %q is longer than %d bytes", r.BucketNamespace(), MaxNamespaceBytes)
	}
	// After collection: partition names extend the bucket collection's.
	if v := field(m, "partitionBy"); v != nil {
		d.partitionBy(k("partitionBy"), v, &r)
	}
	d.ingest(p, m, &r)
	return r, nsOK
}

func (d *decoder) bucket(p string, b map[string]any, r *Rule) {
	k := func(name string) string { return p + "." + name }

	span, gran := field(b, "span"), field(b, "granularity")
	switch {
	case span != nil && gran != nil:
		d.fail(p, "set span or granularity, not both")
	case gran != nil:
		g := strings.ToLower(d.str(k("granularity"), gran))
		if s, ok := Granularities[g]; ok {
			r.Span = s
		} else if d.ok(k("granularity")) {
			d.fail(k("granularity"), "%q is not seconds, minutes or hours", g)
		}
	case span != nil:
		r.Span = d.duration(k("span"), span)
		if d.ok(k("span")) {
			switch {
			case r.Span <= 0:
				d.fail(k("span"), "%s is not positive", show(span))
			case r.Span%time.Second != 0:
				d.fail(k("span"), "%s is not a whole number of seconds", show(span))
			}
		}
	default:
		r.Span = DefaultSpan
	}

	r.MaxEvents = DefaultMaxEvents
	if v := field(b, "maxEvents"); v != nil {
		n, ok := integer(v)
		switch {
		case !ok:
			d.fail(k("maxEvents"), "%s is not a whole number", show(v))
		case n < 1:
			d.fail(k("maxEvents"), "%d is less than 1", n)
		case n > 1<<30:
			d.fail(k("maxEvents"), "%d is too large", n)
		default:
			r.MaxEvents = int(n)
		}
	}

	r.MaxBytes = DefaultMaxBytes
	if v := field(b, "maxBytes"); v != nil {
		if n, ok := d.bytes(k("maxBytes"), v); ok {
			switch {
			case n < MinBucketBytes:
				d.fail(k("maxBytes"), "%s is less than 1KiB (%d bytes): a bucket must hold an event", show(v), MinBucketBytes)
			case n > MaxBucketBytes:
				d.fail(k("maxBytes"), "%s is more than the limit of 8MiB (%d bytes)", show(v), MaxBucketBytes)
			default:
				r.MaxBytes = n
			}
		}
	}

	r.InsertThreshold = DefaultInsertThreshold(r.MaxEvents)
	if v := field(b, "insertThreshold"); v != nil {
		n, ok := integer(v)
		switch {
		case !ok:
			d.fail(k("insertThreshold"), "%s is not a whole number", show(v))
		case n < 1 || n > int64(r.MaxEvents):
			d.fail(k("insertThreshold"), "%d is out of range [1, maxEvents=%d]", n, r.MaxEvents)
		default:
			r.InsertThreshold = int(n)
		}
	}

	if v := field(b, "compression"); v != nil {
		c := strings.ToLower(d.str(k("compression"), v))
		switch c {
		case CompressionZstd, CompressionNone:
			r.Compression = c
		default:
			if d.ok(k("compression")) {
				d.fail(k("compression"), "%q is not zstd or none", c)
			}
		}
	}
}

func (d *decoder) aggregates(p string, v any, r *Rule) []string {
	if v == nil {
		return nil
	}
	items, ok := v.([]any)
	if !ok {
		return nil // checkKeys reported the shape
	}
	out := make([]string, 0, len(items))
	seen := map[string]int{}
	for i, it := range items {
		k := fmt.Sprintf("%s[%d]", p, i)
		s, isStr := it.(string)
		if !isStr {
			if it == nil {
				d.fail(k, "is empty")
			} else if isScalar(it) {
				d.fail(k, "%s is not a field name", show(it))
			} // a list or mapping was reported by checkKeys
			continue
		}
		if err := checkPath(s); err != nil {
			d.fail(k, "%q %v", s, err)
			continue
		}
		if j, ok := seen[s]; ok {
			d.fail(k, "%q repeats %s[%d]", s, p, j)
			continue
		}
		seen[s] = i
		if within(s, r.TimeField) {
			d.fail(k, "%q is the timeField; its min and max are kept anyway", s)
			continue
		}
		if r.MetaField != "" && within(s, r.MetaField) {
			d.fail(k, "%q is the metaField, which is the same for a whole bucket", s)
			continue
		}
		if s == "_id" || strings.HasPrefix(s, "_id.") {
			d.fail(k, "%q is the event id", s)
			continue
		}
		out = append(out, s)
	}
	// "a" and "a.b" would make conflicting updates of sum.a and sum.a.b.
	sorted := append([]string(nil), out...)
	sort.Strings(sorted)
	for i := 1; i < len(sorted); i++ {
		if strings.HasPrefix(sorted[i], sorted[i-1]+".") {
			d.fail(fmt.Sprintf("%s[%d]", p, seen[sorted[i]]), "%q lies inside %s[%d] %q; keep one of them", sorted[i], p, seen[sorted[i-1]], sorted[i-1])
		}
	}
	return out
}

func isScalar(v any) bool {
	switch v.(type) {
	case bool, int, int64, uint64, float64:
		return true
	}
	return false
}

// within reports whether path is field or lies inside it.
func within(path, field string) bool {
	return path == field || strings.HasPrefix(path, field+".")
}

// checkNamespace checks "db.collection".
func checkNamespace(ns string) error {
	db, coll, ok := strings.Cut(ns, ".")
	if !ok || db == "" || coll == "" {
		return fmt.Errorf("%q is not db.collection", ns)
	}
	if i := strings.IndexAny(db, " /\\\"$\x00"); i >= 0 {
		return fmt.Errorf("%q: database name %q may not contain %q", ns, db, db[i:i+1])
	}
	if len(db) > maxDBNameBytes {
		return fmt.Errorf("%q: database name is longer than %d bytes", ns, maxDBNameBytes)
	}
	if len(ns) > MaxNamespaceBytes {
		return fmt.Errorf("%q is longer than %d bytes", ns, MaxNamespaceBytes)
	}
	if err := checkCollection(coll); err != nil {
		return fmt.Errorf("%q: %v", ns, err)
	}
	return nil
}

// checkCollection checks a collection name.
func checkCollection(c string) error {
	switch {
	case c == "":
		return fmt.Errorf("collection name is empty")
	case strings.ContainsAny(c, "$\x00"):
		return fmt.Errorf("collection name %q may not contain '$'", c)
	case strings.HasPrefix(c, "system."):
		return fmt.Errorf("collection name %q is reserved (system.*)", c)
	case strings.HasPrefix(c, ".") || strings.HasSuffix(c, "."):
		return fmt.Errorf("collection name %q may not start or end with '.'", c)
	}
	return nil
}

// checkFieldName checks a top-level field name (timeField, metaField).
func checkFieldName(f string) error {
	switch {
	case strings.HasPrefix(f, "$"):
		return fmt.Errorf("may not start with '$'")
	case strings.Contains(f, "."):
		return fmt.Errorf("must be a top-level field name, without '.'")
	case strings.ContainsRune(f, 0):
		return fmt.Errorf("may not contain a NUL byte")
	case f == "_id":
		return fmt.Errorf("is the event id; name another field")
	}
	return nil
}

// checkPath checks a dotted field path (aggregates).
func checkPath(p string) error {
	switch {
	case p == "":
		return fmt.Errorf("is empty")
	case strings.ContainsAny(p, "$\x00"):
		return fmt.Errorf("may not contain '$'")
	}
	for _, seg := range strings.Split(p, ".") {
		if seg == "" {
			return fmt.Errorf("has an empty segment")
		}
	}
	return nil
}
