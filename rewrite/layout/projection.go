package layout

import (
	"strings"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// layoutProjection is an inclusion or exclusion of top-level fields.
type layoutProjection struct {
	include bool
	fields  map[string]bool
	noID    bool
}

func (r *Read) parseProjection(d bsoncore.Document) (*layoutProjection, error) {
	es, err := d.Elements()
	if err != nil {
		return nil, mongoerr.Errorf(mongoerr.BadValue, "projection is not valid BSON")
	}
	p := &layoutProjection{fields: map[string]bool{}}
	mode := 0 // 1 include, -1 exclude
	idOn := false
	for _, e := range es {
		v := e.Value()
		var on bool
		switch {
		case v.Type == bsoncore.TypeBoolean:
			on = v.Boolean()
		case v.IsNumber():
			f, _ := v.AsFloat64OK()
			on = f != 0
		default:
			return nil, r.unsupported("projection of %q: only 0/1 (true/false) are supported", e.Key())
		}
		if strings.Contains(e.Key(), ".") || strings.HasPrefix(e.Key(), "$") {
			return nil, r.unsupported("projection of %q: only top-level fields are supported", e.Key())
		}
		if e.Key() == "_id" {
			p.noID = !on
			idOn = on
			continue
		}
		m := -1
		if on {
			m = 1
		}
		if mode != 0 && mode != m {
			return nil, mongoerr.Errorf(mongoerr.BadValue, "projection cannot mix inclusion and exclusion (field %q)", e.Key())
		}
		mode = m
		p.fields[e.Key()] = true
	}
	// {_id: 1} alone includes _id alone, as in MongoDB.
	p.include = mode == 1 || mode == 0 && idOn
	return p, nil
}

func (p *layoutProjection) apply(doc bsoncore.Document) bsoncore.Document {
	es, _ := doc.Elements()
	di, out := bsoncore.AppendDocumentStart(nil)
	for _, e := range es {
		k := e.Key()
		keep := !p.fields[k]
		if p.include {
			keep = p.fields[k]
		}
		if k == "_id" {
			keep = !p.noID
		}
		if keep {
			out = append(out, e...)
		}
	}
	out, _ = bsoncore.AppendDocumentEnd(out, di)
	return out
}
