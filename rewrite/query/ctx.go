package query

import (
	"fmt"
	"strings"

	"github.com/tsproxy/tsproxy/rewrite/caps"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// Ctx is what the read rewrite needs to know of the rule.
type Ctx struct {
	Rule      *rules.Rule
	NS        string
	MetaField string
	TimeField string
	Span      int64
	Caps      caps.Upstream
	// fixedMeta is the meta every selected bucket has, when the filter
	// pins the metaField to one value at its top level (no lookup needed).
	FixedMeta *bsoncore.Value
	// usedMeta is set when a translation renames a path to the bucket's
	// meta (FerretDB's $unwind drops it: only the bucket-level filter may).
	UsedMeta bool
	// IDIndex, when set, keeps the event-id indexes the reads read.
	IDIndex bucket.IDIndexCache
}

func NewCtx(rule *rules.Rule) (*Ctx, error) {
	if rule == nil {
		return nil, mongoerr.Errorf(mongoerr.InternalError, "no rule")
	}
	if rule.TimeField == "" || rule.BucketCollection == "" || rule.DB == "" {
		return nil, mongoerr.Errorf(mongoerr.InternalError, "tsproxy rule %s: incomplete rule (timeField, database and bucket collection are required)", rule.Namespace)
	}
	span := rule.SpanMillis()
	if span <= 0 {
		span = rules.DefaultSpan.Milliseconds()
	}
	return &Ctx{Rule: rule, NS: rule.Namespace, MetaField: rule.MetaField, TimeField: rule.TimeField, Span: span}, nil
}

// unsupported is a NotImplemented error naming the rule.
func (rc *Ctx) Unsupported(format string, args ...any) error {
	return mongoerr.Errorf(mongoerr.NotImplemented, "tsproxy rule %s: %s", rc.NS, fmt.Sprintf(format, args...))
}

// badValue is an error in the client's command, naming the rule.
func (rc *Ctx) BadValue(code mongoerr.Code, format string, args ...any) error {
	return mongoerr.Errorf(code, "tsproxy rule %s: %s", rc.NS, fmt.Sprintf(format, args...))
}

// metaPath reports whether path is the metaField or a path inside it, and
// returns the rest after the metaField ("" or ".sub").
func (rc *Ctx) MetaPath(path string) (rest string, ok bool) {
	if rc.MetaField == "" {
		return "", false
	}
	if path == rc.MetaField {
		return "", true
	}
	if strings.HasPrefix(path, rc.MetaField+".") {
		return path[len(rc.MetaField):], true
	}
	return "", false
}

// upstreamPath renames an event path to its path in an unwound bucket.
func (rc *Ctx) UpstreamPath(path string) string {
	if rest, ok := rc.MetaPath(path); ok {
		rc.UsedMeta = true
		return storedMetaPath(rest)
	}
	return bucket.FieldEvents + "." + path
}

// markerPath is where the metaField marker of an unwound event is.
func (rc *Ctx) MarkerPath() string { return bucket.FieldEvents + "." + rc.MetaField }

func (rc *Ctx) String() string { return fmt.Sprintf("read %s", rc.NS) }
