package join

import (
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/agg"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// unionWithStage is $unionWith: the input, then the documents of coll
// (through its pipeline, when it has one).
type unionWithStage struct {
	rt       *runtime
	coll     string
	pipeline []agg.Stage
	next     step
}

func compileUnionWith(v bsoncore.Value, next step, rt *runtime) (step, error) {
	u := &unionWithStage{rt: rt, next: next}
	if s, ok := v.StringValueOK(); ok {
		u.coll = s
		return u, nil
	}
	d, ok := v.DocumentOK()
	if !ok {
		return nil, mongoerr.Errorf(mongoerr.FailedToParse, "the $unionWith stage specification must be an object or string, but found %s", v.Type)
	}
	elems, _ := d.Elements()
	for _, e := range elems {
		switch e.Key() {
		case "coll":
			s, ok := e.Value().StringValueOK()
			if !ok {
				if _, isDoc := e.Value().DocumentOK(); isDoc {
					return nil, unsupported("$unionWith 'coll' naming another database")
				}
				return nil, mongoerr.Errorf(mongoerr.TypeMismatch, "BSON field '$unionWith.coll' is the wrong type '%s', expected type 'string'", e.Value().Type)
			}
			u.coll = s
		case "pipeline":
			stages, err := stagesOf("$unionWith", e.Value())
			if err != nil {
				return nil, err
			}
			if _, err := compile(stages, rt); err != nil {
				return nil, err
			}
			u.pipeline = stages
		default:
			return nil, mongoerr.Errorf(mongoerr.Code(40415), "BSON field '$unionWith.%s' is an unknown field.", e.Key())
		}
	}
	if u.coll == "" {
		return nil, unsupported("$unionWith without 'coll' (a $documents pipeline)")
	}
	return u, nil
}

func (u *unionWithStage) push(doc bsoncore.Document) error { return u.next.push(doc) }

func (u *unionWithStage) flush() error {
	p, err := compile(u.pipeline, u.rt)
	if err != nil {
		return err
	}
	err = u.rt.read(u.coll, prefilter(u.pipeline), p.Push)
	if err != nil {
		return err
	}
	docs, err := p.Finish()
	if err != nil {
		return err
	}
	for _, d := range docs {
		if err := u.next.push(d); err != nil {
			return err
		}
	}
	return u.next.flush()
}
