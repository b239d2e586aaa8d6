package updates

import (
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/deletes"
)

// firstInOrder reads the buckets of every match of a findAndModify with
// a sort and keeps the bucket of the first matched event in that order,
// which it remembers (u.pick) so that the edit takes that event only.
// Ties keep the first read, as MongoDB leaves their order undefined.
func (u *updater) firstInOrder(st *Statement, list []*deletes.Candidate) ([]*deletes.Candidate, error) {
	var best bsoncore.Document // the app's form, for comparing
	var bestStored bsoncore.Document
	var bestCand *deletes.Candidate
	for len(list) > 0 {
		k := min(len(list), updateChunk)
		chunk := list[:k]
		list = list[k:]
		ids := make([]bson.ObjectID, len(chunk))
		for i, c := range chunk {
			ids[i] = c.Bucket()
		}
		docs, err := u.req.find.ReadBuckets(u.x, ids, true)
		if err != nil {
			return nil, err
		}
		for i, bdoc := range docs {
			if bdoc == nil {
				continue
			}
			meta, _, err := bucket.KeyFields(bdoc)
			if err != nil {
				return nil, err
			}
			stored, err := bucket.EventDocs(bdoc)
			if err != nil {
				return nil, err
			}
			matched := chunk[i].Matched()
			for _, sd := range stored {
				if !matched.Take(sd) || u.skip[idKey(sd.Lookup("_id"))] {
					continue
				}
				doc, err := bucket.RestoreMeta(sd, u.rule().MetaField, func() (bsoncore.Value, error) { return meta, nil })
				if err != nil {
					return nil, err
				}
				if best == nil || sortsBefore(doc, best, st.sort) {
					best, bestStored, bestCand = doc, append(bsoncore.Document(nil), sd...), chunk[i]
				}
			}
		}
	}
	if bestCand == nil {
		return nil, nil
	}
	u.pick = bestStored
	return []*deletes.Candidate{bestCand}, nil
}

// sortsBefore says whether a comes before b in the order of spec ({f: 1
// or -1, ...}); a missing field sorts as null.
func sortsBefore(a, b, spec bsoncore.Document) bool {
	elems, _ := spec.Elements()
	for _, e := range elems {
		dir, _ := e.Value().AsFloat64OK()
		path := strings.Split(e.Key(), ".")
		av, aerr := a.LookupErr(path...)
		bv, berr := b.LookupErr(path...)
		if aerr != nil {
			av = bsoncore.Value{Type: bsoncore.TypeNull}
		}
		if berr != nil {
			bv = bsoncore.Value{Type: bsoncore.TypeNull}
		}
		if c := bsonutil.Compare(av, bv); c != 0 {
			return (c < 0) == (dir > 0)
		}
	}
	return false
}
