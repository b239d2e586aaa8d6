package admin

import (
	"fmt"
	"slices"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/cursor"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// The catalog of created time-series collections: one document per
// namespace in rules.CatalogDB.CatalogCollection, which every proxy on the
// upstream reads (the proxy's catalog has the protocol). A document's state
// says whether proxies may route the namespace yet:
//
//	creating: a proxy is creating it; commands on it wait
//	ready:    it is bucketed by the rule the document holds
//	dropping: a proxy is dropping it; commands on it wait
//
// Its nonce changes with every change of the document, so each change is
// a compare-and-set on the nonce the changer read.
const (
	StateCreating = "creating"
	StateReady    = "ready"
	StateDropping = "dropping"
)

// CatalogEntry is one catalog document.
type CatalogEntry struct {
	Created rules.Created
	State   string
	Nonce   string
}

// Namespace is the entry's "db.collection".
func (e CatalogEntry) Namespace() string { return e.Created.DB + "." + e.Created.Collection }

// Document encodes the entry as stored.
func (e CatalogEntry) Document() bsoncore.Document {
	c := e.Created
	b := bsoncore.NewDocumentBuilder().
		AppendString("_id", e.Namespace()).
		AppendString("db", c.DB).
		AppendString("coll", c.Collection).
		AppendString("timeField", c.TimeField)
	if c.MetaField != "" || c.Declared.EmptyMetaField {
		b.AppendString("metaField", c.MetaField)
	}
	if c.Declared.Granularity != "" {
		b.AppendString("granularity", c.Declared.Granularity)
	} else {
		b.AppendInt64("bucketMaxSpanSeconds", c.Declared.BucketMaxSpanSeconds).
			AppendInt64("bucketRoundingSeconds", c.Declared.BucketRoundingSeconds)
	}
	b.AppendInt64("spanSeconds", c.SpanSeconds).
		AppendInt64("expireAfterSeconds", c.ExpireAfterSeconds)
	if c.ExpireAtWindowEnd {
		// Apart from expireAfterSeconds: a proxy older than it reads 0
		// as "never", and keeps events rather than deleting them.
		b.AppendBoolean("expireAtWindowEnd", true)
	}
	if len(c.Aggregates) > 0 {
		arr := bsoncore.NewArrayBuilder()
		for _, a := range c.Aggregates {
			arr.AppendString(a)
		}
		b.AppendArray("aggregates", arr.Build())
	}
	return b.AppendString("state", e.State).
		AppendString("nonce", e.Nonce).
		Build()
}

// CreatedRuleOf is the rule of a ready catalog document (raw BSON), as
// a proxy routes by it; an error names what is wrong with it.
func CreatedRuleOf(raw []byte) (*rules.Rule, error) {
	e, err := ParseCatalogEntry(bsoncore.Document(raw))
	if err != nil {
		return nil, err
	}
	if e.State != StateReady {
		return nil, fmt.Errorf("catalog document %q is %s, not ready", e.Namespace(), e.State)
	}
	r := rules.NewCreatedRule(e.Created)
	return &r, nil
}

// ParseCatalogEntry decodes a catalog document, checking what a proxy
// needs to route by it.
func ParseCatalogEntry(d bsoncore.Document) (CatalogEntry, error) {
	str := func(k string) string { s, _ := d.Lookup(k).StringValueOK(); return s }
	num := func(k string) int64 { n, _ := d.Lookup(k).AsInt64OK(); return n }
	e := CatalogEntry{State: str("state"), Nonce: str("nonce"), Created: rules.Created{
		DB: str("db"), Collection: str("coll"),
		TimeField: str("timeField"), MetaField: str("metaField"),
		Declared: rules.Timeseries{
			Granularity:           str("granularity"),
			BucketMaxSpanSeconds:  num("bucketMaxSpanSeconds"),
			BucketRoundingSeconds: num("bucketRoundingSeconds"),
		},
		SpanSeconds:        num("spanSeconds"),
		ExpireAfterSeconds: num("expireAfterSeconds"),
	}}
	if meta, ok := d.Lookup("metaField").StringValueOK(); ok && meta == "" {
		e.Created.Declared.EmptyMetaField = true
	}
	if atEnd, _ := d.Lookup("expireAtWindowEnd").BooleanOK(); atEnd && e.Created.ExpireAfterSeconds == 0 {
		e.Created.ExpireAtWindowEnd = true
	}
	if arr, ok := d.Lookup("aggregates").ArrayOK(); ok {
		vals, _ := arr.Values()
		for _, v := range vals {
			if a, ok := v.StringValueOK(); ok && a != "" && !slices.Contains(e.Created.Aggregates, a) {
				e.Created.Aggregates = append(e.Created.Aggregates, a)
			}
		}
	}
	id, _ := d.Lookup("_id").StringValueOK()
	c := e.Created
	switch {
	case c.DB == "" || c.Collection == "" || id != e.Namespace():
		return e, fmt.Errorf("catalog document %q: db and coll do not name it", id)
	case c.TimeField == "" || c.SpanSeconds <= 0 || c.ExpireAfterSeconds < 0:
		return e, fmt.Errorf("catalog document %q: timeField, spanSeconds or expireAfterSeconds missing or out of range", id)
	case e.State != StateCreating && e.State != StateReady && e.State != StateDropping:
		return e, fmt.Errorf("catalog document %q: unknown state %q", id, e.State)
	}
	return e, nil
}

// CatalogFind reads the whole catalog (a few hundred bytes a namespace).
func CatalogFind() []byte {
	return bsoncore.NewDocumentBuilder().
		AppendString("find", rules.CatalogCollection).
		AppendDocument("filter", bsoncore.NewDocumentBuilder().Build()).
		AppendInt32("batchSize", 100000).
		AppendString("$db", rules.CatalogDB).Build()
}

// CatalogInsert adds an entry; a duplicate key means another create of
// the namespace got there first.
func CatalogInsert(e CatalogEntry) []byte {
	return bsoncore.NewDocumentBuilder().
		AppendString("insert", rules.CatalogCollection).
		AppendArray("documents", bsoncore.NewArrayBuilder().AppendDocument(e.Document()).Build()).
		AppendString("$db", rules.CatalogDB).Build()
}

// CatalogReplace replaces the entry stored with nonce (and state) by e:
// n is 0 when someone else changed it first.
func CatalogReplace(e CatalogEntry, nonce, state string) []byte {
	q := bsoncore.NewDocumentBuilder().
		AppendString("_id", e.Namespace()).
		AppendString("nonce", nonce).
		AppendString("state", state).Build()
	stmt := bsoncore.NewDocumentBuilder().AppendDocument("q", q).AppendDocument("u", e.Document()).Build()
	return bsoncore.NewDocumentBuilder().
		AppendString("update", rules.CatalogCollection).
		AppendArray("updates", bsoncore.NewArrayBuilder().AppendDocument(stmt).Build()).
		AppendString("$db", rules.CatalogDB).Build()
}

// CatalogDelete deletes the entry of ns stored with nonce.
func CatalogDelete(ns, nonce string) []byte {
	q := bsoncore.NewDocumentBuilder().AppendString("_id", ns).AppendString("nonce", nonce).Build()
	stmt := bsoncore.NewDocumentBuilder().AppendDocument("q", q).AppendInt32("limit", 1).Build()
	return bsoncore.NewDocumentBuilder().
		AppendString("delete", rules.CatalogCollection).
		AppendArray("deletes", bsoncore.NewArrayBuilder().AppendDocument(stmt).Build()).
		AppendString("$db", rules.CatalogDB).Build()
}

// ParseCatalogBatch reads a find or getMore reply of the catalog: its
// entries, the cursor id to read on, and the documents it could not read
// (the proxy logs them; their namespaces stay unbucketed).
func ParseCatalogBatch(reply []byte) (entries []CatalogEntry, cursorID int64, bad []error, err error) {
	doc := bsoncore.Document(reply)
	if err := doc.Validate(); err != nil {
		return nil, 0, nil, fmt.Errorf("catalog reply is not valid BSON: %w", err)
	}
	docs, cursorID, err := cursor.Docs(doc)
	if err != nil {
		return nil, 0, nil, fmt.Errorf("reading %s.%s: %w", rules.CatalogDB, rules.CatalogCollection, err)
	}
	for _, d := range docs {
		e, perr := ParseCatalogEntry(d)
		if perr != nil {
			bad = append(bad, perr)
			continue
		}
		entries = append(entries, e)
	}
	return entries, cursorID, bad, nil
}

// CatalogGetMore continues a catalog read.
func CatalogGetMore(id int64) []byte {
	return bsoncore.NewDocumentBuilder().
		AppendInt64("getMore", id).
		AppendString("collection", rules.CatalogCollection).
		AppendString("$db", rules.CatalogDB).Build()
}

// TimeseriesInfo is listCollections' document for a rule's namespace, as
// MongoDB lists a time-series collection: type "timeseries", its options,
// info.readOnly false (only name and type when nameOnly).
func TimeseriesInfo(rule *rules.Rule, nameOnly bool) bsoncore.Document {
	b := bsoncore.NewDocumentBuilder().
		AppendString("name", rule.Collection).
		AppendString("type", "timeseries")
	if nameOnly {
		return b.Build()
	}
	ts := rule.TimeseriesOf()
	tb := bsoncore.NewDocumentBuilder().AppendString("timeField", rule.TimeField)
	if rule.MetaField != "" || ts.EmptyMetaField {
		tb.AppendString("metaField", rule.MetaField)
	}
	if ts.Granularity != "" {
		tb.AppendString("granularity", ts.Granularity)
	} else {
		tb.AppendInt32("bucketRoundingSeconds", int32(ts.BucketRoundingSeconds))
	}
	tb.AppendInt32("bucketMaxSpanSeconds", int32(ts.BucketMaxSpanSeconds))
	ob := bsoncore.NewDocumentBuilder()
	if rule.Expires() {
		ob.AppendInt64("expireAfterSeconds", int64(rule.ExpireAfter.Seconds()))
	}
	ob.AppendDocument("timeseries", tb.Build())
	return b.AppendDocument("options", ob.Build()).
		AppendDocument("info", bsoncore.NewDocumentBuilder().AppendBoolean("readOnly", false).Build()).
		Build()
}

// nameOnly reads listCollections' nameOnly flag.
func nameOnly(body []byte) bool {
	b, _ := bsonutil.Bool(body, "nameOnly", false)
	return b
}
