package merge

import (
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/rollup"
	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rewrite/stage/idindex"
)

// The merge's writes: inserts (over several connections when large:
// nextInserts), their outcomes, and what follows them (rollups, the
// event-id index).

// deleteMany deletes every document of coll that q matches.
func (m *Merge) deleteMany(x *rewrite.Exec, coll string, q bsoncore.Document) error {
	return stage.DeleteMany(x, m.rule.DB, coll, q)
}

// insertOne inserts doc into coll; a duplicate key (an earlier run of
// the same merge wrote it) is no failure.
func (m *Merge) insertOne(x *rewrite.Exec, coll string, doc bsoncore.Document) error {
	return stage.InsertOne(x, m.rule.DB, coll, doc)
}

// maxInsertBytes bounds the documents of one merged insert, under the
// 48MB message limit with room to spare.
const maxInsertBytes = 8 << 20

// insertBatchLen is how many of n documents (size gives each one's bytes)
// the next insert of a merge takes: at least one, at most 1,000 and
// maxInsertBytes.
func insertBatchLen(n int, size func(i int) int) int {
	k, total := 0, 0
	for k < n && k < maxInsertDocs && (k == 0 || total+size(k) <= maxInsertBytes) {
		total += size(k)
		k++
	}
	return k
}

// insertBuckets inserts the merged buckets. A duplicate key is a bucket
// an earlier run of this merge wrote: accepted when it holds the same
// events (count and first event), an error otherwise (a bucket written
// outside the merge). Large inserts go as several Parallel commands
// (nextInserts); each one's outcome is taken after the step, so a
// failure of one still counts the others' events into the rollups.
func (m *Merge) insertBuckets(x *rewrite.Exec, buckets []builtBucket) error {
	docs := make([]bsoncore.Document, len(buckets))
	for i, b := range buckets {
		docs[i] = b.doc
	}
	return m.insertAll(x, docs, func(from, n int, reply []byte) error {
		return m.insertedBuckets(x, buckets[from:from+n], reply)
	})
}

// insertAll inserts docs into the bucket collection, a step at a time
// (nextInsertStep), and gives each insert's reply to outcome with the
// index of its first document and how many it took. Every insert of a
// step is given to outcome before the first failure is returned, so
// that what the others stored is accounted for.
func (m *Merge) insertAll(x *rewrite.Exec, docs []bsoncore.Document, outcome func(from, n int, reply []byte) error) error {
	for from := 0; from < len(docs); {
		step := nextInsertStep(m.rule.DB, m.rule.BucketCollection, docs[from:], m.opts.InsertStreams)
		replies, ok := x.Do(step)
		if !ok {
			return rewrite.ErrAborted
		}
		if len(step) > 1 {
			m.Stats.ParallelInserts += len(step)
		}
		var failed error
		for i, u := range step {
			n := len(u.Seq.Documents)
			if err := outcome(from, n, replies[i]); err != nil && failed == nil {
				failed = err
			}
			from += n
		}
		if failed != nil {
			return failed
		}
	}
	return nil
}

// insertedBuckets checks the outcome of the insert of batch (reply) and
// counts what it inserted into the rollups.
func (m *Merge) insertedBuckets(x *rewrite.Exec, batch []builtBucket, reply []byte) error {
	dups, err := stage.WriteOutcome(reply)
	if err != nil {
		return fmt.Errorf("insert buckets: %w", err)
	}
	if err := m.verifyExisting(x, batch, dups); err != nil {
		return err
	}
	return m.countRollups(x, batch, dups)
}

// parallelInsertBytes is the size of buckets from which a merge spreads
// their insert over MergeOptions.InsertStreams commands: below it, the
// second connection costs about what it saves.
const parallelInsertBytes = 1 << 20

// maxInsertDocs bounds the documents of one merged insert.
const maxInsertDocs = 1000

// nextInserts cuts the next step's inserts from n documents (size gives
// each one's bytes) and returns how many each insert takes: one insert
// of what fits one (insertBatchLen), or, when streams > 1 and what fits
// streams inserts holds parallelInsertBytes or more, up to streams
// inserts of about the same bytes each.
func nextInserts(n int, size func(i int) int, streams int) []int {
	one := []int{insertBatchLen(n, size)}
	if streams < 2 {
		return one
	}
	k, total := 0, 0
	for k < n && k < streams*maxInsertDocs && total+size(k) <= streams*maxInsertBytes {
		total += size(k)
		k++
	}
	if k < 2 || total < parallelInsertBytes {
		return one
	}
	// An insert ends where the bytes so far reach its share.
	lens := make([]int, 0, streams)
	from, sum, bytes := 0, 0, 0
	for i := range k {
		sum += size(i)
		bytes += size(i)
		if sum*streams >= (len(lens)+1)*total || i == k-1 {
			if i+1-from > maxInsertDocs || bytes > maxInsertBytes {
				return one // sizes too uneven to share: one at a time
			}
			lens = append(lens, i+1-from)
			from, bytes = i+1, 0
		}
	}
	return lens
}

// nextInsertStep is the step of inserts into db.coll of the next documents
// of docs (nextInserts).
func nextInsertStep(db, coll string, docs []bsoncore.Document, streams int) rewrite.Step {
	lens := nextInserts(len(docs), func(i int) int { return len(docs[i]) }, streams)
	step := make(rewrite.Step, len(lens))
	from := 0
	for i, n := range lens {
		step[i] = stage.InsertStep(db, coll, docs[from:from+n])
		step[i].Parallel = len(lens) > 1
		from += n
	}
	return step
}

// countRollups counts the events of the buckets of batch this merge
// inserted (not those found there already: a repeated merge's) into the
// rule's rollups, right after their insert. A rollup write is never
// repeated, so an event is counted at most once: a merge cut between the
// two writes, or a failed rollup write (recorded in Stats.RollupErrors),
// leaves it uncounted, and the next run of the merge meets its bucket as
// a duplicate. The merge runs under the rule's writer lease, so one proxy
// at a time updates the rollup documents, which is what FerretDB, whose
// updates are not isolated, needs.
func (m *Merge) countRollups(x *rewrite.Exec, batch []builtBucket, dups []int) error {
	if len(m.rule.Rollups) == 0 {
		return nil
	}
	existing := map[int]bool{}
	for _, i := range dups {
		existing[i] = true
	}
	var evs []bucket.Event
	for i, b := range batch {
		if !existing[i] {
			evs = append(evs, b.evs...)
		}
	}
	w, err := rollup.OfMerged(m.rule, evs, rollup.Options{MaxStatements: m.opts.RollupStatements})
	if err != nil || w == nil {
		return err
	}
	for _, cmd := range w.Commands {
		reply, ok := x.Do(rewrite.Step{{Body: cmd, Update: true}})
		if !ok {
			return rewrite.ErrAborted
		}
		if err := rollup.ReplyError(cmd, reply[0]); err != nil && len(m.Stats.RollupErrors) < maxRollupErrors {
			m.Stats.RollupErrors = append(m.Stats.RollupErrors, err.Error())
		}
	}
	m.Stats.Counted += w.Events
	return nil
}

// maxRollupErrors bounds the rollup failures one merge reports.
const maxRollupErrors = 8

// verifyExisting checks that the buckets that met a duplicate key hold
// what this merge would have written.
func (m *Merge) verifyExisting(x *rewrite.Exec, batch []builtBucket, dups []int) error {
	if len(dups) == 0 {
		return nil
	}
	want := map[bson.ObjectID]builtBucket{}
	ids := make([]bson.ObjectID, 0, len(dups))
	for _, i := range dups {
		want[batch[i].id] = batch[i]
		ids = append(ids, batch[i].id)
	}
	found, err := drainAll(x, m.rule.DB, m.rule.BucketCollection, stage.FindBatched(m.rule.DB, m.rule.BucketCollection, stage.IdsIn(ids), m.readBatch()), m.readBatch())
	if err != nil {
		return err
	}
	for _, d := range found {
		id, _ := stage.IdOf(d)
		b := want[id]
		var firstID bsoncore.Value
		if evs, _ := bucket.EventValues(d); len(evs) > 0 {
			if fd, ok := evs[0].DocumentOK(); ok {
				firstID = fd.Lookup("_id")
			}
		}
		if bucketCount(d) != b.count || !firstID.Equal(b.first) {
			return mongoerr.Errorf(mongoerr.InternalError, "bucket %s exists with other events than the merge's (was it written outside the staging tier?)", id.Hex())
		}
		delete(want, id)
	}
	if len(want) > 0 {
		return mongoerr.Errorf(mongoerr.InternalError, "%d buckets met a duplicate key but are not there", len(want))
	}
	return nil
}

func bucketCount(d bsoncore.Document) int {
	v, ok := bsonutil.Lookup(d, "count")
	if !ok {
		return -1
	}
	n, _ := v.AsInt64OK()
	return int(n)
}

// statementsPer is how many statements one update or delete command
// of the merge holds: FerretDB keeps each statement's query open until
// its command ends, one pool connection each (see rewriteTopUps).
func (m *Merge) statementsPer() int {
	if m.opts.RollupStatements > 0 {
		return m.opts.RollupStatements
	}
	return 1000
}

// statements sends stmts as unordered commands cmd ("update" or
// "delete") on coll of the rule's database, statementsPer a command,
// and returns the first failure (the reply's error, a write error).
func (m *Merge) statements(x *rewrite.Exec, cmd, coll string, stmts []bsoncore.Document) error {
	_, err := stage.Statements(x, m.rule.DB, cmd, coll, m.statementsPer(), stmts)
	return err
}

// idIndexBuckets are buckets as the event-id index's writer takes them.
func idIndexBuckets(buckets []builtBucket) []idindex.Bucket {
	out := make([]idindex.Bucket, len(buckets))
	for i, b := range buckets {
		out[i] = idindex.Bucket{ID: b.id, Start: b.start, Entry: b.entry, All: b.all, Added: b.evs}
	}
	return out
}
