package agg

import (
	"crypto/rand"
	"encoding/hex"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/expr"
	"github.com/tsproxy/tsproxy/rewrite/expr/value"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// Output is a pipeline's last stage $out or $merge: where the proxy
// writes the result, into a plain collection, instead of answering it.
type Output struct {
	Stage string // "$out" or "$merge"
	DB    string
	Coll  string
	// WhenMatched and WhenNotMatched are $merge's ("replace", "merge",
	// "keepExisting" or "fail"; "insert" or "discard").
	WhenMatched, WhenNotMatched string
}

// ReadOutput reads a $out or $merge stage of a pipeline run on db: a
// collection name, or a document of options.
func ReadOutput(name string, v value.Value, db string) (*Output, error) {
	o := &Output{Stage: name, DB: db}
	var readDoc func(bsoncore.Element) error
	switch name {
	case "$out":
		readDoc = o.outOption
	case "$merge":
		o.WhenMatched, o.WhenNotMatched = "merge", "insert"
		readDoc = o.mergeOption
	default:
		return nil, value.Unsupported("the output stage %q", name)
	}
	if s, ok := v.StringValueOK(); ok {
		o.Coll = s
	} else if d, ok := v.DocumentOK(); ok {
		elems, _ := d.Elements()
		for _, e := range elems {
			if err := readDoc(e); err != nil {
				return nil, err
			}
		}
	} else {
		return nil, value.BadValue(16990, "%s only supports a string or object argument, not %s", name, expr.TypeAlias(v))
	}
	if o.Coll == "" || o.DB == "" {
		return nil, value.BadValue(mongoerr.InvalidNamespace, "%s needs a collection name", name)
	}
	return o, nil
}

func (o *Output) outOption(e bsoncore.Element) error {
	s, ok := e.Value().StringValueOK()
	switch {
	case e.Key() == "timeseries":
		return value.Unsupported("$out with timeseries")
	case !ok:
		return value.BadValue(mongoerr.TypeMismatch, "$out's %q must be a string", e.Key())
	case e.Key() == "db":
		o.DB = s
	case e.Key() == "coll":
		o.Coll = s
	default:
		return value.BadValue(mongoerr.IDLUnknownField, "BSON field '$out.%s' is an unknown field.", e.Key())
	}
	return nil
}

func (o *Output) mergeOption(e bsoncore.Element) error {
	s, isString := e.Value().StringValueOK()
	switch e.Key() {
	case "into":
		if isString {
			o.Coll = s
			return nil
		}
		d, ok := e.Value().DocumentOK()
		if !ok {
			return value.BadValue(mongoerr.TypeMismatch, "$merge 'into' must be a string or an object")
		}
		if db, ok := d.Lookup("db").StringValueOK(); ok {
			o.DB = db
		}
		o.Coll, _ = d.Lookup("coll").StringValueOK()
	case "on":
		if !isString || s != "_id" {
			return value.Unsupported("$merge 'on' fields other than _id")
		}
	case "whenMatched":
		switch {
		case !isString:
			return value.Unsupported("a $merge whenMatched pipeline")
		case s == "replace" || s == "merge" || s == "keepExisting" || s == "fail":
			o.WhenMatched = s
		default:
			return value.BadValue(mongoerr.BadValue, "Enumeration value '%s' for field '$merge.whenMatched' is not a valid value.", s)
		}
	case "whenNotMatched":
		switch s {
		case "insert", "discard":
			o.WhenNotMatched = s
		case "fail":
			return value.Unsupported("$merge whenNotMatched: \"fail\"")
		default:
			return value.BadValue(mongoerr.BadValue, "Enumeration value '%s' for field '$merge.whenNotMatched' is not a valid value.", s)
		}
	case "let":
		return value.Unsupported("$merge with let")
	default:
		return value.BadValue(mongoerr.IDLUnknownField, "BSON field '$merge.%s' is an unknown field.", e.Key())
	}
	return nil
}

// TempCollection is the collection a $out writes before it renames it
// over the target, as MongoDB does with tmp.agg_out.<random> (without
// the dots: FerretDB's renameCollection refuses such a namespace).
func TempCollection() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "tmp_agg_out_" + hex.EncodeToString(b[:])
}

// WithID is doc with an _id first: its own, or a new ObjectId (a result
// without _id, as MongoDB's $out and $merge give it one).
func WithID(doc bsoncore.Document) bsoncore.Document {
	if _, err := doc.LookupErr("_id"); err == nil {
		return doc
	}
	idx, out := bsoncore.AppendDocumentStart(nil)
	out = bsoncore.AppendObjectIDElement(out, "_id", bson.NewObjectID())
	elems, _ := doc.Elements()
	for _, e := range elems {
		out = bsoncore.AppendValueElement(out, e.Key(), e.Value())
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return out
}

// MergeStatement is the update statement that merges doc (with its _id)
// as o says, or nil when o inserts instead (keepExisting, fail).
func (o *Output) MergeStatement(doc bsoncore.Document) bsoncore.Document {
	id := doc.Lookup("_id")
	b := bsoncore.NewDocumentBuilder().AppendDocument("q", bsoncore.NewDocumentBuilder().AppendValue("_id", id).Build())
	switch o.WhenMatched {
	case "replace":
		b.AppendDocument("u", doc)
	case "merge":
		idx, set := bsoncore.AppendDocumentStart(nil)
		elems, _ := doc.Elements()
		for _, e := range elems {
			if e.Key() != "_id" {
				set = bsoncore.AppendValueElement(set, e.Key(), e.Value())
			}
		}
		set, _ = bsoncore.AppendDocumentEnd(set, idx)
		if len(elems) == 1 {
			// Only the _id: nothing to set; an upsert still inserts it.
			b.AppendDocument("u", bsoncore.NewDocumentBuilder().AppendDocument("$setOnInsert", bsoncore.NewDocumentBuilder().AppendValue("_id", id).Build()).Build())
		} else {
			b.AppendDocument("u", bsoncore.NewDocumentBuilder().AppendDocument("$set", set).Build())
		}
	default:
		return nil
	}
	b.AppendBoolean("upsert", o.WhenNotMatched == "insert")
	return b.Build()
}
