package query

import (
	"math"
	"strconv"
	"strings"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
)

// checkOptions refuses every field of body not in known (nor carried).
func (rc *Ctx) CheckOptions(body bsoncore.Document, cmd string, known ...string) error {
	elems, _ := body.Elements()
	for i, e := range elems {
		k := e.Key()
		if i == 0 || CarriedSet[k] {
			continue
		}
		ok := false
		for _, kn := range known {
			if kn == k {
				ok = true
				break
			}
		}
		if ok {
			continue
		}
		if k == "hint" {
			if err := CheckHint(rc.Rule, e.Value()); err != nil {
				return err
			}
			continue
		}
		if boolFalseOK[k] {
			if b, isBool := e.Value().BooleanOK(); isBool && !b {
				continue
			}
		}
		if why, found := refusedReadOptions[k]; found {
			return rc.Unsupported("%s option %q is not supported on a bucketed namespace (%s)", cmd, k, why)
		}
		return rc.Unsupported("%s option %q is not supported on a bucketed namespace", cmd, k)
	}
	return nil
}

// readInt reads a whole number argument (int32, int64 or an integral
// double), as the server accepts them.
func (rc *Ctx) ReadInt(body bsoncore.Document, key, cmd string) (int64, bool, error) {
	v, ok := bsonutil.Lookup(body, key)
	if !ok || v.Type == bsoncore.TypeNull {
		return 0, false, nil
	}
	switch v.Type {
	case bsoncore.TypeInt32:
		return int64(v.Int32()), true, nil
	case bsoncore.TypeInt64:
		return v.Int64(), true, nil
	case bsoncore.TypeDouble:
		f := v.Double()
		if f == math.Trunc(f) && f >= -9.2e18 && f <= 9.2e18 {
			return int64(f), true, nil
		}
	}
	return 0, false, rc.BadValue(mongoerr.TypeMismatch, "%s option %q must be a whole number, got %s", cmd, key, bsonutil.TypeName(v.Type))
}

func (rc *Ctx) ReadFindPaging(body bsoncore.Document) (Paging, error) {
	const cmd = "find"
	var pg Paging
	var err error
	if pg.Skip, _, err = rc.ReadInt(body, "skip", cmd); err != nil {
		return pg, err
	}
	if pg.Skip < 0 {
		return pg, rc.BadValue(mongoerr.BadValue, "find option \"skip\" must be non-negative")
	}
	if pg.Limit, _, err = rc.ReadInt(body, "limit", cmd); err != nil {
		return pg, err
	}
	if pg.Single, err = bsonutil.Bool(body, "singleBatch", false); err != nil {
		return pg, rc.BadValue(mongoerr.TypeMismatch, "find option \"singleBatch\" must be a boolean")
	}
	if pg.Limit < 0 {
		// The find command refuses it (limit: safeInt64 >= 0); a driver
		// sends a negative limit as singleBatch and its absolute value.
		return pg, rc.BadValue(mongoerr.BadValue, "BSON field 'limit' value must be >= 0, actual value '%d'", pg.Limit)
	}
	bs, hasBatch, err := rc.ReadInt(body, "batchSize", cmd)
	if err != nil {
		return pg, err
	}
	if bs < 0 {
		return pg, rc.BadValue(mongoerr.BadValue, "find option \"batchSize\" must be non-negative")
	}
	pg.BatchSize = -1
	if hasBatch {
		pg.BatchSize = bs
	}
	return pg, nil
}

// readCountPaging reads a count's skip and limit; a negative limit counts
// as its absolute value, as on MongoDB.
func (rc *Ctx) ReadCountPaging(body bsoncore.Document) (skip, limit int64, err error) {
	const cmd = "count"
	if skip, _, err = rc.ReadInt(body, "skip", cmd); err != nil {
		return 0, 0, err
	}
	if skip < 0 {
		return 0, 0, rc.BadValue(mongoerr.BadValue, "count option \"skip\" must be non-negative")
	}
	if limit, _, err = rc.ReadInt(body, "limit", cmd); err != nil {
		return 0, 0, err
	}
	if limit < 0 && limit != math.MinInt64 {
		limit = -limit
	}
	return skip, limit, nil
}

func (rc *Ctx) ReadDoc(body bsoncore.Document, key, cmd string) (bsoncore.Document, error) {
	v, ok := bsonutil.Lookup(body, key)
	if !ok || v.Type == bsoncore.TypeNull {
		return nil, nil
	}
	d, ok := v.DocumentOK()
	if !ok {
		return nil, rc.BadValue(mongoerr.TypeMismatch, "%s option %q must be a document, got %s", cmd, key, bsonutil.TypeName(v.Type))
	}
	return d, nil
}

// translateSort renames sort keys as filter paths are renamed.
func (rc *Ctx) TranslateSort(sort bsoncore.Document, cmd string) (bsoncore.Document, error) {
	elems, err := sort.Elements()
	if err != nil {
		return nil, rc.BadValue(mongoerr.InvalidBSON, "sort is not valid BSON: %v", err)
	}
	if len(elems) == 0 {
		return nil, nil
	}
	idx, d := bsoncore.AppendDocumentStart(nil)
	for _, e := range elems {
		k := e.Key()
		if k == "" || strings.HasPrefix(k, "$") {
			return nil, rc.BadValue(mongoerr.BadValue, "%s sort key %q is not a field path", cmd, k)
		}
		v := e.Value()
		f, ok := v.AsFloat64OK()
		if !ok || (f != 1 && f != -1) {
			if v.Type == bsoncore.TypeEmbeddedDocument {
				return nil, rc.Unsupported("%s sort on %q by %s is not supported on a bucketed namespace", cmd, k, v.String())
			}
			return nil, rc.BadValue(mongoerr.BadValue, "%s sort direction of %q must be 1 or -1", cmd, k)
		}
		if _, isMeta := rc.MetaPath(k); isMeta && !rc.Caps.UnwindKeepsFields {
			return nil, rc.Unsupported("%s on the metaField %q is not supported on a bucketed namespace on this upstream (FerretDB's $unwind drops the bucket's meta)", cmd+" sort", k)
		}
		d = bsoncore.AppendInt32Element(d, rc.UpstreamPath(k), int32(f))
	}
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d, nil
}

// aggregateCommand builds the upstream aggregate on the bucket
// collection. batchSize < 0: none given. forExplain leaves out $db and the
// generic arguments (the explain wrapper carries them).
func (rc *Ctx) AggregateCommand(pipeline []bsoncore.Document, batchSize int64, body bsoncore.Document, extra []bsoncore.Element, forExplain bool) bsoncore.Document {
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendStringElement(d, "aggregate", rc.Rule.BucketCollection)
	aidx, a := bsoncore.AppendArrayElementStart(d, "pipeline")
	for i, s := range pipeline {
		a = bsoncore.AppendDocumentElement(a, strconv.Itoa(i), s)
	}
	d, _ = bsoncore.AppendArrayEnd(a, aidx)
	cidx, c := bsoncore.AppendDocumentElementStart(d, "cursor")
	if batchSize >= 0 {
		c = bsoncore.AppendInt64Element(c, "batchSize", batchSize)
	}
	d, _ = bsoncore.AppendDocumentEnd(c, cidx)
	for _, e := range extra {
		d = append(d, e...)
	}
	if !forExplain {
		for _, e := range bsonutil.Pick(body, Carried) {
			d = append(d, e...)
		}
		d = bsoncore.AppendStringElement(d, "$db", rc.Rule.DB)
	}
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

// CheckHint checks a command's or a statement's hint, which the proxy
// accepts and ignores, as the server ignores a hint on a view: the app's
// index names do not name the bucket collection's indexes, and the proxy
// plans its reads, deletes and updates itself.
func CheckHint(rule *rules.Rule, v bsoncore.Value) error {
	if t := v.Type; t != bsoncore.TypeString && t != bsoncore.TypeEmbeddedDocument {
		return RuleErrorf(rule, mongoerr.FailedToParse, "hint must be either a string or nested object")
	}
	return nil
}
