package deletes

import (
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/cursor"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/read/point"
	"github.com/tsproxy/tsproxy/rewrite/source"
)

// matchByIndex lists the candidates of a statement that names event _ids
// from the event-id index (see bucket.IDIndexEntry): the buckets whose
// entries may hold an id are read by _id and their events matched by the
// proxy. ok is false when the index cannot answer (no marker, or more
// buckets than point.MaxIDCandidates): the match aggregate then runs.
func (d *deleter) matchByIndex(st *Statement) (cands *Candidates, ok bool, err error) {
	scan, err := d.readIDIndex(st.IDs)
	if err != nil || !scan.Complete() || len(scan.Candidates()) > point.MaxIDCandidates {
		return nil, false, err
	}
	ids := scan.Candidates()
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

// readIDIndex reads the rule's event-id index for set's ids: from the
// proxy's cache while the marker shows the version kept, else whole (and
// kept for the next reads).
func (d *deleter) readIDIndex(set *bucket.IDSet) (*bucket.IDIndexScan, error) {
	rule, cache := d.rule(), d.env.IDIndex
	coll := rule.IDIndexCollection()
	key := rule.DB + "." + coll
	if scan, err := d.lookupIDTimes(set); scan != nil || err != nil {
		return scan, err
	}
	scan := bucket.NewIDIndexScan(set, rule.SpanMillis(), cache != nil)
	if cache != nil {
		if kept := cache.Get(key); kept != nil {
			reply, ok := d.x.One(bucket.IDIndexMarkerFind(coll, rule.DB))
			if !ok {
				return nil, rewrite.ErrAborted
			}
			docs, _, err := cursor.Docs(reply)
			if err != nil {
				return nil, fmt.Errorf("read the event-id index: %w", err)
			}
			if scan.CheckKept(docs, kept) {
				if !scan.Complete() {
					cache.Put(key, nil)
				}
				return scan, nil
			}
		}
	}
	take := func(docs []bsoncore.Document) error {
		for _, e := range docs {
			scan.Take(e)
		}
		return nil
	}
	res, ok := d.x.Run(rewrite.DrainBatched(point.IDIndexFind(coll, rule.DB), rule.DB, coll, point.IDIndexBatch, take, func() rewrite.Result { return rewrite.Result{} }))
	if !ok {
		return nil, rewrite.ErrAborted
	}
	if res.Reply != nil {
		return nil, fmt.Errorf("read the event-id index: %w", mongoerr.ReplyError(res.Reply))
	}
	if kept := scan.Kept(); kept != nil {
		cache.Put(key, kept)
	}
	return scan, nil
}

// lookupIDTimes finds the buckets of ObjectID ids by the index's
// id-time documents, or returns nil when they cannot answer.
func (d *deleter) lookupIDTimes(set *bucket.IDSet) (*bucket.IDIndexScan, error) {
	l := bucket.NewIDTimeLookup(set)
	if l == nil {
		return nil, nil
	}
	rule := d.rule()
	for finds := l.Finds(rule.IDIndexCollection(), rule.DB); len(finds) > 0; finds = l.Finds(rule.IDIndexCollection(), rule.DB) {
		found, err := source.Lookups(d.x, finds, "read the event-id index")
		if err != nil {
			return nil, err
		}
		l.Take(found)
	}
	return l.Scan(), nil
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
		if err := cands.addMatches(st.Events, b, st.LimitOne); err != nil {
			return mongoerr.Errorf(mongoerr.CodeOf(err), "tsproxy rule %s: finding the events to delete: %v", d.rule().Namespace, err)
		}
		if st.LimitOne && len(cands.List) > 0 {
			return nil
		}
	}
	return nil
}
