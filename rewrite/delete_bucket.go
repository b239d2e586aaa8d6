package rewrite

import (
	"github.com/tsproxy/tsproxy/rewrite/cursor"
	"strconv"

	"github.com/tsproxy/tsproxy/rewrite/bucket"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
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
	List  []*Candidate
	byID  map[bson.ObjectID]*Candidate
}

// NewCandidates collects the match results of st.
func (st *DeleteStatement) NewCandidates() *Candidates {
	return &Candidates{whole: st.Whole, byID: map[bson.ObjectID]*Candidate{}}
}

// Feed adds one reply of the match aggregate (or of its getMore) and
// returns the cursor id to continue with (0: done). An upstream error
// reply is returned as a *mongoerr.Error with the upstream's code.
func (c *Candidates) Feed(reply []byte) (int64, error) {
	docs, id, err := cursor.Docs(reply)
	if err != nil {
		return 0, err
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

// Edit computes the bucket that remains of bucket once the candidate's
// matched events are removed; limitOne removes at most one.
func (p *DeletePlan) Edit(c *Candidate, bdoc bsoncore.Document, limitOne bool) (BucketEdit, error) {
	if err := bsonutil.Validate(bdoc, 1); err != nil {
		return BucketEdit{}, mongoerr.Errorf(mongoerr.InternalError, "bucket %s is not valid BSON: %v", c.ID.Hex(), err)
	}
	meta, start, err := bucket.KeyFields(bdoc)
	if err != nil {
		return BucketEdit{}, err
	}
	key := bucket.KeyOf(meta, start)
	seq, ok := bucket.SeqOf(p.rule.BucketNamespace(), key, c.ID)
	if !ok {
		return BucketEdit{}, ruleErrorf(p.rule, mongoerr.NotImplemented, "bucket %s is not one the proxy wrote (its _id is not of its series and window); delete it directly", c.ID.Hex())
	}
	if c.all && !limitOne {
		// Every event goes: the bucket may have been read without them.
		n := bucket.CountOf(bdoc)
		return BucketEdit{ID: c.ID, Key: key, Seq: seq, Removed: n, OldCount: n, Replacement: bucket.Shell(meta, start)}, nil
	}
	stored, err := bucket.EventDocs(bdoc)
	if err != nil {
		return BucketEdit{}, ruleErrorf(p.rule, mongoerr.InternalError, "bucket %s: %v", c.ID.Hex(), err)
	}
	left := make(map[string]int, len(c.match))
	for k, n := range c.match {
		left[k] = n
	}
	var keep []bucket.Event
	removed := 0
	for _, d := range stored {
		if limitOne && removed == 1 {
			keep = append(keep, p.storedToEvent(d, meta, start))
			continue
		}
		if c.all {
			removed++
			continue
		}
		if k := string(d); left[k] > 0 {
			left[k]--
			removed++
			continue
		}
		keep = append(keep, p.storedToEvent(d, meta, start))
	}
	e := BucketEdit{ID: c.ID, Key: key, Seq: seq, Removed: removed, Remaining: len(keep), OldCount: len(stored)}
	if len(keep) == 0 {
		e.Replacement = bucket.Shell(meta, start)
	} else {
		e.Replacement = withoutID(bucket.Complete(c.ID, keep, p.rule, p.lim))
	}
	return e, nil
}

// storedToEvent reads back what summarize needs of a stored event. The
// insert path validated it: a missing time reads as 0 and a non-number
// aggregate is skipped, neither of which a stored event has.
func (p *DeletePlan) storedToEvent(d bsoncore.Document, meta bsoncore.Value, start int64) bucket.Event {
	ev := bucket.Event{Meta: meta, Start: start, Stored: d}
	if t, ok := bsonutil.Lookup(d, p.rule.TimeField); ok {
		ev.Time, _ = t.DateTimeOK()
	}
	for _, name := range p.lim.Aggregates {
		v, ok := bsonutil.Lookup(d, name)
		if !ok || !bucket.IsAggregatable(v.Type) {
			v = bsoncore.Value{}
		}
		ev.Aggs = append(ev.Aggs, v)
	}
	return ev
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

// ReplaceCommand is an update replacing each edited bucket by _id.
func (p *DeletePlan) ReplaceCommand(edits []BucketEdit) []byte {
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendStringElement(d, "update", p.rule.BucketCollection)
	aidx, a := bsoncore.AppendArrayElementStart(d, "updates")
	for i, e := range edits {
		sidx, s := bsoncore.AppendDocumentElementStart(a, strconv.Itoa(i))
		qidx, q := bsoncore.AppendDocumentElementStart(s, "q")
		q = bsoncore.AppendObjectIDElement(q, bucket.FieldID, e.ID)
		s, _ = bsoncore.AppendDocumentEnd(q, qidx)
		s = bsoncore.AppendDocumentElement(s, "u", e.Replacement)
		a, _ = bsoncore.AppendDocumentEnd(s, sidx)
	}
	d, _ = bsoncore.AppendArrayEnd(a, aidx)
	d = bsoncore.AppendBooleanElement(d, "ordered", true)
	d = bsonutil.AppendElems(d, p.args)
	d = bsoncore.AppendStringElement(d, "$db", p.rule.DB)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

// RemoveCommand deletes buckets by _id, in the order given (the proxy
// gives the highest seq first, so a failure part way leaves no gap).
func (p *DeletePlan) RemoveCommand(ids []bson.ObjectID) []byte {
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendStringElement(d, "delete", p.rule.BucketCollection)
	aidx, a := bsoncore.AppendArrayElementStart(d, "deletes")
	for i, id := range ids {
		sidx, s := bsoncore.AppendDocumentElementStart(a, strconv.Itoa(i))
		qidx, q := bsoncore.AppendDocumentElementStart(s, "q")
		q = bsoncore.AppendObjectIDElement(q, bucket.FieldID, id)
		s, _ = bsoncore.AppendDocumentEnd(q, qidx)
		s = bsoncore.AppendInt32Element(s, "limit", 1)
		a, _ = bsoncore.AppendDocumentEnd(s, sidx)
	}
	d, _ = bsoncore.AppendArrayEnd(a, aidx)
	d = bsoncore.AppendBooleanElement(d, "ordered", true)
	d = bsonutil.AppendElems(d, p.args)
	d = bsoncore.AppendStringElement(d, "$db", p.rule.DB)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

// WriteOutcome reads the reply of a ReplaceCommand or RemoveCommand: how
// many statements took effect before the first failure (all of them when
// err is nil). A write concern error is kept for the app's reply.
func (p *DeletePlan) WriteOutcome(reply []byte, statements int) (done int, err error) {
	doc := bsoncore.Document(reply)
	if err := mongoerr.ReplyError(doc); err != nil {
		return 0, err
	}
	if wce, ok := bsonutil.Lookup(doc, "writeConcernError"); ok {
		p.wce = wce
	}
	v, ok := bsonutil.Lookup(doc, "writeErrors")
	if !ok {
		return statements, nil
	}
	arr, ok := v.ArrayOK()
	if !ok {
		return 0, mongoerr.Errorf(mongoerr.InternalError, "upstream writeErrors is a %s", bsonutil.TypeName(v.Type))
	}
	vals, _ := arr.Values()
	if len(vals) == 0 {
		return statements, nil
	}
	first, _ := vals[0].DocumentOK()
	idx, _ := bsonutil.Lookup(first, "index")
	i, _ := idx.AsInt64OK()
	return int(i), upstreamWriteError(first)
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

// Reply is the app's delete reply: {n, writeErrors?, writeConcernError?,
// ok: 1}. A statement error's code is its *mongoerr.Error's.
func (p *DeletePlan) Reply(n int, errs []StatementError) []byte {
	var werrs []bucket.WriteError
	for _, e := range errs {
		code := mongoerr.InternalError
		if ce, ok := e.Err.(*mongoerr.Error); ok {
			code = ce.Code
		}
		werrs = append(werrs, bucket.WriteError{Index: e.Index, Code: code, Msg: e.Err.Error()})
	}
	return writeReply(n, werrs, p.wce, bsoncore.Value{})
}
