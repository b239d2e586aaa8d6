package agg

import (
	"slices"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/expr"
	"github.com/tsproxy/tsproxy/rewrite/expr/value"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// Foreign holds the documents of the collections a pipeline's $lookup
// stages read, by collection name: the caller reads them (the engine
// does no I/O) before the first Push.
type Foreign struct {
	Docs map[string][]bsoncore.Document
}

// ForeignCollections lists the collections the $lookup stages of
// stages (those inside $facet included) read, in the pipeline's
// database.
func ForeignCollections(stages []Stage) []string {
	var out []string
	seen := map[string]bool{}
	var walk func([]Stage)
	walk = func(stages []Stage) {
		for _, st := range stages {
			d, ok := st.Value.DocumentOK()
			if !ok {
				continue
			}
			switch st.Name {
			case "$lookup":
				if from, ok := d.Lookup("from").StringValueOK(); ok && !seen[from] {
					seen[from] = true
					out = append(out, from)
				}
			case "$facet":
				elems, _ := d.Elements()
				for _, e := range elems {
					arr, _ := e.Value().ArrayOK()
					vals, _ := arr.Values()
					var sub []Stage
					for _, v := range vals {
						if sd, ok := v.DocumentOK(); ok {
							if first, err := sd.IndexErr(0); err == nil {
								sub = append(sub, Stage{Name: first.Key(), Value: first.Value()})
							}
						}
					}
					walk(sub)
				}
			}
		}
	}
	walk(stages)
	return out
}

// $lookup (the equality form): each document with an array of the
// foreign documents whose foreignField equals its localField, as
// MongoDB matches them (arrays by element; null matches null and
// missing).
type lookupStage struct {
	from, as     string
	local        []string
	foreignField []string
	foreign      *Foreign
	index        map[string][]int // by groupKey of a foreign value
	docs         []bsoncore.Document
	next         processor
}

func compileLookup(v value.Value, next processor, opts Options) (processor, error) {
	d, ok := v.DocumentOK()
	if !ok {
		return nil, value.BadValue(mongoerr.FailedToParse, "the $lookup stage specification must be an object")
	}
	l := &lookupStage{foreign: opts.Foreign, next: next}
	elems, _ := d.Elements()
	for _, e := range elems {
		s, isString := e.Value().StringValueOK()
		switch e.Key() {
		case "from", "as", "localField", "foreignField":
			if !isString || s == "" {
				return nil, value.BadValue(mongoerr.FailedToParse, "$lookup argument '%s' must be a non-empty string", e.Key())
			}
		case "pipeline", "let":
			return nil, value.Unsupported("$lookup with %s", e.Key())
		default:
			return nil, value.BadValue(mongoerr.FailedToParse, "unknown argument to $lookup: %s", e.Key())
		}
		switch e.Key() {
		case "from":
			l.from = s
		case "as":
			l.as = s
		case "localField":
			l.local = splitPath(s)
		case "foreignField":
			l.foreignField = splitPath(s)
		}
	}
	if l.from == "" || l.as == "" || l.local == nil || l.foreignField == nil {
		return nil, value.BadValue(mongoerr.FailedToParse, "$lookup requires 'from', 'localField', 'foreignField' and 'as'")
	}
	if len(splitPath(l.as)) > 1 {
		return nil, value.Unsupported("$lookup 'as' a dotted field")
	}
	if l.foreign == nil {
		return nil, value.Unsupported("$lookup here")
	}
	return l, nil
}

// matchKeys are the keys a value matches by: each element of an array,
// null for null and missing.
func matchKeys(v value.Value) []string {
	if v.Type == bsoncore.TypeArray {
		vals, _ := v.Array().Values()
		var keys []string
		for _, el := range vals {
			keys = append(keys, string(value.GroupKey(nil, el)))
		}
		return keys
	}
	return []string{string(value.GroupKey(nil, v))}
}

func (l *lookupStage) push(doc bsoncore.Document) error {
	if l.index == nil {
		l.docs = l.foreign.Docs[l.from]
		l.index = map[string][]int{}
		for i, fd := range l.docs {
			for _, k := range matchKeys(expr.LookupPath(value.Value{Type: bsoncore.TypeEmbeddedDocument, Data: fd}, l.foreignField)) {
				if n := len(l.index[k]); n == 0 || l.index[k][n-1] != i {
					l.index[k] = append(l.index[k], i)
				}
			}
		}
	}
	seen := map[int]bool{}
	var matched []int
	for _, k := range matchKeys(expr.LookupPath(value.Value{Type: bsoncore.TypeEmbeddedDocument, Data: doc}, l.local)) {
		for _, i := range l.index[k] {
			if !seen[i] {
				seen[i] = true
				matched = append(matched, i)
			}
		}
	}
	slices.Sort(matched)
	aidx, arr := bsoncore.AppendArrayStart(nil)
	for j, i := range matched {
		arr = bsoncore.AppendDocumentElement(arr, bsonutil.Itoa(j), l.docs[i])
	}
	arr, _ = bsoncore.AppendArrayEnd(arr, aidx)
	return l.next.push(setTopField(doc, l.as, value.Value{Type: bsoncore.TypeArray, Data: arr}))
}

func (l *lookupStage) flush() error { return l.next.flush() }
