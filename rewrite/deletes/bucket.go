package deletes

import (
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/cursor"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/read/point"
)

// Candidate is a bucket holding events a delete statement matched.
type Candidate struct {
	ID bson.ObjectID
	// Key is the bucket's (series, window); HasKey is false until the
	// bucket was read (the event match reports only the bucket _id).
	Key    bucket.Key
	HasKey bool
	all    bool           // every event matches (Whole statements)
	match  map[string]int // stored event bytes -> matched copies
	order  []string       // matched events, in upstream order (limit: 1)
}

// Candidates are the buckets a statement's match command reported, in
// the order it reported them.
type Candidates struct {
	whole bool
	// scan, when set, matches the events of the whole buckets the match
	// command lists (Statement.Scan); with limitOne it stops at the first.
	scan     *point.EventMatcher
	limitOne bool
	List     []*Candidate
	byID     map[bson.ObjectID]*Candidate
}

// Feed adds one reply of the match aggregate (or of its getMore) and
// returns the cursor id to continue with (0: done). An upstream error
// reply is returned as a *mongoerr.Error with the upstream's code.
func (c *Candidates) Feed(reply []byte) (int64, error) {
	docs, id, err := cursor.Docs(reply)
	if err != nil {
		return 0, err
	}
	if c.scan != nil {
		return id, c.scanBuckets(docs)
	}
	for _, d := range docs {
		v, ok := bsonutil.Lookup(d, bucket.FieldID)
		if !ok || v.Type != bsoncore.TypeObjectID {
			return 0, mongoerr.Errorf(mongoerr.InternalError, "bucket without an ObjectId _id in the match result")
		}
		bid := v.ObjectID()
		cand := c.byID[bid]
		if cand == nil {
			cand = &Candidate{ID: bid, all: c.whole, match: map[string]int{}}
			c.byID[bid] = cand
			c.List = append(c.List, cand)
		}
		if !cand.HasKey {
			meta, _ := bsonutil.Lookup(d, bucket.FieldMeta)
			if st, ok := bsonutil.Lookup(d, bucket.FieldStart); ok {
				if ms, ok := st.DateTimeOK(); ok {
					cand.Key, cand.HasKey = bucket.KeyOf(meta, ms), true
				}
			}
		}
		if c.whole {
			continue
		}
		ev, ok := bsonutil.Lookup(d, bucket.FieldEvents)
		if !ok || ev.Type != bsoncore.TypeEmbeddedDocument {
			return 0, mongoerr.Errorf(mongoerr.InternalError, "match result without an unwound event")
		}
		k := string(ev.Data)
		cand.match[k]++
		cand.order = append(cand.order, k)
	}
	return id, nil
}

// scanBuckets adds the matching events of whole buckets.
func (c *Candidates) scanBuckets(buckets []bsoncore.Document) error {
	for _, b := range buckets {
		if c.limitOne && len(c.List) > 0 {
			return nil
		}
		if err := c.addMatches(c.scan, b, c.limitOne); err != nil {
			return err
		}
	}
	return nil
}

// addMatches adds the events of bucket b that m matches (the first one
// only, with limitOne).
func (c *Candidates) addMatches(m *point.EventMatcher, b bsoncore.Document, limitOne bool) error {
	var addErr error
	err := m.Match(b, func(stored bsoncore.Document) bool {
		addErr = c.AddEvent(b, stored)
		return addErr != nil || limitOne
	})
	if err == nil {
		err = addErr
	}
	return err
}

// AddEvent adds an event of bucket b (as stored) that a statement
// matched, as Feed adds the match aggregate's: the delete path's index
// read finds them itself.
func (c *Candidates) AddEvent(b, stored bsoncore.Document) error {
	bid, ok := b.Lookup(bucket.FieldID).ObjectIDOK()
	if !ok {
		return mongoerr.Errorf(mongoerr.InternalError, "bucket without an ObjectId _id")
	}
	cand := c.byID[bid]
	if cand == nil {
		cand = &Candidate{ID: bid, all: c.whole, match: map[string]int{}}
		if err := cand.SetBucket(b); err != nil {
			return err
		}
		c.byID[bid] = cand
		c.List = append(c.List, cand)
	}
	k := string(stored)
	cand.match[k]++
	cand.order = append(cand.order, k)
	return nil
}

// NeedsEvents reports whether the edit of a candidate reads the bucket's
// events (not when it goes whole).
func (c *Candidate) NeedsEvents(limitOne bool) bool { return !c.all || limitOne }

// KeepFirst keeps only the first matched event (limit: 1).
func (c *Candidates) KeepFirst() {
	if len(c.List) == 0 {
		return
	}
	first := c.List[0]
	c.List = c.List[:1]
	if !first.all && len(first.order) > 0 {
		k := first.order[0]
		first.match = map[string]int{k: 1}
		first.order = first.order[:1]
	}
}

// SetBucket records the key of a candidate from its bucket document.
func (c *Candidate) SetBucket(bdoc bsoncore.Document) error {
	meta, start, err := bucket.KeyFields(bdoc)
	if err != nil {
		return err
	}
	c.Key, c.HasKey = bucket.KeyOf(meta, start), true
	return nil
}

// BucketEdit is what a delete statement does to one bucket.
type BucketEdit struct {
	ID  bson.ObjectID
	Key bucket.Key
	// Seq is the bucket's number in its key's family of ids.
	Seq int
	// Removed and Remaining count events.
	Removed, Remaining int
	// Replacement is the bucket of the remaining events without its _id
	// (an empty shell when none remain), for an update {_id: ID}.
	Replacement bsoncore.Document
	// OldCount is the bucket's count before the edit.
	OldCount int
}

// withoutID copies doc without its _id (a replacement keeps the
// bucket's own).
func withoutID(doc bsoncore.Document) bsoncore.Document {
	elems, _ := doc.Elements()
	idx, out := bsoncore.AppendDocumentStart(nil)
	for _, e := range elems {
		if e.Key() != bucket.FieldID {
			out = append(out, e...)
		}
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return out
}

// FoundBucket reads the reply of a FindBucketCommand.
func FoundBucket(reply []byte) ([]byte, bool, error) {
	docs, _, err := cursor.Docs(reply)
	if err != nil || len(docs) == 0 {
		return nil, false, err
	}
	return docs[0], true, nil
}

func upstreamWriteError(we bsoncore.Document) error {
	return mongoerr.FromReply(we, "upstream write error")
}

// StatementError is a failed statement of the app's delete.
type StatementError struct {
	Index int
	Err   error
}
