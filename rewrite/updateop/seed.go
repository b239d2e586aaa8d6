package updateop

import (
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// Upserted is the document an upsert inserts when its filter matched
// nothing: a replacement's fields (with the filter's _id where it names
// one), or the filter's equality fields with the operators applied
// ($setOnInsert among them), or the pipeline run on those fields.
func (u *Update) Upserted(filter bsoncore.Document, now time.Time) (bsoncore.Document, error) {
	seed, err := equalities(filter)
	if err != nil {
		return nil, err
	}
	var base bson.D
	if u.kind == Replacement {
		if id, ok := lookupD(seed, "_id"); ok {
			base = bson.D{{Key: "_id", Value: id}}
		}
		out := clone(u.replacement).(bson.D)
		if _, has := lookupD(out, "_id"); !has && base != nil {
			out = append(base, out...)
		}
		b, err := bson.Marshal(out)
		return b, err
	}
	b, err := bson.Marshal(seed)
	if err != nil {
		return nil, err
	}
	out, _, err := u.Apply(b, Options{Insert: true, Now: now})
	return out, err
}

// equalities are the fields a filter fixes by equality ({f: v}, {f:
// {$eq: v}}, inside $and), as the document an upsert starts from.
func equalities(filter bsoncore.Document) (bson.D, error) {
	var f bson.D
	if err := bson.Unmarshal(filter, &f); err != nil {
		return nil, mongoerr.Errorf(mongoerr.InvalidBSON, "upsert filter: %v", err)
	}
	var root any = bson.D{}
	var add func(f bson.D) error
	add = func(f bson.D) error {
		for _, e := range f {
			if e.Key == "$and" {
				arr, _ := e.Value.(bson.A)
				for _, c := range arr {
					if d, ok := c.(bson.D); ok {
						if err := add(d); err != nil {
							return err
						}
					}
				}
				continue
			}
			if strings.HasPrefix(e.Key, "$") {
				continue
			}
			v, ok := equalityValue(e.Value)
			if !ok {
				continue
			}
			path, err := splitPath(e.Key)
			if err != nil {
				return err
			}
			if root, err = walk(root, path, setTo(clone(v)), true, e.Key, nil); err != nil {
				return err
			}
		}
		return nil
	}
	if err := add(f); err != nil {
		return nil, err
	}
	return root.(bson.D), nil
}

// equalityValue is the value a filter's condition fixes: a plain value,
// or {$eq: v}; a document of operators otherwise fixes nothing.
func equalityValue(v any) (any, bool) {
	d, ok := v.(bson.D)
	if !ok {
		_, isRegex := v.(bson.Regex)
		return v, !isRegex
	}
	if len(d) == 0 || !strings.HasPrefix(d[0].Key, "$") {
		return v, true
	}
	if len(d) == 1 && d[0].Key == "$eq" {
		return d[0].Value, true
	}
	return nil, false
}
