package query

import (
	"strconv"
	"strings"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/match"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// refused top-level and field operators: they need more than a renaming
// (JavaScript, expressions over the whole document, text or geo indexes,
// schemas over the event).
var refusedOperators = map[string]string{
	"$where":         "JavaScript",
	"$expr":          "aggregation expressions",
	"$text":          "text search",
	"$jsonSchema":    "JSON Schema",
	"$near":          "geospatial queries",
	"$nearSphere":    "geospatial queries",
	"$geoWithin":     "geospatial queries",
	"$geoIntersects": "geospatial queries",
	"$within":        "geospatial queries",
	"$sampleRate":    "sampling",
	"$alwaysTrue":    "internal operators",
	"$alwaysFalse":   "internal operators",
}

// checkFieldOperators validates an operator document under a field path.
func (rc *Ctx) checkFieldOperators(ops bsoncore.Document, depth int) error {
	if depth > bsonutil.MaxDepth {
		return rc.BadValue(mongoerr.BadValue, "filter nested deeper than %d levels", bsonutil.MaxDepth)
	}
	elems, err := ops.Elements()
	if err != nil {
		return rc.BadValue(mongoerr.InvalidBSON, "filter is not valid BSON: %v", err)
	}
	for _, e := range elems {
		op := e.Key()
		if why, ok := refusedOperators[op]; ok {
			return rc.Unsupported("filter operator %q (%s) is not supported on a bucketed namespace", op, why)
		}
		if !match.FieldOperators[op] {
			return rc.Unsupported("filter operator %q is not supported on a bucketed namespace", op)
		}
		v := e.Value()
		switch op {
		case "$not":
			if d, ok := v.DocumentOK(); ok {
				if err := rc.checkFieldOperators(d, depth+1); err != nil {
					return err
				}
			} else if v.Type != bsoncore.TypeRegex {
				return rc.BadValue(mongoerr.BadValue, "$not needs a regex or a document")
			}
		case "$elemMatch":
			d, ok := v.DocumentOK()
			if !ok {
				return rc.BadValue(mongoerr.BadValue, "$elemMatch needs an Object")
			}
			// Its operand is either operators on the element or a filter
			// whose paths are relative to the element: neither is renamed.
			if _, isOps := match.IsOperatorDoc(v); isOps && !startsWithLogical(d) {
				if err := rc.checkFieldOperators(d, depth+1); err != nil {
					return err
				}
			} else if err := rc.checkRelativeFilter(d, depth+1); err != nil {
				return err
			}
		case "$all":
			if arr, ok := v.ArrayOK(); ok {
				vals, _ := arr.Values()
				for _, item := range vals {
					if d, ok := match.IsOperatorDoc(item); ok {
						if err := rc.checkFieldOperators(d, depth+1); err != nil {
							return err
						}
					}
				}
			}
		}
	}
	return nil
}

func startsWithLogical(d bsoncore.Document) bool {
	elems, err := d.Elements()
	if err != nil || len(elems) == 0 {
		return false
	}
	switch elems[0].Key() {
	case "$and", "$or", "$nor":
		return true
	}
	return false
}

// checkRelativeFilter validates a filter whose paths are not renamed (the
// operand of $elemMatch).
func (rc *Ctx) checkRelativeFilter(f bsoncore.Document, depth int) error {
	if depth > bsonutil.MaxDepth {
		return rc.BadValue(mongoerr.BadValue, "filter nested deeper than %d levels", bsonutil.MaxDepth)
	}
	elems, err := f.Elements()
	if err != nil {
		return rc.BadValue(mongoerr.InvalidBSON, "filter is not valid BSON: %v", err)
	}
	for _, e := range elems {
		k := e.Key()
		switch {
		case k == "$and" || k == "$or" || k == "$nor":
			docs, err := rc.logicalOperand(k, e.Value())
			if err != nil {
				return err
			}
			for _, d := range docs {
				if err := rc.checkRelativeFilter(d, depth+1); err != nil {
					return err
				}
			}
		case k == "$comment":
		case strings.HasPrefix(k, "$"):
			if why, ok := refusedOperators[k]; ok {
				return rc.Unsupported("filter operator %q (%s) is not supported on a bucketed namespace", k, why)
			}
			return rc.Unsupported("filter operator %q is not supported on a bucketed namespace", k)
		default:
			if d, ok := match.IsOperatorDoc(e.Value()); ok {
				if err := rc.checkFieldOperators(d, depth+1); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func (rc *Ctx) logicalOperand(op string, v bsoncore.Value) ([]bsoncore.Document, error) {
	arr, ok := v.ArrayOK()
	if !ok {
		return nil, rc.BadValue(mongoerr.BadValue, "%s must be an array", op)
	}
	vals, err := arr.Values()
	if err != nil {
		return nil, rc.BadValue(mongoerr.InvalidBSON, "%s is not valid BSON: %v", op, err)
	}
	if len(vals) == 0 {
		return nil, rc.BadValue(mongoerr.BadValue, "$and/$or/$nor must be a nonempty array")
	}
	out := make([]bsoncore.Document, 0, len(vals))
	for _, item := range vals {
		d, ok := item.DocumentOK()
		if !ok {
			return nil, rc.BadValue(mongoerr.BadValue, "$or/$and/$nor entries need to be full objects")
		}
		out = append(out, d)
	}
	return out, nil
}

// translateFilter renames every path of an event filter to its path in an
// unwound bucket. It returns the translated filter as a document.
func (rc *Ctx) TranslateFilter(f bsoncore.Document, depth int) (bsoncore.Document, error) {
	idx, dst := bsoncore.AppendDocumentStart(nil)
	dst, err := rc.appendTranslated(dst, f, depth)
	if err != nil {
		return nil, err
	}
	dst, _ = bsoncore.AppendDocumentEnd(dst, idx)
	return dst, nil
}

func (rc *Ctx) appendTranslated(dst []byte, f bsoncore.Document, depth int) ([]byte, error) {
	if depth > bsonutil.MaxDepth {
		return nil, rc.BadValue(mongoerr.BadValue, "filter nested deeper than %d levels", bsonutil.MaxDepth)
	}
	elems, err := f.Elements()
	if err != nil {
		return nil, rc.BadValue(mongoerr.InvalidBSON, "filter is not valid BSON: %v", err)
	}
	for _, e := range elems {
		dst, err = rc.appendTranslatedElem(dst, e, depth)
		if err != nil {
			return nil, err
		}
	}
	return dst, nil
}

func (rc *Ctx) appendTranslatedElem(dst []byte, e bsoncore.Element, depth int) ([]byte, error) {
	k := e.Key()
	switch {
	case k == "$and" || k == "$or" || k == "$nor":
		docs, err := rc.logicalOperand(k, e.Value())
		if err != nil {
			return nil, err
		}
		aidx, out := bsoncore.AppendArrayElementStart(dst, k)
		for i, d := range docs {
			t, err := rc.TranslateFilter(d, depth+1)
			if err != nil {
				return nil, err
			}
			out = bsoncore.AppendDocumentElement(out, strconv.Itoa(i), t)
		}
		out, _ = bsoncore.AppendArrayEnd(out, aidx)
		return out, nil
	case k == "$comment":
		return dst, nil
	case strings.HasPrefix(k, "$"):
		if why, ok := refusedOperators[k]; ok {
			return nil, rc.Unsupported("filter operator %q (%s) is not supported on a bucketed namespace", k, why)
		}
		return nil, rc.Unsupported("filter operator %q is not supported on a bucketed namespace", k)
	case k == "":
		return nil, rc.BadValue(mongoerr.BadValue, "empty field name in filter")
	}
	v := e.Value()
	ops, isOps := match.IsOperatorDoc(v)
	if isOps {
		if err := rc.checkFieldOperators(ops, depth+1); err != nil {
			return nil, err
		}
	}
	if rest, ok := rc.MetaPath(k); ok && rest == "" && isOps {
		return rc.appendMetaOperators(dst, ops)
	}
	if _, ok := rc.MetaPath(k); ok {
		v = storedMetaOperand(v)
	}
	return bsoncore.AppendValueElement(dst, rc.UpstreamPath(k), v), nil
}

// appendMetaOperators translates operators on the metaField itself:
// $exists is answered by the marker, $type also requires the marker (a
// missing meta is stored as a null one), the rest apply to meta.
func (rc *Ctx) appendMetaOperators(dst []byte, ops bsoncore.Document) ([]byte, error) {
	elems, _ := ops.Elements()
	var onMeta, onMarker []bsoncore.Element
	needMarker := false
	for _, e := range elems {
		switch e.Key() {
		case "$exists":
			onMarker = append(onMarker, e)
		case "$type":
			needMarker = true
			onMeta = append(onMeta, e)
		case "$not":
			inner, ok := e.Value().DocumentOK()
			if !ok {
				onMeta = append(onMeta, e)
				continue
			}
			_, hasExists := bsonutil.Lookup(inner, "$exists")
			_, hasType := bsonutil.Lookup(inner, "$type")
			innerElems, _ := inner.Elements()
			switch {
			case hasExists && len(innerElems) == 1:
				onMarker = append(onMarker, e)
			case hasExists || hasType:
				return nil, rc.Unsupported("$not with $type or $exists together with other operators on the metaField %q is not supported on a bucketed namespace", rc.MetaField)
			default:
				onMeta = append(onMeta, e)
			}
		default:
			onMeta = append(onMeta, e)
		}
	}
	if len(onMeta) > 0 {
		rc.UsedMeta = true
		idx, out := bsoncore.AppendDocumentElementStart(dst, bucket.FieldMeta)
		for _, e := range onMeta {
			out = bsoncore.AppendValueElement(out, e.Key(), storedOperatorValue(e.Key(), e.Value()))
		}
		dst, _ = bsoncore.AppendDocumentEnd(out, idx)
	}
	if len(onMarker) > 0 || needMarker {
		idx, out := bsoncore.AppendDocumentElementStart(dst, rc.MarkerPath())
		for _, e := range onMarker {
			out = append(out, e...)
		}
		if needMarker {
			out = bsoncore.AppendBooleanElement(out, "$exists", true)
		}
		dst, _ = bsoncore.AppendDocumentEnd(out, idx)
	}
	return dst, nil
}
