package point

import (
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/query"
)

// A time-series collection's natural order is its buckets' order, and a
// bucket's _id starts with its start time: MongoDB's forward scan is time
// order, its backward scan the reverse. The proxy's buckets are not kept
// in that order, so $natural is read as the time order it stands for.

// NaturalFind rewrites a find's $natural sort keys to the timeField, and a
// hint of {$natural: d} with no sort to a sort on the timeField.
func NaturalFind(rc *query.Ctx, body bsoncore.Document) (bsoncore.Document, error) {
	dir, hinted, err := naturalHint(rc, body)
	if err != nil {
		return nil, err
	}
	sortDoc, err := rc.ReadDoc(body, "sort", "find")
	if err != nil {
		return nil, err
	}
	if elems, _ := sortDoc.Elements(); len(elems) > 0 {
		sorted, changed, err := naturalSortKeys(rc, sortDoc)
		if err != nil || !changed {
			return body, err
		}
		return bsonutil.ReplaceField(body, "sort", func(dst []byte) []byte {
			return bsoncore.AppendDocumentElement(dst, "sort", sorted)
		}), nil
	}
	if !hinted {
		return body, nil
	}
	byTime := timeSort(rc, dir)
	if _, has := bsonutil.Lookup(body, "sort"); has {
		// sort: null or {}.
		return bsonutil.ReplaceField(body, "sort", func(dst []byte) []byte {
			return bsoncore.AppendDocumentElement(dst, "sort", byTime)
		}), nil
	}
	return bsonutil.AppendField(body, "sort", bsonutil.DocValue(byTime)), nil
}

// NaturalAggregate puts a hint of {$natural: d} in an aggregate's
// pipeline as a time sort after its leading $match stages: the order the
// stages after them see events in.
func NaturalAggregate(rc *query.Ctx, body bsoncore.Document) (bsoncore.Document, error) {
	dir, hinted, err := naturalHint(rc, body)
	if err != nil || !hinted {
		return body, err
	}
	v, ok := bsonutil.Lookup(body, "pipeline")
	if !ok {
		return body, nil
	}
	arr, ok := v.ArrayOK()
	if !ok {
		return body, nil
	}
	stages, err := arr.Values()
	if err != nil {
		return body, nil
	}
	at := 0
	for at < len(stages) && stageName(stages[at]) == "$match" {
		at++
	}
	if at < len(stages) && orderBlind[stageName(stages[at])] {
		return body, nil
	}
	sortStage := bsonutil.Stage("$sort", bsonutil.DocValue(timeSort(rc, dir)))
	return bsonutil.ReplaceField(body, "pipeline", func(dst []byte) []byte {
		aidx, a := bsoncore.AppendArrayElementStart(dst, "pipeline")
		n := 0
		for i, st := range stages {
			if i == at {
				a = bsoncore.AppendDocumentElement(a, bsonutil.Itoa(n), sortStage)
				n++
			}
			a = bsoncore.AppendValueElement(a, bsonutil.Itoa(n), st)
			n++
		}
		if at == len(stages) {
			a = bsoncore.AppendDocumentElement(a, bsonutil.Itoa(n), sortStage)
		}
		a, _ = bsoncore.AppendArrayEnd(a, aidx)
		return a
	}), nil
}

// orderBlind stages do not depend on the order of their input, or must
// come first: a hint's sort before them would only cost.
var orderBlind = map[string]bool{
	"$count": true, "$sort": true, "$collStats": true, "$indexStats": true,
	"$geoNear": true, "$search": true, "$vectorSearch": true, "$documents": true,
}

func stageName(v bsoncore.Value) string {
	d, ok := v.DocumentOK()
	if !ok {
		return ""
	}
	e, err := d.IndexErr(0)
	if err != nil {
		return ""
	}
	return e.Key()
}

// naturalHint reads a hint of {$natural: d}: the direction is d's sign, as
// the server reads it.
func naturalHint(rc *query.Ctx, body bsoncore.Document) (dir int32, ok bool, err error) {
	v, has := bsonutil.Lookup(body, "hint")
	if !has {
		return 0, false, nil
	}
	h, isDoc := v.DocumentOK()
	if !isDoc {
		return 0, false, nil
	}
	d, has := bsonutil.Lookup(h, "$natural")
	if !has {
		return 0, false, nil
	}
	f, isNum := d.AsFloat64OK()
	if !isNum {
		return 0, false, rc.BadValue(mongoerr.BadValue, "hint {$natural: ...} must be a number, got %s", bsonutil.TypeName(d.Type))
	}
	if f < 0 {
		return -1, true, nil
	}
	return 1, true, nil
}

// naturalSortKeys renames a $natural sort key to the timeField (dropped
// when the sort names the timeField already).
func naturalSortKeys(rc *query.Ctx, sortDoc bsoncore.Document) (bsoncore.Document, bool, error) {
	if _, has := bsonutil.Lookup(sortDoc, "$natural"); !has {
		return sortDoc, false, nil
	}
	_, hasTime := bsonutil.Lookup(sortDoc, rc.TimeField)
	elems, err := sortDoc.Elements()
	if err != nil {
		return nil, false, rc.BadValue(mongoerr.InvalidBSON, "sort is not valid BSON: %v", err)
	}
	idx, out := bsoncore.AppendDocumentStart(nil)
	for _, e := range elems {
		if e.Key() != "$natural" {
			out = append(out, e...)
			continue
		}
		f, ok := e.Value().AsFloat64OK()
		if !ok || (f != 1 && f != -1) {
			return nil, false, rc.BadValue(mongoerr.BadValue, "$natural sort cannot be set to a value other than -1 or 1")
		}
		if !hasTime {
			out = bsoncore.AppendInt32Element(out, rc.TimeField, int32(f))
			hasTime = true
		}
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return out, true, nil
}

func timeSort(rc *query.Ctx, dir int32) bsoncore.Document {
	return bsoncore.NewDocumentBuilder().AppendInt32(rc.TimeField, dir).Build()
}
