package rules

import "strings"

// nsKey is a namespace split in two, so a lookup needs no concatenation.
type nsKey struct{ db, coll string }

// Set answers, for every message, whether its namespace is bucketed and by
// which rule. Build it once (NewSet, Config.RuleSet) and share it: it is
// read-only and safe for concurrent use. Its lookups do not allocate.
type Set struct {
	rules    []Rule
	byNS     map[nsKey]*Rule
	byBucket map[nsKey]*Rule
}

// NewSet indexes copies of rules by namespace and by bucket namespace. A
// rule built by hand may leave derived fields zero: DB and Collection come
// from Namespace (or Namespace from them), and Layout, Span, MaxEvents,
// MaxBytes, InsertThreshold and BucketCollection get their defaults. NewSet
// does not validate (Load does); when two rules claim one namespace, the
// first wins.
func NewSet(rules []Rule) *Set {
	s := &Set{
		rules:    make([]Rule, len(rules)),
		byNS:     make(map[nsKey]*Rule, len(rules)),
		byBucket: make(map[nsKey]*Rule, len(rules)),
	}
	for i, r := range rules {
		r.Aggregates = append([]string(nil), r.Aggregates...)
		fillDefaults(&r)
		s.rules[i] = r
	}
	for i := range s.rules {
		r := &s.rules[i]
		if k := (nsKey{r.DB, r.Collection}); s.byNS[k] == nil {
			s.byNS[k] = r
		}
		if k := (nsKey{r.DB, r.BucketCollection}); s.byBucket[k] == nil {
			s.byBucket[k] = r
		}
	}
	return s
}

// fillDefaults completes a rule built by hand; see NewSet.
func fillDefaults(r *Rule) {
	if r.DB == "" && r.Collection == "" {
		r.DB, r.Collection, _ = strings.Cut(r.Namespace, ".")
	} else if r.Namespace == "" {
		r.Namespace = r.DB + "." + r.Collection
	}
	if r.Layout == "" {
		r.Layout = LayoutEvents
	}
	if r.Span == 0 {
		r.Span = DefaultSpan
	}
	if r.MaxEvents == 0 {
		r.MaxEvents = DefaultMaxEvents
	}
	if r.MaxBytes == 0 {
		r.MaxBytes = DefaultMaxBytes
	}
	if r.InsertThreshold == 0 {
		r.InsertThreshold = DefaultInsertThreshold(r.MaxEvents)
	}
	if r.BucketCollection == "" {
		r.BucketCollection = r.Collection + BucketCollectionSuffix
	}
	r.stagePrefix, r.stagePrefixOf = stagePrefixOf(r.BucketCollection), r.BucketCollection
}

// Lookup returns the rule that buckets db.coll, or nil when the namespace
// is not bucketed. The rule belongs to the Set: do not change it.
func (s *Set) Lookup(db, coll string) *Rule {
	if s == nil {
		return nil
	}
	return s.byNS[nsKey{db, coll}]
}

// ByBucketCollection returns the rule whose buckets are stored in db.coll,
// or nil, so the proxy can refuse or pass through direct access to a bucket
// collection.
func (s *Set) ByBucketCollection(db, coll string) *Rule {
	if s == nil {
		return nil
	}
	return s.byBucket[nsKey{db, coll}]
}

// ByRollupCollection returns the rule one of whose rollups is stored in
// db.coll (<collection>.rollup_<resolution>), or nil.
func (s *Set) ByRollupCollection(db, coll string) *Rule {
	i := strings.LastIndex(coll, RollupCollectionInfix)
	if i < 0 {
		return nil
	}
	r := s.Lookup(db, coll[:i])
	if r == nil {
		return nil
	}
	for _, res := range r.Rollups {
		if r.RollupCollection(res) == coll {
			return r
		}
	}
	return nil
}

// Len is the number of rules.
func (s *Set) Len() int {
	if s == nil {
		return 0
	}
	return len(s.rules)
}

// All returns the rules in configuration order; they belong to the Set.
func (s *Set) All() []Rule {
	if s == nil {
		return nil
	}
	return s.rules
}

// InDB reports whether any rule buckets a namespace of database db, so a
// command without a collection (dropDatabase, listCollections) can be
// checked cheaply.
func (s *Set) InDB(db string) bool {
	if s == nil {
		return false
	}
	for i := range s.rules {
		if s.rules[i].DB == db {
			return true
		}
	}
	return false
}
