package stage

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/rollup"
)

// planDoc is a merge plan as stored in its retired collection:
// {_id: "plan", bases: [{k: <key>, s: <seq>}...], skip: [<id>...],
// ids: [<staged _id as type byte and bytes>...]}.
func planDoc(p *mergePlan) bsoncore.Document {
	bases := bsoncore.NewArrayBuilder()
	for k, s := range p.bases {
		bases.AppendDocument(bsoncore.NewDocumentBuilder().AppendBinary("k", 0, []byte(k)).AppendInt32("s", int32(s)).Build())
	}
	skip := bsoncore.NewArrayBuilder()
	for id := range p.skip {
		skip.AppendObjectID(id)
	}
	ids := bsoncore.NewArrayBuilder()
	for k := range p.ids {
		ids.AppendBinary(0, []byte(k))
	}
	// A plan with top-ups keeps its bases under another name: a proxy
	// older than topping up, which would write the topped-up events again,
	// finds no bases and stops instead.
	basesField := "bases"
	if len(p.tops) > 0 {
		basesField = "topUpBases"
	}
	b := bsoncore.NewDocumentBuilder().AppendString("_id", planID).
		AppendArray(basesField, bases.Build()).AppendArray("skip", skip.Build()).AppendArray("ids", ids.Build())
	if len(p.tops) > 0 {
		b.AppendArray("tops", topUpsDoc(p.tops))
	}
	if p.mark != "" {
		b.AppendString("mark", p.mark)
	}
	return b.Build()
}

// readPlan reads planDoc's output back.
func readPlan(d bsoncore.Document) (*mergePlan, error) {
	p := &mergePlan{bases: map[string]int{}, skip: map[bson.ObjectID]bool{}, ids: map[string]bool{}}
	bad := func(what string) (*mergePlan, error) { return nil, fmt.Errorf("plan document: %s", what) }
	bases, ok := d.Lookup("bases").ArrayOK()
	if !ok {
		if bases, ok = d.Lookup("topUpBases").ArrayOK(); !ok {
			return bad("no bases")
		}
	}
	vals, err := bases.Values()
	if err != nil {
		return bad(err.Error())
	}
	for _, v := range vals {
		e, ok := v.DocumentOK()
		if !ok {
			return bad("a base is not a document")
		}
		_, k, okK := e.Lookup("k").BinaryOK()
		s, okS := e.Lookup("s").AsInt64OK()
		if !okK || !okS {
			return bad("a base lacks k or s")
		}
		p.bases[string(k)] = int(s)
	}
	if ids, ok := d.Lookup("ids").ArrayOK(); ok {
		vals, err := ids.Values()
		if err != nil {
			return bad(err.Error())
		}
		for _, v := range vals {
			if _, k, ok := v.BinaryOK(); ok {
				p.ids[string(k)] = true
			}
		}
	}
	if tops, ok := d.Lookup("tops").ArrayOK(); ok {
		p.rawTops = tops
	}
	p.mark, _ = d.Lookup("mark").StringValueOK()
	if skip, ok := d.Lookup("skip").ArrayOK(); ok {
		ids, err := skip.Values()
		if err != nil {
			return bad(err.Error())
		}
		for _, v := range ids {
			if id, ok := v.ObjectIDOK(); ok {
				p.skip[id] = true
			}
		}
	}
	return p, nil
}

// RecordDoc is the record of the derived ids merged under token:
// {_id: token, packed: <the ids' 12 bytes each, as one binary>, at: now}.
// Packed because FerretDB stores a document as JSON value by value:
// records of 4,000 ids as an array took 29 ms to read back at each merge
// on the embedded upstream, and their expiry as long to delete.
func RecordDoc(token int64, ids []bson.ObjectID, now time.Time) bsoncore.Document {
	packed := make([]byte, 0, len(ids)*len(bson.ObjectID{}))
	for _, id := range ids {
		packed = append(packed, id[:]...)
	}
	return bsoncore.NewDocumentBuilder().AppendInt64("_id", token).AppendBinary("packed", 0, packed).
		AppendDateTime("at", now.UnixMilli()).Build()
}

// recordIDs are the derived ids of a record: packed, or an array (the
// records of proxies before packing).
func recordIDs(d bsoncore.Document) []bson.ObjectID {
	var out []bson.ObjectID
	if _, packed, ok := d.Lookup("packed").BinaryOK(); ok {
		for len(packed) >= len(bson.ObjectID{}) {
			out = append(out, bson.ObjectID(packed[:len(bson.ObjectID{})]))
			packed = packed[len(bson.ObjectID{}):]
		}
	}
	arr, _ := d.Lookup("ids").ArrayOK()
	vals, _ := arr.Values()
	for _, v := range vals {
		if id, ok := v.ObjectIDOK(); ok {
			out = append(out, id)
		}
	}
	return out
}

// RecordSet is the records of merged retryable writes within the retry
// horizon (TxnsCollection): the derived ids each merge (token) merged,
// sorted, 12 bytes an id (a Go map took 47), and when it recorded them.
type RecordSet struct {
	runs []recordRun
	// n is the number of ids: read by the proxy's bound across rules
	// (Len) while the rule's merge changes the set.
	n atomic.Int64
}

type recordRun struct {
	token, at int64 // at: ms
	ids       []bson.ObjectID
}

// NewRecordSet is an empty RecordSet.
func NewRecordSet() *RecordSet { return &RecordSet{} }

// Len is the number of derived ids recorded.
func (s *RecordSet) Len() int { return int(s.n.Load()) }

// Add records ids as merged under token at at (ms). A token recorded
// already (a repeated merge's) keeps its time and takes the ids too.
func (s *RecordSet) Add(token, at int64, ids []bson.ObjectID) {
	i := slices.IndexFunc(s.runs, func(r recordRun) bool { return r.token == token })
	if i < 0 {
		s.runs = append(s.runs, recordRun{token: token, at: at})
		i = len(s.runs) - 1
	}
	r := &s.runs[i]
	before := len(r.ids)
	r.ids = append(r.ids, ids...)
	slices.SortFunc(r.ids, compareIDs)
	r.ids = slices.Compact(r.ids)
	s.n.Add(int64(len(r.ids) - before))
}

// mergedElsewhere are those of ids (derived ids of staged documents)
// that a merge other than token's recorded: retries of writes merged
// before. One pass over each merge's sorted ids.
func (s *RecordSet) mergedElsewhere(ids []bson.ObjectID, token int64) map[bson.ObjectID]bool {
	if len(ids) == 0 || s.Len() == 0 {
		return nil
	}
	want := slices.SortedFunc(slices.Values(ids), compareIDs)
	out := map[bson.ObjectID]bool{}
	for _, r := range s.runs {
		if r.token == token {
			continue
		}
		for i, j := 0, 0; i < len(want) && j < len(r.ids); {
			switch c := compareIDs(want[i], r.ids[j]); {
			case c < 0:
				i++
			case c > 0:
				j++
			default:
				out[want[i]] = true
				i++
				j++
			}
		}
	}
	return out
}

func compareIDs(a, b bson.ObjectID) int { return bytes.Compare(a[:], b[:]) }

// hasBefore says whether a record is older than cut (ms).
func (s *RecordSet) hasBefore(cut int64) bool {
	return slices.ContainsFunc(s.runs, func(r recordRun) bool { return r.at < cut })
}

// dropBefore forgets the records older than cut (ms), deleted upstream.
func (s *RecordSet) dropBefore(cut int64) {
	s.runs = slices.DeleteFunc(s.runs, func(r recordRun) bool {
		if r.at < cut {
			s.n.Add(-int64(len(r.ids)))
			return true
		}
		return false
	})
}

// RecordCache keeps the records of merged retryable writes between the
// merges of the proxy that holds the rule's writer lease: merges are
// their only writers while it holds its term, so it reads them once a
// term (and again when their collection is another), where every merge
// read them all. They hold every derived id merged within the retry
// horizon: after 10 minutes of 2,000 retryable inserts a second, 1.2
// million ids, 14 MB read back and put in a map at every merge.
type RecordCache struct {
	// Get returns the records the proxy keeps for the records collection
	// of uuid coll, nil when it keeps none that still hold.
	Get func(coll string) *RecordSet
	// Put keeps s, read from the records collection of uuid coll (the
	// merge goes on updating s as it records and expires).
	Put func(coll string, s *RecordSet)
}

// records are the records of merged retryable writes for this merge:
// those the proxy keeps (MergeOptions.Records), else read back
// (loadRecords). It notes whether older records are there to expire
// (expireRecords).
func (m *Merge) records(x *rewrite.Exec) (*RecordSet, error) {
	cut := m.opts.Now.Add(-m.opts.RetryHorizon).UnixMilli()
	if m.opts.Records == nil {
		return m.loadRecords(x, cut)
	}
	coll, ok, err := m.collectionID(x, TxnsCollection(m.rule))
	if err != nil {
		return nil, err
	}
	if ok {
		if set := m.opts.Records.Get(coll); set != nil {
			m.expired = set.hasBefore(cut)
			return set, nil
		}
	}
	set, err := m.loadRecords(x, cut)
	if err == nil && ok {
		m.opts.Records.Put(coll, set)
	}
	return set, err
}

// loadRecords reads the derived ids merged since cut (ms), and notes
// whether older records are there to expire (expireRecords).
func (m *Merge) loadRecords(x *rewrite.Exec, cut int64) (*RecordSet, error) {
	coll := TxnsCollection(m.rule)
	docs, err := drainAll(x, m.rule.DB, coll, findCommand(m.rule.DB, coll, nil, nil), 0)
	if err != nil {
		return nil, err
	}
	m.Stats.RecordReads++
	set := NewRecordSet()
	for _, d := range docs {
		at, ok := d.Lookup("at").DateTimeOK()
		if !ok || at < cut {
			m.expired = true
			continue
		}
		token, _ := d.Lookup("_id").AsInt64OK()
		set.Add(token, at, recordIDs(d))
	}
	return set, nil
}

// horizonFilter is {at: {op: now - RetryHorizon}}.
func (m *Merge) horizonFilter(op string) bsoncore.Document {
	cut := m.opts.Now.Add(-m.opts.RetryHorizon).UnixMilli()
	return bsoncore.NewDocumentBuilder().AppendDocument("at", bsoncore.NewDocumentBuilder().AppendDateTime(op, cut).Build()).Build()
}

// expireRecords deletes the records older than the retry horizon, when
// records found any, and forgets them in set.
func (m *Merge) expireRecords(x *rewrite.Exec, set *RecordSet) error {
	if !m.expired {
		return nil
	}
	if err := m.deleteMany(x, TxnsCollection(m.rule), m.horizonFilter("$lt")); err != nil {
		return fmt.Errorf("merge %s: expire records: %w", m.rule.Namespace, err)
	}
	set.dropBefore(m.opts.Now.Add(-m.opts.RetryHorizon).UnixMilli())
	m.expired = false
	return nil
}

// deleteMany deletes every document of coll that q matches.
func (m *Merge) deleteMany(x *rewrite.Exec, coll string, q bsoncore.Document) error {
	del := bsoncore.NewDocumentBuilder().AppendDocument("q", q).AppendInt32("limit", 0).Build()
	cmd := bsoncore.NewDocumentBuilder().AppendString("delete", coll).
		AppendArray("deletes", bsoncore.NewArrayBuilder().AppendDocument(del).Build()).
		AppendString("$db", m.rule.DB).Build()
	reply, ok := x.One(cmd)
	if !ok {
		return rewrite.ErrAborted
	}
	return mongoerr.ReplyError(reply)
}

// insertOne inserts doc into coll; a duplicate key (an earlier run of
// the same merge wrote it) is no failure.
func (m *Merge) insertOne(x *rewrite.Exec, coll string, doc bsoncore.Document) error {
	reply, ok := x.Do(rewrite.Step{insertStep(m.rule.DB, coll, []bsoncore.Document{doc})})
	if !ok {
		return rewrite.ErrAborted
	}
	_, err := insertOutcome(reply[0])
	return err
}

// insertStep is an unordered insert of docs into db.coll.
func insertStep(db, coll string, docs []bsoncore.Document) rewrite.Upstream {
	body := bsoncore.NewDocumentBuilder().AppendString("insert", coll).AppendBoolean("ordered", false).AppendString("$db", db).Build()
	return rewrite.Upstream{Body: body, Seq: &rewrite.Sequence{Identifier: "documents", Documents: docs}}
}

// insertOutcome reads an insert's reply: the indexes that met a duplicate
// key, or the first other failure.
func insertOutcome(reply []byte) ([]int, error) {
	doc := bsoncore.Document(reply)
	if err := mongoerr.ReplyError(doc); err != nil {
		return nil, err
	}
	if wce, err := doc.LookupErr("writeConcernError"); err == nil {
		return nil, mongoerr.Errorf(mongoerr.InternalError, "write concern: %s", wce)
	}
	var dups []int
	arr, ok := doc.Lookup("writeErrors").ArrayOK()
	if !ok {
		return nil, nil
	}
	vals, _ := arr.Values()
	for _, v := range vals {
		e, _ := v.DocumentOK()
		code, _ := e.Lookup("code").AsInt64OK()
		idx, _ := e.Lookup("index").AsInt64OK()
		if mongoerr.Code(code) != mongoerr.DuplicateKey {
			msg, _ := e.Lookup("errmsg").StringValueOK()
			return nil, mongoerr.Errorf(mongoerr.Code(code), "%s", msg)
		}
		dups = append(dups, int(idx))
	}
	return dups, nil
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
	for len(buckets) > 0 {
		step, _ := nextInsertStep(m.rule.DB, m.rule.BucketCollection, docs, m.opts.InsertStreams)
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
			if err := m.insertedBuckets(x, buckets[:n], replies[i]); err != nil && failed == nil {
				failed = err
			}
			buckets, docs = buckets[n:], docs[n:]
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
	dups, err := insertOutcome(reply)
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
// of docs (nextInserts), and how many it takes.
func nextInsertStep(db, coll string, docs []bsoncore.Document, streams int) (rewrite.Step, int) {
	lens := nextInserts(len(docs), func(i int) int { return len(docs[i]) }, streams)
	step := make(rewrite.Step, len(lens))
	from := 0
	for i, n := range lens {
		step[i] = insertStep(db, coll, docs[from:from+n])
		step[i].Parallel = len(lens) > 1
		from += n
	}
	return step, from
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
	found, err := drainAll(x, m.rule.DB, m.rule.BucketCollection, findBatched(m.rule.DB, m.rule.BucketCollection, idsIn(ids), m.readBatch()), m.readBatch())
	if err != nil {
		return err
	}
	for _, d := range found {
		id, _ := idOf(d)
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

// writeIDIndex writes the event-id index entries of buckets before the
// buckets, so a crash between leaves an entry without a bucket (a wasted
// lookup), never a bucket without an entry. The first merge into an
// empty bucket collection starts the index with its marker; one into a
// collection that already holds buckets without entries (written before
// the index existed) leaves the marker out, and finds by _id keep reading
// every bucket there.
func (m *Merge) writeIDIndex(x *rewrite.Exec, buckets []builtBucket) error {
	coll := m.rule.IDIndexCollection()
	if !m.idIndexListed {
		n, err := m.countOf(x, m.rule.BucketCollection)
		if err != nil {
			return err
		}
		if n == 0 {
			if err := m.insertOne(x, coll, bucket.IDIndexMarkerDoc(rand.Int64())); err != nil {
				return fmt.Errorf("start the event-id index: %w", err)
			}
		}
		m.idIndexListed = true
	}
	if len(buckets) == 0 {
		return nil
	}
	for len(buckets) > 0 {
		n := min(len(buckets), 1000)
		docs := make([]bsoncore.Document, n)
		for i, b := range buckets[:n] {
			docs[i] = b.entry
		}
		buckets = buckets[n:]
		reply, ok := x.Do(rewrite.Step{insertStep(m.rule.DB, coll, docs)})
		if !ok {
			return rewrite.ErrAborted
		}
		// A duplicate key is the same entry, written by an earlier run.
		if _, err := insertOutcome(reply[0]); err != nil {
			return fmt.Errorf("write event-id index: %w", err)
		}
	}
	// A new version (random: two proxies' merges never share one):
	// readers that kept the index re-read it.
	body := bsoncore.NewDocumentBuilder().AppendString("update", coll).AppendBoolean("ordered", false).AppendString("$db", m.rule.DB).Build()
	reply, ok := x.Do(rewrite.Step{{Body: body, Seq: &rewrite.Sequence{Identifier: "updates", Documents: []bsoncore.Document{bucket.IDIndexBumpUpdate(rand.Int64())}}}})
	if !ok {
		return rewrite.ErrAborted
	}
	if err := mongoerr.ReplyError(reply[0]); err != nil {
		return fmt.Errorf("version the event-id index: %w", err)
	}
	return nil
}
