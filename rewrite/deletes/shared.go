package deletes

import (
	"strconv"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
)

// An update on a bucketed namespace finds and rewrites its events as a
// delete does (rewrite/updates): these are the delete plan's steps it
// runs, on a Request made of the update's filters.

// Matches runs st's match to its end on x (to its first match for
// limit 1): the buckets holding the events st selects.
func (p *Request) Matches(x *rewrite.Exec, st *Statement, env Env) (*Candidates, error) {
	d := &deleter{x: x, plan: p, env: env}
	return d.match(st)
}

// ReadBuckets reads buckets by _id on x, with their events or not; a
// bucket removed since is nil.
func (p *Request) ReadBuckets(x *rewrite.Exec, ids []bson.ObjectID, events bool) ([][]byte, error) {
	d := &deleter{x: x, plan: p}
	return d.read(ids, events)
}

// CountBucket reads how many events bucket id holds on x; found is false
// when there is no such bucket.
func (p *Request) CountBucket(x *rewrite.Exec, id bson.ObjectID) (n int, found bool, err error) {
	d := &deleter{x: x, plan: p}
	return d.count(id)
}

// Write runs a rewritten write of the bucket collection on x (in a write
// slot where the upstream bounds them) and returns how many of its
// statements took effect before the first that failed.
func (p *Request) Write(x *rewrite.Exec, env Env, cmd []byte, statements int) (int, error) {
	d := &deleter{x: x, plan: p, env: env}
	return d.run(cmd, statements)
}

// WriteConcernError is the last upstream write concern error of the
// request's writes (Type 0 when none).
func (p *Request) WriteConcernError() bsoncore.Value { return p.wce }

// Limits are the bucket limits of the request's rule, as its upstream
// stores events.
func (p *Request) Limits() bucket.Limits { return p.lim }

// StoredToEvent reads a stored event of the bucket (meta, start) back as
// an event to build a bucket from.
func (p *Request) StoredToEvent(d bsoncore.Document, meta bsoncore.Value, start int64) bucket.Event {
	return p.storedToEvent(d, meta, start)
}

// Matched are a candidate's matched events, each taken once.
type Matched struct {
	all  bool
	left map[string]int
}

// Matched are the events of the candidate its statement matched.
func (c *Candidate) Matched() *Matched {
	m := &Matched{all: c.all, left: make(map[string]int, len(c.match))}
	for k, n := range c.match {
		m.left[k] = n
	}
	return m
}

// Take says whether the stored event is one of the matched (using up
// one match of it: two equal events matched once are taken once).
func (m *Matched) Take(stored []byte) bool {
	if m.all {
		return true
	}
	k := string(stored)
	if m.left[k] == 0 {
		return false
	}
	m.left[k]--
	return true
}

// Bucket is the candidate's bucket _id.
func (c *Candidate) Bucket() bson.ObjectID { return c.ID }

// WithoutID copies a bucket document without its _id, for an update
// {_id: ...} that replaces it.
func WithoutID(doc bsoncore.Document) bsoncore.Document { return withoutID(doc) }

// InsertCommand is an ordered insert of whole buckets into the bucket
// collection, carrying the request's generic write arguments.
func (p *Request) InsertCommand(docs []bsoncore.Document) []byte {
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendStringElement(d, "insert", p.rule.BucketCollection)
	aidx, a := bsoncore.AppendArrayElementStart(d, "documents")
	for i, doc := range docs {
		a = bsoncore.AppendDocumentElement(a, strconv.Itoa(i), doc)
	}
	d, _ = bsoncore.AppendArrayEnd(a, aidx)
	d = bsoncore.AppendBooleanElement(d, "ordered", true)
	d = bsonutil.AppendElems(d, p.args)
	d = bsoncore.AppendStringElement(d, "$db", p.rule.DB)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}
