package admin

import (
	"math"
	"strings"
	"time"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// MongoDB's time-series API on a namespace without a config rule: the
// create command's "timeseries" option read and checked as MongoDB checks
// it, with MongoDB's codes and messages (src/mongo/db/timeseries), so an
// app that handles those errors handles the proxy's.

// maxBucketSpanSeconds bounds bucketMaxSpanSeconds and
// bucketRoundingSeconds (MongoDB has no upper bound; a year keeps window
// arithmetic in milliseconds far from overflow).
const maxBucketSpanSeconds = 31536000

// HasTimeseries reports whether a create command asks for a time-series
// collection.
func HasTimeseries(body []byte) bool {
	_, err := bsoncore.Document(body).LookupErr("timeseries")
	return err == nil
}

// ParseTimeseriesCreate reads a create command with a timeseries option on
// db: the rule it asks for, or MongoDB's error for options MongoDB
// refuses.
func ParseTimeseriesCreate(body []byte, db string) (rules.Created, error) {
	doc := bsoncore.Document(body)
	elems, err := doc.Elements()
	if err != nil || len(elems) == 0 {
		return rules.Created{}, mongoerr.Errorf(mongoerr.InvalidBSON, "create: the command is not valid BSON")
	}
	coll, ok := elems[0].Value().StringValueOK()
	if !ok || coll == "" {
		return rules.Created{}, mongoerr.Errorf(mongoerr.InvalidNamespace, "Invalid namespace specified '%s.'", db)
	}
	c := rules.Created{DB: db, Collection: coll}
	for _, e := range elems[1:] {
		k := e.Key()
		switch {
		case k == "timeseries":
			ts, err := timeseriesOption("create", e.Value())
			if err != nil {
				return c, err
			}
			if err := parseTimeseriesOptions(ts, &c); err != nil {
				return c, err
			}
		case k == "expireAfterSeconds":
			n, err := expireAfterSeconds("create", e.Value())
			if err != nil {
				return c, err
			}
			setExpiry(&c, n)
		case isGeneric(k):
		default:
			return c, mongoerr.Errorf(mongoerr.InvalidOptions, "%s.%s: 'timeseries' is not allowed with '%s'", db, coll, k)
		}
	}
	return c, nil
}

// timeseriesOption is the timeseries document of a create or collMod,
// or MongoDB's error for another type.
func timeseriesOption(cmd string, v bsoncore.Value) (bsoncore.Document, error) {
	ts, ok := v.DocumentOK()
	if !ok {
		return nil, mongoerr.Errorf(mongoerr.TypeMismatch, "BSON field '%s.timeseries' is the wrong type '%s', expected type 'object'", cmd, bsonutil.TypeName(v.Type))
	}
	return ts, nil
}

// parseTimeseriesOptions reads the timeseries document of a create.
func parseTimeseriesOptions(ts bsoncore.Document, c *rules.Created) error {
	elems, err := ts.Elements()
	if err != nil {
		return mongoerr.Errorf(mongoerr.InvalidBSON, "create: timeseries is not valid BSON")
	}
	var maxSpan, rounding int64
	var hasTime, hasMaxSpan, hasRounding bool
	for _, e := range elems {
		switch k := e.Key(); k {
		case "timeField", "metaField", "granularity":
			s, ok := e.Value().StringValueOK()
			if !ok {
				return mongoerr.Errorf(mongoerr.TypeMismatch, "BSON field 'create.timeseries.%s' is the wrong type '%s', expected type 'string'", k, bsonutil.TypeName(e.Value().Type))
			}
			switch k {
			case "timeField":
				c.TimeField, hasTime = s, true
			case "metaField":
				c.MetaField, c.Declared.EmptyMetaField = s, s == ""
			default:
				if _, _, ok := rules.GranularitySpan(s); !ok {
					return mongoerr.Errorf(mongoerr.BadValue, "Enumeration value '%s' for field 'create.timeseries.granularity' is not a valid value.", s)
				}
				c.Declared.Granularity = s
			}
		case "bucketMaxSpanSeconds", "bucketRoundingSeconds":
			n, ok := wholeNumber(e.Value())
			if !ok {
				return mongoerr.Errorf(mongoerr.TypeMismatch, "BSON field 'create.timeseries.%s' is the wrong type '%s', expected types '[long, int, decimal, double]'", k, bsonutil.TypeName(e.Value().Type))
			}
			if n < 1 {
				return mongoerr.Errorf(mongoerr.BadValue, "BSON field '%s' value must be >= 1, actual value '%d'", k, n)
			}
			if n > maxBucketSpanSeconds {
				return mongoerr.Errorf(mongoerr.BadValue, "BSON field '%s' value must be <= %d, actual value '%d' (tsproxy's bound)", k, maxBucketSpanSeconds, n)
			}
			if k == "bucketMaxSpanSeconds" {
				maxSpan, hasMaxSpan = n, true
			} else {
				rounding, hasRounding = n, true
			}
		default:
			return mongoerr.Errorf(mongoerr.IDLUnknownField, "BSON field 'create.timeseries.%s' is an unknown field.", k)
		}
	}
	if !hasTime {
		return mongoerr.Errorf(mongoerr.IDLFailedToParse, "BSON field 'create.timeseries.timeField' is missing but a required field")
	}
	if err := checkTimeseriesFields(c.DB+"."+c.Collection, c.TimeField, c.MetaField); err != nil {
		return err
	}
	emptyMeta := c.Declared.EmptyMetaField
	err = setBucketing(c, maxSpan, rounding, hasMaxSpan, hasRounding)
	c.Declared.EmptyMetaField = emptyMeta
	return err
}

// checkTimeseriesFields is MongoDB's check of the timeField and metaField
// names of ns.
func checkTimeseriesFields(ns, timeField, metaField string) error {
	for _, f := range []struct{ key, name string }{{"timeField", timeField}, {"metaField", metaField}} {
		switch {
		case f.key == "metaField" && f.name == "" && metaField == "":
			continue
		case strings.Contains(f.name, "."):
			return mongoerr.Errorf(mongoerr.InvalidOptions, "%s: '%s' must be a top-level field and not contain a '.'", ns, f.key)
		case f.name == "" || strings.HasPrefix(f.name, "$"):
			return mongoerr.Errorf(mongoerr.BadValue, "The 'timeField' or 'metaField' cannot start with '$' or be empty")
		}
	}
	switch {
	case metaField == "":
	case metaField == "_id":
		return mongoerr.Errorf(mongoerr.InvalidOptions, `'metaField' cannot be "_id"`)
	case metaField == timeField:
		return mongoerr.Errorf(mongoerr.InvalidOptions, "'metaField' cannot be the same as 'timeField'")
	}
	return nil
}

// setBucketing fills the declared bucketing and the rule's span: a
// granularity (seconds when none is given) or equal bucketMaxSpanSeconds
// and bucketRoundingSeconds.
func setBucketing(c *rules.Created, maxSpan, rounding int64, hasMaxSpan, hasRounding bool) error {
	g := c.Declared.Granularity
	if g != "" {
		gspan, _, _ := rules.GranularitySpan(g)
		switch {
		case hasMaxSpan && maxSpan != gspan:
			return mongoerr.Errorf(mongoerr.InvalidOptions, "Timeseries 'bucketMaxSpanSeconds' is not configurable to a value other than the default of %d for the provided granularity", gspan)
		case hasRounding:
			return mongoerr.Errorf(mongoerr.InvalidOptions, "Timeseries 'bucketRoundingSeconds' is not configurable alongside the granularity parameter")
		}
	} else if hasMaxSpan || hasRounding {
		if !hasMaxSpan || !hasRounding || maxSpan != rounding {
			return mongoerr.Errorf(mongoerr.InvalidOptions, "Timeseries 'bucketRoundingSeconds' needs to be equal to 'bucketMaxSpanSeconds'")
		}
		c.Declared = rules.Timeseries{BucketMaxSpanSeconds: maxSpan, BucketRoundingSeconds: rounding}
		c.SpanSeconds = maxSpan
		return nil
	}
	if g == "" {
		g = "seconds"
	}
	span, rounding, _ := rules.GranularitySpan(g)
	c.Declared = rules.Timeseries{Granularity: g, BucketMaxSpanSeconds: span, BucketRoundingSeconds: rounding}
	c.SpanSeconds = span
	return nil
}

// setExpiry sets c's expireAfterSeconds to n seconds: 0 expires a
// bucket once its window ended, as on MongoDB.
func setExpiry(c *rules.Created, n int64) {
	c.ExpireAfterSeconds, c.ExpireAtWindowEnd = n, n == 0
}

// clearExpiry is collMod's expireAfterSeconds "off": events are kept for
// ever.
func clearExpiry(c *rules.Created) {
	c.ExpireAfterSeconds, c.ExpireAtWindowEnd = 0, false
}

// expireAfterSeconds reads a create's or collMod's expireAfterSeconds.
func expireAfterSeconds(cmd string, v bsoncore.Value) (int64, error) {
	n, ok := wholeNumber(v)
	if !ok {
		expected := "[long, int, decimal, double]"
		if cmd == "collMod" {
			expected = "[string, long, int, decimal, double]"
		}
		return 0, mongoerr.Errorf(mongoerr.TypeMismatch, "BSON field '%s.expireAfterSeconds' is the wrong type '%s', expected types '%s'", cmd, bsonutil.TypeName(v.Type), expected)
	}
	if n < 0 {
		return 0, mongoerr.Errorf(mongoerr.InvalidOptions, "TTL index 'expireAfterSeconds' option cannot be less than 0")
	}
	if n > time.Now().Unix() {
		// MongoDB's bound for clustered and time-series collections. In
		// a time.Duration more than about 292 years wrapped: 2^55 + 3600
		// seconds became an hour, and the sweeper deleted every event
		// older than that.
		return 0, mongoerr.Errorf(mongoerr.InvalidOptions, "TTL index 'expireAfterSeconds' option must be within an acceptable range, try a lower number")
	}
	return n, nil
}

// wholeNumber reads an int32, int64 or whole double.
func wholeNumber(v bsoncore.Value) (int64, bool) {
	switch v.Type {
	case bsoncore.TypeInt32, bsoncore.TypeInt64:
		return v.AsInt64(), true
	case bsoncore.TypeDouble:
		f := v.Double()
		if f != math.Trunc(f) || math.Abs(f) > 1<<53 {
			return 0, false
		}
		return int64(f), true
	}
	return 0, false
}

// SameTimeseries reports whether a create asks for what rule already is,
// which MongoDB answers with ok (a create repeated with equal options); a
// different ask is NamespaceExists.
func SameTimeseries(c rules.Created, rule *rules.Rule) bool {
	ts := rule.TimeseriesOf()
	return c.TimeField == rule.TimeField && c.MetaField == rule.MetaField &&
		c.Declared == ts && c.Expires() == rule.Expires() && c.ExpireAfterSeconds == int64(rule.ExpireAfter.Seconds())
}

// ExistsError is MongoDB's NamespaceExists for a create whose options
// differ from the existing time-series collection's. A config rule is
// named, since only config.yaml changes it.
func ExistsError(c rules.Created, rule *rules.Rule) error {
	ns := rule.Namespace
	if rule.Declared == nil {
		return mongoerr.Errorf(mongoerr.NamespaceExists, "A timeseries collection already exists. NS: %s (bucketed by the tsproxy config rule %s: timeField %q, metaField %q, span %s; change config.yaml to change it)", ns, ns, rule.TimeField, rule.MetaField, rule.Span)
	}
	return mongoerr.Errorf(mongoerr.NamespaceExists, "A timeseries collection already exists. NS: %s", ns)
}

// PlainExistsError is MongoDB's NamespaceExists for a create of a name a
// plain collection has.
func PlainExistsError(ns string) error {
	return mongoerr.Errorf(mongoerr.NamespaceExists, "Collection %s already exists.", ns)
}

// ParseTimeseriesCollMod reads a collMod of a created time-series
// namespace: what the rule becomes, or MongoDB's error. The granularity
// may only get coarser and a custom span only longer, as MongoDB allows;
// expireAfterSeconds is a number or "off".
func ParseTimeseriesCollMod(body []byte, rule *rules.Rule) (rules.Created, error) {
	c := rule.CreatedOf()
	elems, err := bsoncore.Document(body).Elements()
	if err != nil || len(elems) == 0 {
		return c, mongoerr.Errorf(mongoerr.InvalidBSON, "collMod: the command is not valid BSON")
	}
	for _, e := range elems[1:] {
		switch k := e.Key(); {
		case k == "timeseries":
			ts, err := timeseriesOption("collMod", e.Value())
			if err != nil {
				return c, err
			}
			if err := modBucketing(ts, &c); err != nil {
				return c, err
			}
		case k == "expireAfterSeconds":
			if s, ok := e.Value().StringValueOK(); ok {
				if s != "off" {
					return c, mongoerr.Errorf(mongoerr.InvalidOptions, "Invalid string value for the 'clusteredIndex::expireAfterSeconds' option. Got: '%s'. Accepted value is 'off'", s)
				}
				clearExpiry(&c)
				continue
			}
			n, err := expireAfterSeconds("collMod", e.Value())
			if err != nil {
				return c, err
			}
			setExpiry(&c, n)
		case isGeneric(k):
		default:
			return c, mongoerr.Errorf(mongoerr.InvalidOptions, "collMod option '%s' is not supported on the time-series collection %s by tsproxy (granularity, bucketMaxSpanSeconds, bucketRoundingSeconds and expireAfterSeconds are)", k, rule.Namespace)
		}
	}
	return c, nil
}

// modBucketing applies a collMod's timeseries document to c.Declared.
// The rule's span (its buckets' windows) does not change: see
// rules.Timeseries. As on MongoDB, a granularity may come with the
// bucketMaxSpanSeconds it stands for, never with bucketRoundingSeconds.
func modBucketing(ts bsoncore.Document, c *rules.Created) error {
	m, err := readModBucketing(ts)
	if err != nil {
		return err
	}
	if m.granularity != "" {
		gspan, _, _ := rules.GranularitySpan(m.granularity)
		switch {
		case m.hasMaxSpan && m.maxSpan != gspan:
			return mongoerr.Errorf(mongoerr.InvalidOptions, "Timeseries 'bucketMaxSpanSeconds' is not configurable to a value other than the default of %d for the provided granularity", gspan)
		case m.hasRounding:
			return mongoerr.Errorf(mongoerr.InvalidOptions, "Timeseries 'bucketRoundingSeconds' is not configurable alongside the granularity parameter")
		}
		return modGranularity(m.granularity, c)
	}
	if !m.hasMaxSpan && !m.hasRounding {
		return nil
	}
	return modCustomBucketing(m, c)
}

// modBucketingAsk is what a collMod's timeseries document asks for.
type modBucketingAsk struct {
	granularity             string
	maxSpan, rounding       int64
	hasMaxSpan, hasRounding bool
}

// readModBucketing reads a collMod's timeseries document, checking each
// field's type and range.
func readModBucketing(ts bsoncore.Document) (modBucketingAsk, error) {
	var m modBucketingAsk
	elems, _ := ts.Elements()
	for _, e := range elems {
		switch k := e.Key(); k {
		case "granularity":
			g, ok := e.Value().StringValueOK()
			if !ok {
				return m, mongoerr.Errorf(mongoerr.TypeMismatch, "BSON field 'collMod.timeseries.granularity' is the wrong type '%s', expected type 'string'", bsonutil.TypeName(e.Value().Type))
			}
			if _, _, ok := rules.GranularitySpan(g); !ok {
				return m, mongoerr.Errorf(mongoerr.BadValue, "Enumeration value '%s' for field 'collMod.timeseries.granularity' is not a valid value.", g)
			}
			m.granularity = g
		case "bucketMaxSpanSeconds", "bucketRoundingSeconds":
			n, ok := wholeNumber(e.Value())
			if !ok || n < 1 || n > maxBucketSpanSeconds {
				return m, mongoerr.Errorf(mongoerr.BadValue, "BSON field 'collMod.timeseries.%s' must be a whole number of seconds in [1, %d]", k, maxBucketSpanSeconds)
			}
			if k == "bucketMaxSpanSeconds" {
				m.maxSpan, m.hasMaxSpan = n, true
			} else {
				m.rounding, m.hasRounding = n, true
			}
		default:
			return m, mongoerr.Errorf(mongoerr.IDLUnknownField, "BSON field 'collMod.timeseries.%s' is an unknown field.", k)
		}
	}
	return m, nil
}

// modGranularity moves c to granularity g: only coarser, and from custom
// bucketing only to a granularity of at least its span (MongoDB 6.3+).
func modGranularity(g string, c *rules.Created) error {
	old := c.Declared.Granularity
	if span, _, _ := rules.GranularitySpan(g); old == "" && span < c.Declared.BucketMaxSpanSeconds {
		return mongoerr.Errorf(mongoerr.InvalidOptions, "Timeseries 'bucketMaxSpanSeconds' needs to be equal or greater to transition")
	}
	if old != "" && rules.GranularityRank(g) < rules.GranularityRank(old) {
		return mongoerr.Errorf(mongoerr.InvalidOptions, "Invalid transition for timeseries.granularity. Can only transition from 'seconds' to 'minutes' or 'minutes' to 'hours'.")
	}
	c.Declared.Granularity = g
	c.Declared.BucketMaxSpanSeconds, c.Declared.BucketRoundingSeconds, _ = rules.GranularitySpan(g)
	return nil
}

// modCustomBucketing moves c to equal bucketMaxSpanSeconds and
// bucketRoundingSeconds, no shorter than c's.
func modCustomBucketing(m modBucketingAsk, c *rules.Created) error {
	switch {
	case !m.hasMaxSpan || !m.hasRounding || m.maxSpan != m.rounding:
		return mongoerr.Errorf(mongoerr.InvalidOptions, "Timeseries 'bucketRoundingSeconds' needs to be equal to 'bucketMaxSpanSeconds'")
	case m.maxSpan < c.Declared.BucketMaxSpanSeconds:
		return mongoerr.Errorf(mongoerr.InvalidOptions, "Timeseries 'bucketMaxSpanSeconds' needs to be equal or greater to transition")
	case m.rounding < c.Declared.BucketRoundingSeconds:
		return mongoerr.Errorf(mongoerr.InvalidOptions, "Timeseries 'bucketRoundingSeconds' needs to be equal or greater to transition")
	}
	c.Declared = rules.Timeseries{BucketMaxSpanSeconds: m.maxSpan, BucketRoundingSeconds: m.rounding, EmptyMetaField: c.Declared.EmptyMetaField}
	return nil
}

// RenameError is MongoDB's refusal to rename a time-series collection
// (a replica set's: the collection is a view there).
func RenameError(ns string) error {
	return mongoerr.Errorf(mongoerr.CommandNotSupportedOnView, "cannot rename view: %s", ns)
}
