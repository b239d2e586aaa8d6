package admin

import (
	"slices"
	"strconv"
	"strings"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/cursor"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/query"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// adminCarried are the generic arguments carried by a rewritten admin
// command.
var adminCarried = []string{"lsid", "txnNumber", "writeConcern", "comment", "maxTimeMS", "$clusterTime", "$readPreference", "apiVersion", "apiStrict", "apiDeprecationErrors"}

// isGeneric reports whether key is a generic command argument.
func isGeneric(key string) bool {
	if key == "$db" || key == "autocommit" || key == "startTransaction" || key == "readConcern" {
		return true
	}
	for _, k := range adminCarried {
		if k == key {
			return true
		}
	}
	return false
}

// adminCommand starts an upstream command named cmd on the bucket
// collection; finish it with endAdmin.
func adminCommand(cmd string, rule *rules.Rule) (int32, []byte) {
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendStringElement(d, cmd, rule.BucketCollection)
	return idx, d
}

func endAdmin(idx int32, d []byte, body bsoncore.Document, rule *rules.Rule) []byte {
	d = bsonutil.AppendElems(d, bsonutil.Pick(body, adminCarried))
	d = bsoncore.AppendStringElement(d, "$db", rule.DB)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

// PlanCreate maps create (createCollection) of a rule's namespace to the
// creation of its bucket collection. A timeseries option must agree with
// the rule (its bucketing settings are the rule's); options that would
// change what a plain bucket collection is are refused.
func PlanCreate(body []byte, rule *rules.Rule) ([]byte, error) {
	doc := bsoncore.Document(body)
	if err := query.CheckTarget(doc, rule, "create"); err != nil {
		return nil, err
	}
	elems, _ := doc.Elements()
	for _, e := range elems[1:] {
		k := e.Key()
		switch {
		case isGeneric(k):
		case k == "timeseries":
			if err := checkTimeseries(e.Value(), rule); err != nil {
				return nil, err
			}
		default:
			return nil, query.RuleErrorf(rule, mongoerr.NotImplemented, "create option %q is not supported on a bucketed namespace (the proxy creates the bucket collection %s)", k, rule.BucketNamespace())
		}
	}
	idx, d := adminCommand("create", rule)
	return endAdmin(idx, d, doc, rule), nil
}

func checkTimeseries(v bsoncore.Value, rule *rules.Rule) error {
	ts, ok := v.DocumentOK()
	if !ok {
		return mongoerr.Errorf(mongoerr.TypeMismatch, "create option \"timeseries\" must be a document")
	}
	elems, _ := ts.Elements()
	for _, e := range elems {
		s, _ := e.Value().StringValueOK()
		switch e.Key() {
		case "timeField":
			if s != rule.TimeField {
				return query.RuleErrorf(rule, mongoerr.InvalidOptions, "timeseries.timeField %q differs from the rule's timeField %q", s, rule.TimeField)
			}
		case "metaField":
			if s != rule.MetaField {
				return query.RuleErrorf(rule, mongoerr.InvalidOptions, "timeseries.metaField %q differs from the rule's metaField %q", s, rule.MetaField)
			}
		case "granularity", "bucketMaxSpanSeconds", "bucketRoundingSeconds":
			// The rule's bucket settings apply.
		default:
			return query.RuleErrorf(rule, mongoerr.NotImplemented, "timeseries option %q is not supported by the proxy", e.Key())
		}
	}
	return nil
}

// indexField maps an event path of an index key to its bucket path.
func indexField(rule *rules.Rule, path string) (string, bool) {
	switch {
	case path == rule.TimeField:
		return bucket.FieldStart, true
	case rule.MetaField != "" && path == rule.MetaField:
		return bucket.FieldMeta, true
	case rule.MetaField != "" && strings.HasPrefix(path, rule.MetaField+"."):
		return bucket.FieldMeta + path[len(rule.MetaField):], true
	}
	return "", false
}

// isIndexedAggregate reports whether path is one of rule's aggregates
// that an index may name: a top-level field, whose min and max every
// bucket keeps (rewrite/bucket), as MongoDB keeps control.min and
// control.max of each field for a time-series collection's secondary
// indexes.
func isIndexedAggregate(rule *rules.Rule, path string) bool {
	return !strings.ContainsRune(path, '.') && slices.Contains(rule.Aggregates, path)
}

// appendSummaryKey appends the bucket keys of an index on aggregate
// field f, as MongoDB makes them: {min.f: 1, max.f: 1} ascending,
// {max.f: -1, min.f: -1} descending.
func appendSummaryKey(dst []byte, f string, dir bsoncore.Value, desc bool) []byte {
	first, second := bucket.FieldMin, bucket.FieldMax
	if desc {
		first, second = second, first
	}
	dst = bsoncore.AppendValueElement(dst, first+"."+f, dir)
	return bsoncore.AppendValueElement(dst, second+"."+f, dir)
}

// summaryKeyField is the aggregate field of a bucket index key's
// min.f or max.f, or "".
func summaryKeyField(rule *rules.Rule, path string) string {
	for _, p := range []string{bucket.FieldMin + ".", bucket.FieldMax + "."} {
		if f, ok := strings.CutPrefix(path, p); ok && isIndexedAggregate(rule, f) {
			return f
		}
	}
	return ""
}

// appField maps a bucket path of an index key back to the event path.
func appField(rule *rules.Rule, path string) (string, bool) {
	switch {
	case path == bucket.FieldID:
		return path, true
	case path == bucket.FieldStart:
		return rule.TimeField, true
	case rule.MetaField == "":
		return "", false
	case path == bucket.FieldMeta:
		return rule.MetaField, true
	case strings.HasPrefix(path, bucket.FieldMeta+"."):
		return rule.MetaField + path[len(bucket.FieldMeta):], true
	}
	return "", false
}

// translateIndexKey maps an app index key to the bucket collection: the
// metaField (and paths inside it) to meta, the timeField to start. Only
// ascending and descending keys: a bucket's start is the window's, so an
// index on it serves time ranges at the window's grain.
func translateIndexKey(rule *rules.Rule, key bsoncore.Document) (bsoncore.Document, error) {
	elems, err := key.Elements()
	if err != nil || len(elems) == 0 {
		return nil, mongoerr.Errorf(mongoerr.BadValue, "index key must be a non-empty document")
	}
	idx, d := bsoncore.AppendDocumentStart(nil)
	for _, e := range elems {
		if isIndexedAggregate(rule, e.Key()) {
			dir, ok := e.Value().AsFloat64OK()
			if !ok || (dir != 1 && dir != -1) {
				return nil, query.RuleErrorf(rule, mongoerr.NotImplemented, "index type %s on %q is not supported on a bucketed namespace: only 1 and -1", e.Value().String(), e.Key())
			}
			d = appendSummaryKey(d, e.Key(), e.Value(), dir < 0)
			continue
		}
		f, ok := indexField(rule, e.Key())
		if !ok && e.Key() == "" && rule.Declared != nil && rule.Declared.EmptyMetaField {
			return nil, query.RuleErrorf(rule, mongoerr.NotImplemented, "an index on the metaField \"\" is not supported: tsproxy stores the \"\" field in each event, not as the buckets' meta; only the timeField %q can be indexed", rule.TimeField)
		}
		if !ok && slices.Contains(rule.Aggregates, e.Key()) {
			return nil, query.RuleErrorf(rule, mongoerr.NotImplemented, "an index on %q is not supported on a bucketed namespace: of the rule's aggregates, only top-level fields can be indexed", e.Key())
		}
		if !ok {
			return nil, query.RuleErrorf(rule, mongoerr.NotImplemented, "an index on %q is not supported on a bucketed namespace: only the metaField %q (and fields inside it), the timeField %q and the rule's aggregates %q (whose min and max every bucket keeps; add a measurement to the rule's aggregates to index it) can be indexed", e.Key(), rule.MetaField, rule.TimeField, rule.Aggregates)
		}
		dir, ok := e.Value().AsFloat64OK()
		if !ok || (dir != 1 && dir != -1) {
			return nil, query.RuleErrorf(rule, mongoerr.NotImplemented, "index type %s on %q is not supported on a bucketed namespace: only 1 and -1", e.Value().String(), e.Key())
		}
		d = bsoncore.AppendValueElement(d, f, e.Value())
	}
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d, nil
}

// PlanCreateIndexes maps createIndexes to the bucket collection. Where
// the proxy's own index is virtual (caps.UnusedIndexes: not made, only
// listed), a spec of it is left out, as the no-op its create is on a
// native collection; cmd is nil when nothing else is left.
func PlanCreateIndexes(body []byte, rule *rules.Rule, ownVirtual bool) (cmd []byte, err error) {
	doc := bsoncore.Document(body)
	if err := query.CheckTarget(doc, rule, "createIndexes"); err != nil {
		return nil, err
	}
	elems, _ := doc.Elements()
	idx, d := adminCommand("createIndexes", rule)
	found, kept := false, 0
	for _, e := range elems[1:] {
		k := e.Key()
		switch {
		case isGeneric(k), k == "commitQuorum":
			if k == "commitQuorum" {
				d = append(d, e...)
			}
		case k == "indexes":
			specs, err := rewrite.ArrayDocuments(e.Value(), "indexes")
			if err != nil {
				return nil, err
			}
			if len(specs) == 0 {
				return nil, mongoerr.Errorf(mongoerr.BadValue, "createIndexes needs at least one index")
			}
			aidx, a := bsoncore.AppendArrayElementStart(d, "indexes")
			for _, s := range specs {
				t, err := translateIndexSpec(rule, s)
				if err != nil {
					return nil, err
				}
				if name, _ := t.Lookup("name").StringValueOK(); ownVirtual && name == bucket.IndexName {
					continue
				}
				a = bsoncore.AppendDocumentElement(a, strconv.Itoa(kept), t)
				kept++
			}
			d, _ = bsoncore.AppendArrayEnd(a, aidx)
			found = true
		default:
			return nil, query.RuleErrorf(rule, mongoerr.NotImplemented, "createIndexes option %q is not supported on a bucketed namespace", k)
		}
	}
	if !found {
		return nil, mongoerr.Errorf(mongoerr.FailedToParse, "createIndexes needs \"indexes\"")
	}
	if kept == 0 {
		return nil, nil
	}
	return endAdmin(idx, d, doc, rule), nil
}

func translateIndexSpec(rule *rules.Rule, spec bsoncore.Document) (bsoncore.Document, error) {
	elems, _ := spec.Elements()
	idx, d := bsoncore.AppendDocumentStart(nil)
	hasKey, hasName := false, false
	for _, e := range elems {
		switch e.Key() {
		case "key":
			kd, ok := e.Value().DocumentOK()
			if !ok {
				return nil, mongoerr.Errorf(mongoerr.TypeMismatch, "index \"key\" must be a document")
			}
			t, err := translateIndexKey(rule, kd)
			if err != nil {
				return nil, err
			}
			d = bsoncore.AppendDocumentElement(d, "key", t)
			hasKey = true
		case "name":
			if _, ok := e.Value().StringValueOK(); !ok {
				return nil, mongoerr.Errorf(mongoerr.TypeMismatch, "index \"name\" must be a string")
			}
			d = append(d, e...)
			hasName = true
		case "background", "hidden", "v":
			d = append(d, e...)
		default:
			// unique, sparse, partial and TTL indexes hold for events, not
			// for buckets: on the bucket collection they would mean
			// something else.
			return nil, query.RuleErrorf(rule, mongoerr.NotImplemented, "index option %q is not supported on a bucketed namespace", e.Key())
		}
	}
	if !hasKey || !hasName {
		return nil, mongoerr.Errorf(mongoerr.FailedToParse, "each index needs \"key\" and \"name\"")
	}
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	if isBucketIndexKey(bsoncore.Document(d).Lookup("key").Document()) {
		// The proxy's own index already: under its bucket name, the
		// create is the no-op it is on a native time-series collection.
		d = renameIndexSpec(d, bucket.IndexName)
	}
	return d, nil
}

// renameIndexSpec is spec with its name set to name.
func renameIndexSpec(spec bsoncore.Document, name string) bsoncore.Document {
	elems, _ := spec.Elements()
	idx, d := bsoncore.AppendDocumentStart(nil)
	for _, e := range elems {
		if e.Key() == "name" {
			d = bsoncore.AppendStringElement(d, "name", name)
			continue
		}
		d = append(d, e...)
	}
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

// PlanListIndexes maps listIndexes to the bucket collection; map its
// reply with ListIndexesReply.
func PlanListIndexes(body []byte, rule *rules.Rule) ([]byte, error) {
	doc := bsoncore.Document(body)
	if err := query.CheckTarget(doc, rule, "listIndexes"); err != nil {
		return nil, err
	}
	idx, d := adminCommand("listIndexes", rule)
	return endAdmin(idx, d, doc, rule), nil
}

// ListIndexesReply shows the bucket collection's indexes as the app's:
// keys on meta and start under the metaField and timeField names, the
// reply's ns the app's. Indexes on other bucket fields (made directly on
// the bucket collection) mean nothing for events and are left out. The
// proxy's own index is listed first when it is virtual (ownVirtual: see
// PlanCreateIndexes) and not there. The whole list is one batch (a
// collection has at most 64 indexes).
func ListIndexesReply(reply []byte, rule *rules.Rule, ownVirtual bool) []byte {
	doc := bsoncore.Document(reply)
	if err := mongoerr.ReplyError(doc); err != nil {
		return renameNSError(err, rule)
	}
	docs, _, err := cursor.Docs(reply)
	if err != nil {
		return mongoerr.Reply(err)
	}
	var specs []bsoncore.Document
	own := false
	for _, spec := range docs {
		if name, _ := spec.Lookup("name").StringValueOK(); name == bucket.IndexName {
			own = true
		}
		if m, ok := appIndexSpec(spec, rule); ok {
			specs = append(specs, m)
		}
	}
	if v, ok := virtualOwnIndex(rule); ok && ownVirtual && !own {
		specs = append([]bsoncore.Document{v}, specs...)
	}
	idx, d := bsoncore.AppendDocumentStart(nil)
	cidx, c := bsoncore.AppendDocumentElementStart(d, "cursor")
	c = bsoncore.AppendInt64Element(c, "id", 0)
	c = bsoncore.AppendStringElement(c, "ns", rule.Namespace)
	aidx, a := bsoncore.AppendArrayElementStart(c, "firstBatch")
	for i, m := range specs {
		a = bsoncore.AppendDocumentElement(a, strconv.Itoa(i), m)
	}
	c, _ = bsoncore.AppendArrayEnd(a, aidx)
	d, _ = bsoncore.AppendDocumentEnd(c, cidx)
	d = bsoncore.AppendDoubleElement(d, "ok", 1)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

// virtualOwnIndex is the spec of the proxy's own index where it is not
// made (caps.UnusedIndexes), as MongoDB lists a native collection's
// {metaField: 1, timeField: 1}; none for a rule without a metaField.
func virtualOwnIndex(rule *rules.Rule) (bsoncore.Document, bool) {
	name, ok := ownIndexAppName(rule)
	if !ok {
		return nil, false
	}
	key := bsoncore.NewDocumentBuilder().AppendInt32(rule.MetaField, 1).AppendInt32(rule.TimeField, 1).Build()
	return bsoncore.NewDocumentBuilder().AppendInt32("v", 2).AppendDocument("key", key).AppendString("name", name).Build(), true
}

// appIndexSpec is a bucket index as a native time-series collection
// lists it: the proxy's own {meta: 1, start: 1} as the metaField and
// timeField index MongoDB creates (named <metaField>_1_<timeField>_1),
// and no _id index (the buckets' _ids are not the events'; a native
// time-series collection lists none either).
func appIndexSpec(spec bsoncore.Document, rule *rules.Rule) (bsoncore.Document, bool) {
	elems, err := spec.Elements()
	if err != nil {
		return nil, false
	}
	name, _ := spec.Lookup("name").StringValueOK()
	if kd, ok := spec.Lookup("key").DocumentOK(); ok {
		if first, err := kd.IndexErr(0); err == nil && first.Key() == bucket.FieldID {
			return nil, false
		}
	}
	idx, d := bsoncore.AppendDocumentStart(nil)
	for _, e := range elems {
		switch e.Key() {
		case "name":
			if name == bucket.IndexName {
				own, ok := ownIndexAppName(rule)
				if !ok {
					return nil, false
				}
				d = bsoncore.AppendStringElement(d, "name", own)
				continue
			}
			d = append(d, e...)
		case "key":
			kd, ok := e.Value().DocumentOK()
			if !ok {
				return nil, false
			}
			kes, _ := kd.Elements()
			kidx, k := bsoncore.AppendDocumentElementStart(d, "key")
			for i := 0; i < len(kes); i++ {
				ke := kes[i]
				if f := summaryKeyField(rule, ke.Key()); f != "" {
					// min.f and max.f (or max.f and min.f) are one key on f.
					if i+1 >= len(kes) || summaryKeyField(rule, kes[i+1].Key()) != f || kes[i+1].Key() == ke.Key() {
						return nil, false
					}
					k = bsoncore.AppendValueElement(k, f, ke.Value())
					i++
					continue
				}
				f, ok := appField(rule, ke.Key())
				if !ok {
					return nil, false
				}
				k = bsoncore.AppendValueElement(k, f, ke.Value())
			}
			d, _ = bsoncore.AppendDocumentEnd(k, kidx)
		case "ns":
			d = bsoncore.AppendStringElement(d, "ns", rule.Namespace)
		default:
			d = append(d, e...)
		}
	}
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d, true
}

// renameNSError is an upstream error reply about the bucket collection,
// told of the app's namespace.
func renameNSError(err error, rule *rules.Rule) []byte {
	ce, ok := err.(*mongoerr.Error)
	if !ok {
		return mongoerr.Reply(err)
	}
	msg := strings.ReplaceAll(ce.Msg, rule.BucketNamespace(), rule.Namespace)
	return mongoerr.Reply(&mongoerr.Error{Code: ce.Code, Msg: msg})
}

// AdminReply passes an upstream reply on, with the bucket collection's
// name in an error message replaced by the app's namespace.
func Reply(reply []byte, rule *rules.Rule) []byte {
	if err := mongoerr.ReplyError(bsoncore.Document(reply)); err != nil {
		return renameNSError(err, rule)
	}
	return reply
}

// PlanDropIndexes maps dropIndexes to the bucket collection: index names
// pass as they are, key patterns are translated. The proxy's own index
// cannot be dropped by name; "*" drops it with the others, and the proxy
// creates it again (DropIndexesPlan.Recreate).
func PlanDropIndexes(body []byte, rule *rules.Rule) (cmd []byte, recreate bool, err error) {
	doc := bsoncore.Document(body)
	if err := query.CheckTarget(doc, rule, "dropIndexes"); err != nil {
		return nil, false, err
	}
	iv, ok := bsonutil.Lookup(doc, "index")
	if !ok {
		return nil, false, mongoerr.Errorf(mongoerr.FailedToParse, "dropIndexes needs \"index\"")
	}
	refuseOwn := func() error {
		return query.RuleErrorf(rule, mongoerr.NotImplemented, "index %q is the proxy's own (bucketed reads select buckets with it) and cannot be dropped", bucket.IndexName)
	}
	idx, d := adminCommand("dropIndexes", rule)
	switch iv.Type {
	case bsoncore.TypeString:
		name := iv.StringValue()
		if isOwnIndexName(rule, name) {
			return nil, false, refuseOwn()
		}
		recreate = name == "*"
		d = bsoncore.AppendStringElement(d, "index", name)
	case bsoncore.TypeArray:
		vals, _ := iv.Array().Values()
		for _, v := range vals {
			s, ok := v.StringValueOK()
			if !ok {
				return nil, false, mongoerr.Errorf(mongoerr.TypeMismatch, "dropIndexes \"index\" array must hold names")
			}
			if isOwnIndexName(rule, s) {
				return nil, false, refuseOwn()
			}
		}
		d = bsoncore.AppendArrayElement(d, "index", iv.Array())
	case bsoncore.TypeEmbeddedDocument:
		t, err := translateIndexKey(rule, iv.Document())
		if err != nil {
			return nil, false, err
		}
		if isBucketIndexKey(t) {
			return nil, false, refuseOwn()
		}
		d = bsoncore.AppendDocumentElement(d, "index", t)
	default:
		return nil, false, mongoerr.Errorf(mongoerr.TypeMismatch, "dropIndexes \"index\" must be a name, names or a key pattern, got %s", bsonutil.TypeName(iv.Type))
	}
	return endAdmin(idx, d, doc, rule), recreate, nil
}

// ownIndexAppName is the name the app sees of the proxy's own index:
// MongoDB's name of the {metaField: 1, timeField: 1} index it creates on
// a native time-series collection. A rule without a metaField shows none.
func ownIndexAppName(rule *rules.Rule) (string, bool) {
	if rule.MetaField == "" {
		return "", false
	}
	return rule.MetaField + "_1_" + rule.TimeField + "_1", true
}

// isOwnIndexName says whether name names the proxy's own index, by its
// bucket name or the app's.
func isOwnIndexName(rule *rules.Rule, name string) bool {
	own, ok := ownIndexAppName(rule)
	return name == bucket.IndexName || ok && name == own
}

// isBucketIndexKey reports whether a bucket index key is {meta: 1,
// start: 1}, whatever the numbers' types.
func isBucketIndexKey(key bsoncore.Document) bool {
	elems, _ := key.Elements()
	if len(elems) != 2 || elems[0].Key() != bucket.FieldMeta || elems[1].Key() != bucket.FieldStart {
		return false
	}
	for _, e := range elems {
		if f, ok := e.Value().AsFloat64OK(); !ok || f != 1 {
			return false
		}
	}
	return true
}

// NewMeasurements are the fields the indexes of a createIndexes name
// that a created time-series collection (rule.Declared) does not keep
// summaries of yet: top-level fields other than its metaField, timeField
// and aggregates, with an ascending or descending key. Its catalog entry
// takes them as aggregates before the indexes are made (MongoDB indexes
// any measurement, by each bucket's control.min and max). None for a
// config rule, whose aggregates are config.yaml's.
func NewMeasurements(body []byte, rule *rules.Rule) []string {
	if rule.Declared == nil {
		return nil
	}
	specs, err := rewrite.ArrayDocuments(bsoncore.Document(body).Lookup("indexes"), "indexes")
	if err != nil {
		return nil
	}
	var out []string
	for _, s := range specs {
		key, ok := s.Lookup("key").DocumentOK()
		if !ok {
			continue
		}
		elems, _ := key.Elements()
		for _, e := range elems {
			f := e.Key()
			dir, isNum := e.Value().AsFloat64OK()
			if _, isEvent := indexField(rule, f); isEvent || f == "" || f == bucket.FieldID ||
				strings.ContainsAny(f, ".$") || !isNum || (dir != 1 && dir != -1) ||
				slices.Contains(rule.Aggregates, f) || slices.Contains(out, f) {
				continue
			}
			out = append(out, f)
		}
	}
	return out
}
