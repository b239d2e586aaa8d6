package agg

import (
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/agg/projection"
	"github.com/tsproxy/tsproxy/rewrite/expr/value"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

type projectStage struct {
	spec      *projection.SpecNode
	inclusion bool
	next      processor
}

func compileProject(v value.Value, next processor, _ Options) (processor, error) {
	d, ok := v.DocumentOK()
	if !ok {
		return nil, value.BadValue(15969, "$project specification must be an object")
	}
	spec, err := projection.ParseSpec("$project", d, false, 0)
	if err != nil {
		return nil, err
	}
	inc, exc := spec.Mode(true)
	if inc && exc {
		return nil, value.BadValue(mongoerr.ProjectionMixed, "Invalid $project :: caused by :: Cannot do exclusion on a field in inclusion projection")
	}
	if !inc && !exc {
		// Only _id: an exclusion when it is 0, else an inclusion of _id.
		inc = spec.Include["_id"]
	}
	return &projectStage{spec: spec, inclusion: inc, next: next}, nil
}

func (p *projectStage) push(doc bsoncore.Document) error {
	var out bsoncore.Document
	var err error
	if p.inclusion {
		out, err = projection.Include(doc, doc, p.spec, true)
	} else {
		out = projection.Exclude(doc, p.spec)
	}
	if err != nil {
		return err
	}
	return p.next.push(out)
}

func (p *projectStage) flush() error { return p.next.flush() }

// $addFields and $set: every expression sees the input document; a
// field that exists is replaced where it is, a new one appended; a
// missing value removes the field.
type addFieldsStage struct {
	spec *projection.SpecNode
	next processor
}

func compileAddFields(v value.Value, next processor, _ Options) (processor, error) {
	d, ok := v.DocumentOK()
	if !ok {
		return nil, value.BadValue(40272, "$addFields specification stage must be an object")
	}
	spec, err := projection.ParseSpec("$addFields", d, true, 0)
	if err != nil {
		return nil, err
	}
	return &addFieldsStage{spec: spec, next: next}, nil
}

func (a *addFieldsStage) push(doc bsoncore.Document) error {
	out, err := projection.AddFields(doc, doc, a.spec)
	if err != nil {
		return err
	}
	return a.next.push(out)
}

func (a *addFieldsStage) flush() error { return a.next.flush() }

// $unset: an exclusion of the named fields.
func compileUnset(v value.Value, next processor, _ Options) (processor, error) {
	var names []string
	switch v.Type {
	case bsoncore.TypeString:
		names = []string{v.StringValue()}
	case bsoncore.TypeArray:
		vals, _ := v.Array().Values()
		for _, el := range vals {
			s, ok := el.StringValueOK()
			if !ok {
				return nil, value.BadValue(31120, "$unset specification must be a string or an array containing only string values")
			}
			names = append(names, s)
		}
	default:
		return nil, value.BadValue(31002, "$unset specification must be a string or an array")
	}
	if len(names) == 0 {
		return nil, value.BadValue(31119, "$unset specification must be a string or an array with at least one field")
	}
	b := bsoncore.NewDocumentBuilder()
	for _, n := range names {
		b.AppendInt32(n, 0)
	}
	spec, err := projection.ParseSpec("$unset", b.Build(), false, 0)
	if err != nil {
		return nil, err
	}
	return &projectStage{spec: spec, inclusion: false, next: next}, nil
}
