package deletes

import (
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/read"
)

// matchByIndex lists the candidates of a statement that names event _ids
// from the event-id index (see bucket.IDIndexEntry): the buckets whose
// entries may hold an id are read by _id and their events matched by the
// proxy. ok is false when the index cannot answer (no marker, or more
// buckets than read.MaxIDCandidates): the match aggregate then runs.
func (d *deleter) matchByIndex(st *Statement) (cands *Candidates, ok bool, err error) {
	rule := d.rule()
	coll := rule.IDIndexCollection()
	var ids []bson.ObjectID
	seen := map[bson.ObjectID]bool{}
	likely := 0 // ids[:likely]: buckets whose window holds an ObjectID's time
	complete := false
	take := func(docs []bsoncore.Document) error {
		for _, e := range docs {
			if bucket.IsIDIndexMarker(e) {
				complete = true
				continue
			}
			id, may, isEntry := st.IDs.MayHold(e)
			if !isEntry || !may || seen[id] {
				continue
			}
			seen[id] = true
			ids = append(ids, id)
			if st.IDs.Likely(e, rule.SpanMillis()) {
				ids[likely], ids[len(ids)-1] = ids[len(ids)-1], ids[likely]
				likely++
			}
		}
		return nil
	}
	res, done := d.x.Run(rewrite.DrainBatched(read.IDIndexFind(coll, rule.DB), rule.DB, coll, read.IDIndexBatch, take, func() rewrite.Result { return rewrite.Result{} }))
	if !done {
		return nil, false, rewrite.ErrAborted
	}
	if res.Reply != nil {
		return nil, false, fmt.Errorf("read the event-id index: %w", mongoerr.ReplyError(res.Reply))
	}
	if !complete || len(ids) > read.MaxIDCandidates {
		return nil, false, nil
	}
	cands = st.NewCandidates()
	// A deleteOne reads the buckets one at a time, likely ones first, and
	// stops at its event: on the stock upstreams each read scans.
	step := len(ids)
	if st.LimitOne {
		step = 1
	}
	for len(ids) > 0 && !(st.LimitOne && len(cands.List) > 0) {
		n := min(step, len(ids))
		if err := d.matchBuckets(st, cands, ids[:n]); err != nil {
			return nil, false, err
		}
		ids = ids[n:]
	}
	return cands, true, nil
}

// matchBuckets reads buckets ids and adds their events that match st.
func (d *deleter) matchBuckets(st *Statement, cands *Candidates, ids []bson.ObjectID) error {
	buckets, err := d.read(ids, true)
	if err != nil {
		return err
	}
	for _, b := range buckets {
		if b == nil {
			continue // a stale entry: its bucket is gone
		}
		var addErr error
		err := st.Events.Match(b, func(stored bsoncore.Document) bool {
			addErr = cands.AddEvent(b, stored)
			return addErr != nil || st.LimitOne
		})
		if err == nil {
			err = addErr
		}
		if err != nil {
			return mongoerr.Errorf(mongoerr.CodeOf(err), "tsproxy rule %s: finding the events to delete: %v", d.rule().Namespace, err)
		}
		if st.LimitOne && len(cands.List) > 0 {
			return nil
		}
	}
	return nil
}
